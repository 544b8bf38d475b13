"""Runtime policy: which PJRT platform, how many CPU devices, which XLA flags.

On PJRT the environment is read once, when jax initialises its backends, so the
policy has to be in `os.environ` before `import jax`. Everything here works on
environment dictionaries and never imports jax itself, except `import_jax`,
which applies the policy first and then imports.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

from tpu_tools.errors import PlatformUnavailable, UsageError
from tpu_tools.shorten import shorten

PLATFORM_CHOICES = ("auto", "cpu", "gpu", "cuda", "rocm", "tpu")
KNOWN_JAX_PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu", "metal")

# The modules whose presence tells us a platform's PJRT plugin is installed.
_PLUGIN_MODULES = {
    "cuda": ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"),
    "rocm": ("jax_rocm7_plugin", "jax_rocm60_plugin", "jax_plugins.xla_rocm7", "jax_plugins.xla_rocm60"),
    "tpu": ("libtpu",),
}
_INSTALL_HINTS = {
    "cuda": "pip install 'jax[cuda12]' (or jax[cuda13])",
    "rocm": "install JAX's ROCm plugin (see the JAX installation guide)",
    "tpu": "pip install 'jax[tpu]' on a TPU VM",
}


@dataclass(frozen=True)
class RuntimePolicy:
    """How the PJRT runtime is to be set up for one command."""

    platform: str = "auto"  # one of PLATFORM_CHOICES, or "env" entries from JAX_PLATFORMS
    host_devices: int | None = None  # CPU platform device count
    xla_flags: tuple[str, ...] = ()
    preallocate: bool = True  # GPU memory preallocation; read-only queries turn it off
    extra_env: dict[str, str] = field(default_factory=dict)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a process needs to initialise jax under this policy."""
        env = dict(os.environ if base is None else base)
        platforms = resolve_platforms(self.platform, env)
        if platforms is None:
            env.pop("JAX_PLATFORMS", None)
        else:
            env["JAX_PLATFORMS"] = platforms
        if self.host_devices is not None:
            env["JAX_NUM_CPU_DEVICES"] = str(self.host_devices)
            env["XLA_FLAGS"] = _set_flag(env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count",
                                         str(self.host_devices))
        if self.xla_flags:
            env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), *self.xla_flags]))
        if not self.preallocate:
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env.update(self.extra_env)
        return env

    def requested_platforms(self) -> list[str]:
        """The platforms this policy asks for ([] means: whatever jax picks)."""
        value = resolve_platforms(self.platform, os.environ)
        return [p for p in (value or "").split(",") if p]

    def display_platform(self) -> str:
        return ",".join(self.requested_platforms()) or "auto"


def _set_flag(flags: str, name: str, value: str) -> str:
    kept = [f for f in flags.split() if not f.startswith(name + "=")]
    return " ".join([*kept, f"{name}={value}"])


def installed_plugin_platforms() -> set[str]:
    """Names of platforms whose plugin looks installed (cpu is always built in)."""
    found = {"cpu"}
    for platform, modules in _PLUGIN_MODULES.items():
        if any(module_exists(m) for m in modules):
            found.add(platform)
    if os.environ.get("TPU_LIBRARY_PATH"):
        found.add("tpu")
    if "cuda" in found or "rocm" in found:
        found.add("gpu")
    return found


def module_exists(name: str) -> bool:
    """Whether `name` can be imported, without importing it (False for a broken parent package)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _jax_plugin_names() -> set[str]:
    """Platform names that third-party PJRT plugins register (entry points, namespace packages)."""
    import importlib.metadata as metadata
    import pkgutil

    names = {entry.name for entry in metadata.entry_points(group="jax_plugins")}
    try:
        import jax_plugins

        names |= {m.name for m in pkgutil.iter_modules(jax_plugins.__path__)}
    except ImportError:
        pass
    return names


def resolve_platforms(choice: str, env: Mapping[str, str]) -> str | None:
    """The JAX_PLATFORMS value for a --platform choice; None lets jax choose.

    "auto" defers to JAX_PLATFORMS when the user set it. Raises UsageError for
    a JAX_PLATFORMS value that names no platform jax or an installed plugin knows.
    """
    if choice != "auto":
        if choice not in PLATFORM_CHOICES:
            raise UsageError(f"unknown platform {choice!r}: choose one of {', '.join(PLATFORM_CHOICES)}")
        return choice
    value = env.get("JAX_PLATFORMS", "").strip()
    if not value:
        return None
    entries = [p.strip().lower() for p in value.split(",") if p.strip()]
    unknown = [p for p in entries if p not in KNOWN_JAX_PLATFORMS]
    if unknown and set(unknown) - _jax_plugin_names():
        raise UsageError(
            f"JAX_PLATFORMS={value!r} names no known platform ({', '.join(unknown)}); "
            f"use a comma-separated list of {', '.join(KNOWN_JAX_PLATFORMS[:-1])}, or unset it"
        )
    return ",".join(entries)


def check_platform_installed(policy: RuntimePolicy) -> None:
    """Fail early, with what to install, when the first requested platform has no plugin.

    Only the first platform matters: JAX falls back along the list.
    """
    platforms = policy.requested_platforms()
    if not platforms:
        return
    first = platforms[0]
    if first in installed_plugin_platforms() or first not in _INSTALL_HINTS and first != "gpu":
        return
    raise PlatformUnavailable(platform_missing_message(first))


def platform_missing_message(platform: str) -> str:
    """The one-line message for a platform whose PJRT plugin is missing, with how to install it."""
    if platform == "tpu":
        return ("the tpu platform is not available: libtpu is not installed or no TPU was found "
                f"({_INSTALL_HINTS['tpu']})")
    if platform == "gpu":
        return ("the gpu platform is not available: no CUDA or ROCm plugin for jax is installed "
                f"({_INSTALL_HINTS['cuda']})")
    hint = _INSTALL_HINTS.get(platform)
    return f"the {platform} platform is not available: its PJRT plugin is not installed" + (
        f" ({hint})" if hint else "")


def explain_backend_error(platform: str, message: str) -> str:
    """Turn jax's backend initialisation error into one sentence for the user."""
    text = message.strip().splitlines()[-1] if message.strip() else ""
    lowered = text.lower()
    if "not in the list of known backends" in lowered or "unknown backend" in lowered:
        return platform_missing_message(platform)
    if platform == "tpu" and ("libtpu" in lowered or "tpu" in lowered):
        if "libtpu.so" in lowered and ("cannot open" in lowered or "failed to open" in lowered):
            return platform_missing_message("tpu")
        if "in use" in lowered or "busy" in lowered or "lockfile" in lowered:
            return ("the TPU is in use by another process; stop it or run with --platform cpu "
                    "(details: " + _short(text) + ")")
    if "no visible" in lowered or "no devices" in lowered or "cuda_error_no_device" in lowered:
        return f"the {platform} runtime found no device ({_short(text)})"
    return f"the {platform or 'default'} runtime failed to start: {_short(text)}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return shorten(text.replace(" (set JAX_PLATFORMS='' to automatically choose an available backend)", ""), limit)


# Flags the toolkit sets itself (from --host-devices): known to every XLA, never worth a check.
_OWN_XLA_FLAGS = ("--xla_force_host_platform_device_count=",)
_UNKNOWN_FLAG = re.compile(r"Unknown flags? in XLA_FLAGS: ?(.*)")


def unknown_xla_flag(stderr_text: str) -> str | None:
    """The sentence for XLA's fatal 'Unknown flag in XLA_FLAGS' line in a runtime's stderr, else None."""
    match = _UNKNOWN_FLAG.search(stderr_text)
    if match is None:
        return None
    flags = _short(match.group(1), 120) or "?"
    return (f"XLA does not know the flag {flags} (from XLA_FLAGS or --xla-flag): remove it or fix its spelling; "
            "XLA would abort the process")


def user_xla_flags(env: dict[str, str]) -> str:
    """XLA_FLAGS as the user gave them (environment and --xla-flag), without the toolkit's own."""
    return " ".join(flag for flag in env.get("XLA_FLAGS", "").split() if not flag.startswith(_OWN_XLA_FLAGS))


# jaxlib's CPU client alone parses XLA_FLAGS like jax's start-up does, in a quarter of the time.
_CPU_CLIENT = ("try:\n    from jaxlib import xla_client\n    xla_client.make_cpu_client()\n"
               "except (ImportError, AttributeError):\n    import jax\n    jax.devices('cpu')\n")


@functools.lru_cache(maxsize=8)
def _xla_flags_problem(flags: str) -> str | None:
    """Start XLA's CPU client on `flags` in a throw-away process: XLA aborts (C++ LOG(FATAL), no exception)
    on a flag it does not know, which in-process would kill the command with a raw log line."""
    env = {key: value for key, value in os.environ.items() if key not in ("JAX_NUM_CPU_DEVICES",)}
    env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    try:
        process = subprocess.run([sys.executable, "-c", _CPU_CLIENT], env=env,
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no verdict: the real start-up reports whatever is wrong
    return None if process.returncode == 0 else unknown_xla_flag(process.stderr)


def check_xla_flags(policy: RuntimePolicy) -> None:
    """Raise UsageError, with one sentence, for an XLA flag that XLA does not know (costs one short child
    process, and only when the user gave flags)."""
    flags = user_xla_flags(policy.environment())
    if flags:
        problem = _xla_flags_problem(flags)
        if problem:
            raise UsageError(problem)


def apply(policy: RuntimePolicy) -> None:
    """Write the policy into this process's environment; must precede `import jax`."""
    if "jax" in sys.modules:
        # jax reads its platform and flags once; changing them now would silently not apply.
        current = os.environ.get("JAX_PLATFORMS")
        wanted = policy.environment().get("JAX_PLATFORMS")
        if current != wanted:
            raise RuntimeError("runtime policy applied after jax was imported")
    env = policy.environment()
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)


def import_jax(policy: RuntimePolicy,
               before_backend: Callable[[ModuleType], None] | None = None) -> ModuleType:
    """Apply the policy, import jax and initialise its backend, mapping failures to one sentence.

    For commands that run their work in-process (bench, collectives, profile).
    `before_backend(jax)` runs after the import and before the backend starts:
    the place for jax.config updates and jax.distributed.initialize.
    """
    check_platform_installed(policy)
    check_xla_flags(policy)
    apply(policy)
    import jax

    if before_backend is not None:
        before_backend(jax)
    try:
        jax.devices()
    except RuntimeError as exc:
        raise PlatformUnavailable(explain_backend_error(policy.display_platform(), str(exc))) from exc
    return jax
