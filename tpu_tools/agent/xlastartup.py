"""The startup contract of a torch_xla job, checked: what must be set before torch_xla starts, and was not.

PJRT reads its settings once: `PJRT_DEVICE` chooses the runtime, `XLA_FLAGS` / `LIBTPU_INIT_ARGS` are read
when torch_xla is imported, `xr.use_spmd()` must come before any tensor exists, and the persistent cache
(`xr.initialize_cache`, which sets `XLA_PERSISTENT_CACHE_PATH` and refuses once the computation cache started;
the variable set directly afterwards is silently ignored) before the runtime compiles. Each miss is a
`StartupFinding` with its fix, in the agent's answer (`startup`), tpu-monitor, tpu-top's job screen and
`tpu-dump show`. The checks read the environment and a counter, never the runtime (asking it would start it).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_tools.shorten import shorten

PJRT_DEVICE = "PJRT_DEVICE"
LATE_FLAGS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
CACHE_PATH, CACHE_READ_ONLY = "XLA_PERSISTENT_CACHE_PATH", "XLA_PERSISTENT_CACHE_READ_ONLY"
_CHECKED = "__tpu_tools_checked__"


@dataclass(frozen=True)
class StartupFinding:
    check: str  # pjrt_device_defaulted, pjrt_device_mismatch, flags_set_late, spmd_after_tensors, cache_set_late
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dict(vars(self))


def environment_now() -> dict[str, str | None]:
    """The settings the contract is about, as the environment has them now."""
    return {name: os.environ.get(name) for name in (PJRT_DEVICE, *LATE_FLAGS, CACHE_PATH)}


class StartupContract:
    """What the job's environment said as torch_xla was imported, and the findings since.

    before_import: the settings right before torch_xla's own code ran (torch_xla sets a default PJRT_DEVICE
    as it is imported); the flags are compared with those right after, torch_xla's own additions included.
    """

    def __init__(self, torch_xla: Any, counter: Callable[[str], int], before_import: dict[str, str | None]):
        self._at_import = environment_now()
        self._pjrt_device_given = before_import.get(PJRT_DEVICE)
        self._counter = counter
        self._cache_at_first_compile: tuple[str | None] | None = None  # (path,) once the first compile was seen
        self._spmd_after: int | None = None  # XLA tensors created before xr.use_spmd(), where there were some
        self._wrap_use_spmd(torch_xla)

    def _wrap_use_spmd(self, torch_xla: Any) -> None:
        runtime: Any = getattr(torch_xla, "runtime", None)
        use_spmd = getattr(runtime, "use_spmd", None)
        if runtime is None or use_spmd is None or getattr(use_spmd, _CHECKED, False):
            return

        @functools.wraps(use_spmd)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                created = self._counter("CreateXlaTensor")
                if created and self._spmd_after is None:
                    self._spmd_after = created
            except Exception:  # noqa: BLE001 the job's call goes through whatever the check does
                pass
            return use_spmd(*args, **kwargs)

        setattr(checked, _CHECKED, True)
        runtime.use_spmd = checked

    def note_compile(self) -> None:
        """The runtime compiled (the first time, the cache setting in effect is taken)."""
        if self._cache_at_first_compile is None:
            self._cache_at_first_compile = (os.environ.get(CACHE_PATH),)

    def findings(self, platform: str | None) -> list[StartupFinding]:
        """The findings now; `platform` is the runtime's (None before it started)."""
        out: list[StartupFinding] = []
        said = self._pjrt_device_given
        if platform is not None and not said:
            out.append(StartupFinding(
                "pjrt_device_defaulted", f"PJRT_DEVICE was not set when torch_xla was imported: it defaulted to "
                f"{platform.upper()}", "set PJRT_DEVICE (TPU, CUDA or CPU) in the job's environment"))
        elif platform is not None and said and said.strip().upper() != platform.upper():
            out.append(StartupFinding(
                "pjrt_device_mismatch", f"PJRT_DEVICE says {shorten(said, 40)} but the runtime runs on "
                f"{platform.upper()}", "set PJRT_DEVICE to the device the job is meant to run on"))
        for name in LATE_FLAGS:
            now = os.environ.get(name)
            if now != self._at_import[name]:
                out.append(StartupFinding(
                    "flags_set_late", f"{name} was changed after torch_xla was imported: no effect (in effect: "
                    f"{shorten(repr(self._at_import[name]), 200)}, now {shorten(repr(now), 200)})",
                    f"set {name} in the job's environment or before `import torch_xla`"))
        if self._spmd_after:
            out.append(StartupFinding(
                "spmd_after_tensors", f"xr.use_spmd() was called after {self._spmd_after} XLA tensors were created",
                "call xr.use_spmd() before any tensor exists, right after the imports"))
        if self._cache_at_first_compile is not None and self._cache_at_first_compile[0] is None:
            now = os.environ.get(CACHE_PATH)
            if now:
                out.append(StartupFinding(
                    "cache_set_late", f"{CACHE_PATH} was set to {shorten(now, 200)} after the first compile: torch_xla "
                    "reads it once, as its computation cache starts, so no graph is cached there",
                    "call xr.initialize_cache() (or set the variable) before the job creates its first tensor"))
        return out
