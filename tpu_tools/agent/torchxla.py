"""The torch_xla adapter: a PyTorch/XLA job's compiles, steps, transfers and CPU fallbacks, as the agent's records.

Figures come from `torch_xla.debug.metrics` (`tpu_tools.instrument.torchxla`). Steps need no change to the
job: `torch_xla.sync()` is the step boundary (`xm.mark_step()` calls it, and so do torch_xla's own loaders and
`xm.optimizer_step(barrier=True)`, where the job's step ends too). The agent wraps the Python function rather
than reading torch_xla's `MarkStep` counter: the counter cannot say when a step ended nor what it cost, and it
also counts syncs torch_xla makes for itself. A job that marks its own steps (`tpu_tools.agent.step()`) keeps
them: once it has, the syncs no longer count.

Each compile is checked for at the boundary, before and after the real sync: a compile found before it was
made outside any sync (a value read early: `.item()`, `print`, a `.cpu()` of a pending tensor), one found after
it by that sync, and is credited to the line that called it (`step (train.py:41)`), so a graph that compiles
again at the same line is a recompilation, as a JAX function compiled again is. Its seconds are torch_xla's
own `CompileTime` sample, given to the goodput ledger as compile time.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from tpu_tools.agent.frontends import TORCH_XLA, FrontendFigures
from tpu_tools.agent.goodput import process_ledger
from tpu_tools.agent.metrics import process_metrics
from tpu_tools.agent.xlametrics import XlaMetricTaker
from tpu_tools.agent.xlastartup import CACHE_READ_ONLY, StartupContract, environment_now
from tpu_tools.instrument.compiles import CacheMiss, CompileEvent, CompileTracker
from tpu_tools.instrument.steps import StepTracker
from tpu_tools.instrument.torchxla import (
    CompileBlock,
    DebugOutputParser,
    TorchXlaReader,
    fallbacks_record,
    frame_path,
    is_torch_xla_frame,
    recompile_reasons,
    step_boundary,
    wrapped_by,
)

READ_BEFORE_SYNC = "(a tensor value read before torch_xla.sync)"
CACHE_PATH_VARIABLE = "XLA_PERSISTENT_CACHE_PATH"
DEBUG_LEVEL_VARIABLE, DEBUG_FILE_VARIABLE = "PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE"
AGENT_MARK = "agent"  # the agent's wrapper of torch_xla.sync (the profiler wraps it too)


def prepare_explain(directory: Path) -> tuple[str | None, bool]:
    """Ask torch_xla, before it is imported, to describe each compile in a file of the agent's private
    directory (PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE; a file the job named itself is read instead). Returns
    the file (None where torch_xla is imported already: it reads the settings at import) and whether the
    agent named it (and removes it when the job ends)."""
    if TORCH_XLA in sys.modules:
        return None, False
    os.environ.setdefault(DEBUG_LEVEL_VARIABLE, "1")
    ours = str(directory / f"torch-xla-compiles-{os.getpid()}.txt")
    named = os.environ.setdefault(DEBUG_FILE_VARIABLE, ours)
    return named, named == ours


def remove_explain_file(path: str) -> None:
    """The agent's debug file of a job that ended (best effort: the directory is private either way)."""
    try:
        os.unlink(path)
    except OSError:
        pass


class TorchXlaFrontend:
    """PyTorch/XLA: attached once `torch_xla` is imported; one per process."""

    name = TORCH_XLA

    def __init__(self, torch_xla: Any, steps: StepTracker, debug_file: str | None = None,
                 before_import: dict[str, str | None] | None = None):
        from torch_xla.debug import metrics  # loaded with torch_xla: no import cost of its own

        self._torch_xla = torch_xla
        self._steps = steps
        self._reader = TorchXlaReader(metrics)
        self._tracker = CompileTracker(listening=lambda: True)
        self._lock = threading.Lock()
        self._boundary_steps = 0  # steps marked at a sync; fewer than all steps once the job marks its own
        self._memory_error: str | None = None
        self._metrics = XlaMetricTaker(torch_xla, process_metrics())
        self._startup = StartupContract(torch_xla, self._reader.counter, before_import or environment_now())
        # --explain-recompiles: torch_xla's debug file, read as it grows; its i-th block is the i-th compile
        self._debug_file = debug_file
        self._debug_offset = 0
        self._debug = DebugOutputParser()
        self._compiles_seen = 0
        self._last_block: dict[str, CompileBlock] = {}  # the latest graph compiled at each line
        # syncs under way in the job: a compile made inside one is the sync's, credited when it returns; an answer
        # or a publication read in the middle leaves it (else it would be credited to no line, its graph unread)
        self._syncing = 0

    def install(self) -> None:
        """Make `torch_xla.sync` (and through it `xm.mark_step`) a step boundary, where the XLA tensors the job
        reported as metrics are taken too; once per process."""
        original = self._torch_xla.sync
        if wrapped_by(original, AGENT_MARK):
            return
        process_metrics().defer_xla = self._metrics.defer
        self._torch_xla.sync = step_boundary(original, self._before_sync, self._after_sync, AGENT_MARK)

    def version(self) -> str | None:
        return getattr(self._torch_xla, "__version__", None)

    def compile_count(self) -> int:
        return self._reader.figures.compiles

    # --- the step hook (the job's thread) ---------------------------------------------------------

    def _before_sync(self) -> None:
        with self._lock:
            self._take_compiles(READ_BEFORE_SYNC)
            self._syncing += 1

    def _after_sync(self, site: str) -> None:
        with self._lock:
            self._syncing = max(0, self._syncing - 1)
            self._take_compiles(site)
            job_marks_its_own = self._steps.count != self._boundary_steps
            if not job_marks_its_own:
                self._boundary_steps += 1
        if not job_marks_its_own:
            self._steps.step()
        self._metrics.take()

    def _take_compiles(self, site: str) -> None:
        """(under the lock) Credit the compiles torch_xla made since the last look to `site` (or, with torch_xla's
        debug output, to the line its block names, with what differs from the graph compiled there before)."""
        made = self._reader.new_compiles()
        if made:
            self._startup.note_compile()
        if made and self._debug_file is not None:
            self._read_debug_file()
        for compile_made in made:
            index, self._compiles_seen = self._compiles_seen, self._compiles_seen + 1
            block = self._debug.blocks[index] if index < len(self._debug.blocks) else None
            where = site
            if block is not None:
                where = next((frame for frame in block.frames if not is_torch_xla_frame(frame_path(frame))), site)
                before = self._last_block.get(where)
                if before is not None:
                    self._tracker.add_miss(CacheMiss(where, None, where, False, "other",
                                                     recompile_reasons(block, before, where), compile_made.time_unix_s))
                self._last_block[where] = block
            self._tracker.add_event(CompileEvent("xla_compile", where, compile_made.seconds, compile_made.time_unix_s))
            process_ledger().add_compile(compile_made.seconds)

    def _read_debug_file(self) -> None:
        assert self._debug_file is not None
        try:
            with open(self._debug_file, "rb") as debug:
                debug.seek(self._debug_offset)
                text = debug.read(1 << 20)  # bounded: a burst of compiles is read over several looks
        except OSError:  # not written yet (no compile) or removed: the compiles keep the sync's line
            return
        self._debug_offset += len(text)
        self._debug.feed(text.decode("utf-8", "replace"))

    # --- the answer (the agent's thread) ---------------------------------------------------------

    def figures(self) -> FrontendFigures:
        with self._lock:
            if not self._syncing:
                self._take_compiles(READ_BEFORE_SYNC)  # made since the last sync: outside any step boundary
            figures = self._reader.read()
        started = figures.compiles > 0 or figures.executions > 0  # the runtime is up: asking starts nothing
        runtime, devices, memory_error = self._runtime() if started else (None, [], None)
        persistent_hits = max(0, figures.persistent_loads - figures.persistent_deserialize_failures)
        compiles = {**self._tracker.snapshot(), "compile_count": figures.compiles,
                    "backend_compile_time_s": figures.compile_time_s, "cache_hits": persistent_hits,
                    "cache_misses": figures.persistent_misses, "in_memory_cache_hits": figures.in_memory_cache_hits}
        cache_dir = os.environ.get(CACHE_PATH_VARIABLE) or None
        read_only = os.environ.get(CACHE_READ_ONLY) in ("1", "true", "True")
        cache = {"listening": True, "dir_configured": cache_dir, "dir_in_use": cache_dir,
                 "lookups": figures.persistent_misses + figures.persistent_loads, "hits": persistent_hits,
                 "misses": figures.persistent_misses, "deserialize_failures": figures.persistent_deserialize_failures,
                 # torch_xla writes an entry for each miss, and again for each entry it could not read back (it
                 # unlinks it and writes it anew), unless the cache is read-only: the shared-cache view names the
                 # directories several processes write
                 "entries_written": 0 if read_only else (figures.persistent_misses
                                                         + figures.persistent_deserialize_failures)}
        return FrontendFigures(
            runtime, devices, memory_error, compiles, cache,
            executions={"count": figures.executions, "time_s": figures.execute_time_s},
            transfers={"to_device": {"count": figures.to_device.samples, "time_s": figures.to_device.total,
                                     "bytes": int(figures.to_device_bytes)},
                       "from_device": {"count": figures.from_device.samples, "time_s": figures.from_device.total,
                                       "bytes": int(figures.from_device_bytes)}},
            cpu_fallbacks=fallbacks_record(figures.fallbacks),
            startup=[finding.to_dict() for finding in self._startup.findings(runtime["platform"] if runtime else None)])

    def step_figures(self) -> dict[str, Any]:
        """Every figure: its executions and transfers move with each step, and all come from one read."""
        return self.figures().fields()

    def _runtime(self) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
        """The platform, and the default device's memory where torch_xla gives it (unknown, never 0, where
        it does not: the CPU platform has no allocator statistics, and is not asked again)."""
        runtime = sys.modules.get("torch_xla.runtime")
        platform = str(runtime.device_type()).lower() if runtime is not None else "unknown"
        device: dict[str, Any] = {"id": 0, "platform": platform, "device_kind": platform.upper()}
        if self._memory_error is None:
            try:
                from torch_xla.core import xla_model

                info = xla_model.get_memory_info(self._torch_xla.device())
                device.update({"memory_used_bytes": info.get("bytes_used"),
                               "memory_limit_bytes": info.get("bytes_limit"),
                               "memory_peak_bytes": info.get("peak_bytes_used")})
            except Exception as error:  # noqa: BLE001 UNIMPLEMENTED on CPU
                text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                self._memory_error = f"torch_xla gives no device memory on {platform}: {text[:200]}"
        return {"platform": platform}, [device], self._memory_error
