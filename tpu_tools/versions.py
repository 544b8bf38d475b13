"""Versions of the toolkit and the runtime stack, read without importing jax.

Installed distributions are found by their `*.dist-info` folders on sys.path:
that is what importlib.metadata reads too, at a fraction of its start-up cost,
which matters for `tpu-ls --no-runtime`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field

from tpu_tools import __version__

# Distributions that provide PJRT plugins or the TPU runtime (normalised names).
_PLUGIN_PATTERN = re.compile(r"^(jax[-_](cuda|rocm|metal)|libtpu)", re.IGNORECASE)
_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(-py[^-]*)?\.(dist|egg)-info$")


@dataclass(frozen=True)
class StackVersions:
    tpu_tools: str
    jax: str | None
    jaxlib: str | None
    plugins: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_folders() -> list[tuple[str, str, str]]:
    """(normalised name, version, metadata folder) of every distribution on sys.path, in import order.

    A name can appear more than once when one installation shadows another.
    """
    found: list[tuple[str, str, str]] = []
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for folder in names:
            match = _DIST_INFO.match(folder)
            if match:
                found.append((_normalise(match["name"]), match["version"], os.path.join(entry, folder)))
    return found


def installed_distributions() -> dict[str, tuple[str, str]]:
    """Normalised name -> (version, metadata folder), first match on sys.path wins like imports."""
    found: dict[str, tuple[str, str]] = {}
    for name, version, folder in distribution_folders():
        found.setdefault(name, (version, folder))
    return found


def _declares_jax_plugin(folder: str) -> bool:
    try:
        with open(os.path.join(folder, "entry_points.txt"), encoding="utf-8", errors="replace") as handle:
            return "[jax_plugins]" in handle.read()
    except OSError:
        return False


def stack_versions() -> StackVersions:
    dists = installed_distributions()
    plugins = {name: version for name, (version, folder) in dists.items()
               if _PLUGIN_PATTERN.match(name) or _declares_jax_plugin(folder)}
    return StackVersions(
        tpu_tools=__version__,
        jax=dists.get("jax", (None, ""))[0],
        jaxlib=dists.get("jaxlib", (None, ""))[0],
        plugins=dict(sorted(plugins.items())),
    )


def version_text(prog: str) -> str:
    versions = stack_versions()
    lines = [
        f"{prog} (tpu-tools) {versions.tpu_tools}",
        f"jax {versions.jax or 'not installed'}",
        f"jaxlib {versions.jaxlib or 'not installed'}",
    ]
    if versions.plugins:
        lines += [f"{name} {version}" for name, version in versions.plugins.items()]
    else:
        lines.append("PJRT plugins: none installed (the CPU platform is built into jaxlib)")
    return "\n".join(lines)
