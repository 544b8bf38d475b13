"""`tpu-profile run` on a PyTorch/XLA program: torch_xla's own profiler for the trace, and its compiles.

The trace is `torch_xla.debug.profiler.start_trace` / `stop_trace` (the profiler session `xp.start_server` and
`xp.trace` also reach), which writes the same XSpace layout as jax's profiler (`plugins/profile/<run>/`), so the
summary reads it as it reads a JAX trace. Compiles come from `torch_xla.debug.metrics`, as the agent reads them:
each `CompileTime` sample is one compile, credited at `torch_xla.sync()` to the line that called it (or to a
tensor value read before the sync), so a line whose graph compiled twice has two compiles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_tools.instrument.compiles import CompileEvent, CompileRecorder
from tpu_tools.instrument.torchxla import TorchXlaReader, step_boundary, wrapped_by

PROFILER_MARK = "profiler"
READ_BEFORE_SYNC = "(a tensor value read before torch_xla.sync)"


class TorchXlaTracer:
    """The device trace of a torch_xla program, written under `log_dir`."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir

    def start(self) -> None:
        import torch_xla.debug.profiler as xp

        xp.start_trace(str(self.log_dir))

    def stop(self) -> None:
        import torch_xla.debug.profiler as xp

        xp.stop_trace()


class TorchXlaCompiles:
    """Feeds torch_xla's compiles to the run's compile recorder, from its import to the program's end."""

    def __init__(self, torch_xla: Any, recorder: CompileRecorder):
        from torch_xla.debug import metrics  # loaded with torch_xla

        self._torch_xla = torch_xla
        self._reader = TorchXlaReader(metrics)
        self._recorder = recorder
        self._original: Any = None
        self._wrapper: Any = None
        if not wrapped_by(torch_xla.sync, PROFILER_MARK):
            self._original = torch_xla.sync
            self._wrapper = step_boundary(torch_xla.sync, lambda: self.take(READ_BEFORE_SYNC), self.take,
                                          PROFILER_MARK)
            torch_xla.sync = self._wrapper

    def take(self, site: str) -> None:
        for made in self._reader.new_compiles():
            self._recorder.add_event(CompileEvent("xla_compile", site, made.seconds, made.time_unix_s))

    def detach(self) -> None:
        """The program ended: its last compiles (made after its last sync) and torch_xla.sync as it was."""
        self.take(READ_BEFORE_SYNC)
        if self._wrapper is not None and self._torch_xla.sync is self._wrapper:  # not wrapped again since
            self._torch_xla.sync = self._original
