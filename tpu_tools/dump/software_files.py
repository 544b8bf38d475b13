"""What tpu-dump's summary reads of a bundle's software and system files, as records decoded with msgspec.

`software/stack.json` (the versions and whether they satisfy each other), `software/python.json`,
`software/packages.json` (packages hidden by others earlier on sys.path), `software/compile_cache.json` and
`system/cgroup.json`. Only the fields the summary reads are declared; a file of another shape is a ValueError
naming the field (the summary notes it), an absent one is None.
"""

from __future__ import annotations

import msgspec


class StackVersions(msgspec.Struct, kw_only=True):
    jax: str | None = None
    jaxlib: str | None = None
    libtpu: str | None = None
    plugins: dict[str, str | None] = msgspec.field(default_factory=dict)  # PJRT plugin distribution -> version
    tpu_tools: str | None = None


class RequirementCheck(msgspec.Struct, kw_only=True):
    """Whether an installed distribution satisfies what another requires of it."""

    ok: bool | None = None
    distribution: str | None = None
    installed_version: str | None = None
    requirement: str | None = None
    required_by: str | None = None
    via_extras: list[str] | None = None


class StackFile(msgspec.Struct, kw_only=True):
    versions: StackVersions | None = None
    agree: bool | None = None
    checks: list[RequirementCheck] = msgspec.field(default_factory=list)


class PythonFile(msgspec.Struct, kw_only=True):
    version: str | None = None


class ShadowedPackage(msgspec.Struct, kw_only=True):
    name: str | None = None
    version: str | None = None
    location: str | None = None
    shadowed_by: str | None = None


class PackagesFile(msgspec.Struct, kw_only=True):
    shadowed: list[ShadowedPackage] = msgspec.field(default_factory=list)


class CompileCacheFile(msgspec.Struct, kw_only=True):
    path: str | None = None
    exists: bool | None = None
    writable: bool | None = None


class CgroupFile(msgspec.Struct, kw_only=True):
    oom_kills: int | None = None
