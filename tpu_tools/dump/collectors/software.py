"""Software collectors: Python, installed distributions, the jax stack, environment, caches.

None of them imports jax: versions come from distribution metadata and
module locations from import specs, so a broken jax install is described,
not tripped over.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shlex
import stat
import sys
from collections import Counter
from pathlib import Path

from tpu_tools.dump.collector import TRIM_HEAD, CollectContext, Skipped
from tpu_tools.dump.sysfiles import describe_os_error, try_text, under_root
from tpu_tools.dump.tree import read_capped, walk_tree
from tpu_tools.pjrt.discover import discover
from tpu_tools.versions import distribution_folders, installed_distributions, stack_versions

# Distributions that make up the accelerator stack (normalised names).
_STACK = re.compile(r"^(jax|jaxlib|libtpu(-nightly)?|jax-(cuda|rocm)\d*-(plugin|pjrt)|jax-metal|tpu-tools)$")
_MODULES = ("jax", "jaxlib", "libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_cuda12_pjrt",
            "jax_cuda13_pjrt", "jax_rocm7_plugin", "jax_rocm7_pjrt", "jax_plugins")
# Environment variables worth a support engineer's time (prefixes, then exact names).
ENV_PREFIXES = ("JAX_", "XLA_", "TPU_", "PJRT_", "LIBTPU_", "CUDA_", "NCCL_", "NVIDIA_", "CUDNN_", "ROCM_", "HIP_",
                "HSA_", "ROCR_", "MEGASCALE_", "CLOUD_TPU_", "TF_", "OMP_", "MKL_", "PYTHON", "CONDA_", "GRPC_",
                "TPU_TOOLS_")
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "VIRTUAL_ENV", "HOSTNAME", "KUBERNETES_SERVICE_HOST",
             "container", "GOOGLE_APPLICATION_CREDENTIALS", "MALLOC_ARENA_MAX", "LIBTPU_INIT_ARGS")
XLA_DUMP_CAP_BYTES = 16 << 20
_CACHE_WALK_LIMIT = 200_000


def collect_python(ctx: CollectContext) -> None:
    ctx.add_json("software/python.json", {
        "version": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "build": sys.version,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "in_virtualenv": sys.prefix != sys.base_prefix,
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()).strip() or None,
        "sys_path": list(sys.path),
    })


def collect_packages(ctx: CollectContext) -> None:
    folders = distribution_folders()
    used: dict[str, tuple[str, str]] = {}
    shadowed = []
    for name, version, folder in folders:
        if name in used:
            shadowed.append({"name": name, "version": version, "location": os.path.dirname(folder),
                             "shadowed_by": used[name][0]})
        else:
            used[name] = (version, folder)
    ctx.add_json("software/packages.json", {
        "distributions": [{"name": name, "version": version, "location": os.path.dirname(folder)}
                          for name, (version, folder) in sorted(used.items())],
        "shadowed": shadowed,
    })
    ctx.add_text("software/packages.txt", "".join(f"{n}=={v}\n" for n, (v, _) in sorted(used.items())))


def _requirements(folder: str) -> list:
    from packaging.requirements import InvalidRequirement, Requirement

    text = try_text(Path(folder) / "METADATA") or try_text(Path(folder) / "PKG-INFO") or ""
    found = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            try:
                found.append(Requirement(line.split(":", 1)[1].strip()))
            except InvalidRequirement:
                continue
    return found


def _extras_of(requirement) -> list[str]:
    return re.findall(r"extra\s*==\s*['\"]([^'\"]+)['\"]", str(requirement.marker or ""))


def stack_checks(installed: dict[str, tuple[str, str]]) -> list[dict]:
    """Does every installed stack distribution satisfy what the others require of it?

    Unconditional requirements must hold (jax -> jaxlib). A plugin that jax only
    names in extras (jax[tpu] -> libtpu, jax[cuda12] -> jax-cuda12-plugin) must
    match at least one of them.
    """
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    stack = {name: value for name, value in installed.items() if _STACK.match(name)}
    checks = []
    for owner, (owner_version, folder) in sorted(stack.items()):
        base: dict[str, list] = {}
        extras: dict[str, list] = {}
        for requirement in _requirements(folder):
            target: str = canonicalize_name(requirement.name)
            if target not in stack or target == owner:
                continue
            named_extras = _extras_of(requirement)
            if not named_extras and (requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
                base.setdefault(target, []).append(requirement)
            elif named_extras:
                extras.setdefault(target, []).append(requirement)
        for target, requirements in [*base.items(), *((t, r) for t, r in extras.items() if t not in base)]:
            version_text = stack[target][0]
            try:
                version = Version(version_text)
                matching = [r for r in requirements if r.specifier.contains(version, prereleases=True)]
            except InvalidVersion:
                matching = []
            conditional = target not in base
            ok = bool(matching) if conditional else len(matching) == len(requirements)
            checks.append({
                "distribution": target, "installed_version": version_text,
                "required_by": f"{owner} {owner_version}",
                "requirement": " or ".join(sorted({f"{target}{r.specifier}" for r in requirements})),
                "via_extras": sorted({e for r in requirements for e in _extras_of(r)}) if conditional else None,
                "ok": ok,
            })
    return checks


def _module_location(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        return os.path.dirname(spec.origin) if spec.origin.endswith("__init__.py") else spec.origin
    locations = list(spec.submodule_search_locations or [])
    return os.pathsep.join(locations) if locations else None


def collect_stack(ctx: CollectContext) -> None:
    versions = stack_versions()
    installed = installed_distributions()
    modules = {name: _module_location(name) for name in _MODULES}
    libtpu_dir = modules.get("libtpu")
    library = os.environ.get("TPU_LIBRARY_PATH") or (
        os.path.join(libtpu_dir, "libtpu.so") if libtpu_dir and os.path.exists(os.path.join(libtpu_dir, "libtpu.so"))
        else None)
    entry_points = []
    try:
        import importlib.metadata as metadata

        entry_points = [{"name": e.name, "value": e.value, "distribution": getattr(e.dist, "name", None)}
                        for e in metadata.entry_points(group="jax_plugins")]
    except Exception as error:  # noqa: BLE001 broken metadata of some other package must not hide the rest
        ctx.note(f"could not list jax_plugins entry points: {type(error).__name__}: {error}")
    checks = stack_checks(installed)
    metadata_locations = {name: os.path.dirname(installed[name][1]) for name in ("jax", "jaxlib") if name in installed}
    placement = {}
    for name, site in metadata_locations.items():
        location = modules.get(name)
        placement[name] = {"module": location, "metadata": site,
                           "same_place": bool(location) and os.path.dirname(location or "") == site}
    ctx.add_json("software/stack.json", {
        "versions": {**versions.to_dict(), "libtpu": installed.get("libtpu", installed.get("libtpu-nightly",
                                                                                              (None, "")))[0]},
        "modules": modules,
        "libtpu_library": library,
        "jax_plugin_entry_points": entry_points,
        "placement": placement,
        "checks": checks,
        "agree": all(c["ok"] for c in checks),
    })


def relevant_environment(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def _process_environment(ctx: CollectContext, pid: int) -> dict[str, str] | None:
    try:
        with open(under_root(f"/proc/{pid}/environ", ctx.root), "rb") as handle:
            raw = handle.read(1 << 20)
    except OSError:
        return None
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return relevant_environment({name: value for name, _, value in pairs})


def collect_env(ctx: CollectContext) -> None:
    own: Counter = Counter()
    chosen = {name: ctx.redactor.env_value(name, value, own)
              for name, value in relevant_environment(os.environ).items()}
    of_holders: Counter = Counter()
    holders = {}
    pids = sorted({h.pid for chip in discover(ctx.root).chips for h in chip.holders} - {os.getpid()})
    for pid in pids:
        environment = _process_environment(ctx, pid)
        if environment is not None:
            holders[str(pid)] = {n: ctx.redactor.env_value(n, v, of_holders) for n, v in environment.items()}
    omitted = len(os.environ) - len(chosen)
    ctx.add_json("software/env.json", {"variables": chosen, "omitted_count": omitted,
                                       "device_holders": holders}, redacted=own + of_holders)
    lines = [f"{name}={shlex.quote(value) if value != '<redacted>' else value}" for name, value in chosen.items()]
    ctx.add_text("software/env.txt", "\n".join(lines) + "\n", redacted=own)
    ctx.note(f"{len(chosen)} relevant variables listed, {omitted} others omitted"
             + (f", {sum(own.values())} values redacted" if own else ""))


def _cache_dir() -> str | None:
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or None


def collect_compile_cache(ctx: CollectContext) -> None:
    configured = _cache_dir()
    if not configured:
        raise Skipped("no compilation cache configured (JAX_COMPILATION_CACHE_DIR is not set)")
    if "://" in configured:
        raise Skipped(f"the compilation cache {configured} is remote; not inspected")
    path = Path(configured).expanduser()
    document: dict = {"path": str(path), "exists": path.exists(), "owner_uid": None, "owner": None, "mode": None,
                      "writable": None, "entry_count": None, "size_bytes": None, "newest_mtime": None,
                      "filesystem_available_bytes": None, "truncated": False}
    if path.exists():
        info = path.stat()
        document.update(owner_uid=info.st_uid, owner=_user_name(info.st_uid), mode=f"{stat.S_IMODE(info.st_mode):04o}",
                        writable=os.access(path, os.W_OK | os.X_OK), is_dir=path.is_dir())
        count = size = 0
        newest = 0.0
        for folder, _, names in os.walk(path):
            for name in names:
                try:
                    entry = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                count += 1
                size += entry.st_size
                newest = max(newest, entry.st_mtime)
                if count >= _CACHE_WALK_LIMIT:
                    break
            if count >= _CACHE_WALK_LIMIT:
                document["truncated"] = True
                break
        document.update(entry_count=count, size_bytes=size, newest_mtime=newest or None)
        try:
            usage = os.statvfs(path)
            document["filesystem_available_bytes"] = usage.f_bavail * usage.f_frsize
        except OSError as error:
            ctx.note(f"{path}: {describe_os_error(error)}")
    else:
        ctx.note(f"the compilation cache folder {path} does not exist yet")
    ctx.add_json("software/compile_cache.json", document)


def _user_name(uid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return None


def xla_dump_folder(flags: str) -> str | None:
    """The folder --xla_dump_to names in XLA_FLAGS-style text (the last one wins, as in XLA)."""
    found = None
    for flag in shlex.split(flags or "", posix=True) if flags else []:
        if flag.startswith("--xla_dump_to="):
            found = flag.split("=", 1)[1]
    return found


def collect_xla_dump(ctx: CollectContext) -> None:
    flags = " ".join([os.environ.get("XLA_FLAGS", ""), *ctx.policy.xla_flags])
    folder = xla_dump_folder(flags)
    if not folder:
        raise Skipped("no XLA dump folder configured (--xla_dump_to in XLA_FLAGS)")
    if folder in ("-", "sponge") or "://" in folder:
        raise Skipped(f"XLA dumps go to {folder!r}, not to a local folder")
    if not os.path.isdir(folder):
        raise Skipped(f"the XLA dump folder {folder} does not exist")
    walk = walk_tree(folder, ctx.redactor)
    budget = XLA_DUMP_CAP_BYTES
    taken = []
    # Newest first: the last compilation is most often the one that failed.
    for item in sorted(walk.files, key=lambda f: f.mtime, reverse=True):
        if budget <= 0:
            break
        try:
            data, size = read_capped(item.real, budget, keep="head")
        except OSError as error:
            walk.skip(item.relative, describe_os_error(error))
            continue
        budget -= len(data)
        ctx.add_bytes(f"software/xla_dump/files/{item.relative}", data, trim=TRIM_HEAD, source=item.real,
                      source_size_bytes=size if len(data) < size else None)
        taken.append(item.relative)
    index = walk.to_dict()
    index["collected"] = taken
    index["cap_bytes"] = XLA_DUMP_CAP_BYTES
    ctx.add_json("software/xla_dump/index.json", index)
    if len(taken) < len(walk.files):
        ctx.note(f"{len(taken)} of {len(walk.files)} dump files collected (cap {XLA_DUMP_CAP_BYTES >> 20} MiB)")
