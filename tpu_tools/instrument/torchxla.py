"""PyTorch/XLA's own figures, read from its structured API (`torch_xla.debug.metrics`), never its text reports.

`metric_data(name)` gives `(total_samples, accumulator, ((unix_ts, value), ...))` with times in nanoseconds
and sizes in bytes; `counter_value(name)` an int or None; `executed_fallback_ops()` the `aten::` ops that ran
on the CPU. (The text report printed a CompileTime of 2.862 s as `03s862ms`: parsed, it is off by one.)

What a reader costs the job: all counters about 25 us, all metrics about 110 us, one `metric_data` 1.5 us on a
busy 2-core host. So `TorchXlaReader` reads a handful of counters per answer and a metric's samples only when
its counter says something happened since the last answer.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NS = 1e-9

# counters
UNCACHED_COMPILE = "UncachedCompile"  # a real XLA compile
CACHED_COMPILE = "CachedCompile"  # a graph seen before: served from torch_xla's in-memory cache
EXECUTE = ("ExecuteComputation", "ExecuteReplicated")  # single device, SPMD / replicated
PERSISTENT_MISS = "PersistentCacheMiss"
PERSISTENT_DESERIALIZE_FAILURE = "PersistentCacheDeserializeFailure"
DATA_HANDLES = "CreateDataHandles"  # moves with every transfer to the device
# metrics
COMPILE_TIME = "CompileTime"
EXECUTE_TIME = ("ExecuteTime", "ExecuteReplicatedTime")
TO_DEVICE_TIME, FROM_DEVICE_TIME = "TransferToDeviceTime", "TransferFromDeviceTime"
TO_DEVICE_BYTES, FROM_DEVICE_BYTES = "OutboundData", "InboundData"
PERSISTENT_LOAD = "PersistentCacheLoad"
FALLBACK_PREFIX = "aten::"


@dataclass
class MetricTotal:
    """One of torch_xla's metrics as totals: how many samples, and their sum (in the metric's unit)."""

    samples: int = 0
    total: float = 0.0


@dataclass
class Compile:
    """One XLA compile torch_xla made: when it ended and how long it took (a `CompileTime` sample)."""

    time_unix_s: float
    seconds: float


@dataclass
class TorchXlaFigures:
    """What the reader knows after a read; every figure is torch_xla's own."""

    compiles: int = 0  # UncachedCompile
    in_memory_cache_hits: int = 0  # CachedCompile
    compile_time_s: float = 0.0  # CompileTime's accumulator
    executions: int = 0
    execute_time_s: float = 0.0
    to_device: MetricTotal = field(default_factory=MetricTotal)  # count, seconds
    from_device: MetricTotal = field(default_factory=MetricTotal)
    to_device_bytes: float = 0.0
    from_device_bytes: float = 0.0
    persistent_misses: int = 0
    persistent_loads: int = 0
    persistent_deserialize_failures: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)  # aten:: op -> times it ran on the CPU


def metric_total(metrics: Any, name: str) -> MetricTotal:
    """The samples and accumulator of one metric; zero where torch_xla has not recorded it yet."""
    data = metrics.metric_data(name)
    if not data:
        return MetricTotal()
    return MetricTotal(int(data[0]), float(data[1]))


class TorchXlaReader:
    """Reads `torch_xla.debug.metrics` incrementally; one per process, called from the agent's thread and the
    step hook (callers hold their own lock)."""

    def __init__(self, metrics: Any):
        self._metrics = metrics
        self.figures = TorchXlaFigures()
        self._compile_samples = 0  # CompileTime samples taken as Compile records
        self._moved: tuple[int, int, int] | None = None  # what moves with transfers, at the last transfer read

    def counter(self, name: str) -> int:
        return int(self._metrics.counter_value(name) or 0)

    def new_compiles(self) -> list[Compile]:
        """The compiles torch_xla made since the last call, from CompileTime's timestamped samples (the
        samples torch_xla keeps are its most recent ones: a burst larger than that keeps only its sum)."""
        if self.counter(UNCACHED_COMPILE) == self.figures.compiles:
            return []
        data = self._metrics.metric_data(COMPILE_TIME)
        figures = self.figures
        figures.compiles = self.counter(UNCACHED_COMPILE)
        if not data:
            return []
        total, samples = int(data[0]), data[2]
        fresh = total - self._compile_samples
        taken = [Compile(float(ts), float(ns) * NS) for ts, ns in samples[-fresh:]] if fresh > 0 else []
        figures.compile_time_s = float(data[1]) * NS  # the accumulator: exact even where samples were dropped
        figures.persistent_loads = metric_total(self._metrics, PERSISTENT_LOAD).samples  # a load ends a compile
        self._compile_samples = total
        return taken

    def read(self) -> TorchXlaFigures:
        """Bring the figures up to date: a few counters, and the metrics whose counters moved."""
        figures = self.figures
        figures.in_memory_cache_hits = self.counter(CACHED_COMPILE)
        names = tuple(self._metrics.executed_fallback_ops() or ())
        if names or figures.fallbacks:
            figures.fallbacks = {name: self.counter(name) for name in names}
        executions = sum(self.counter(name) for name in EXECUTE)
        if executions != figures.executions:
            figures.executions = executions
            figures.execute_time_s = sum(metric_total(self._metrics, name).total for name in EXECUTE_TIME) * NS
        # a transfer to the device makes a data handle; one from it follows an execution or reads a value
        # through a CPU fallback (`.item()`): the transfer metrics are read again only when one of those moved
        moved = (self.counter(DATA_HANDLES), executions, sum(figures.fallbacks.values()))
        if moved != self._moved:
            self._moved = moved
            to_device, from_device = (metric_total(self._metrics, name) for name in (TO_DEVICE_TIME, FROM_DEVICE_TIME))
            figures.to_device = MetricTotal(to_device.samples, to_device.total * NS)
            figures.from_device = MetricTotal(from_device.samples, from_device.total * NS)
            figures.to_device_bytes = metric_total(self._metrics, TO_DEVICE_BYTES).total
            figures.from_device_bytes = metric_total(self._metrics, FROM_DEVICE_BYTES).total
        figures.persistent_misses = self.counter(PERSISTENT_MISS)
        figures.persistent_deserialize_failures = self.counter(PERSISTENT_DESERIALIZE_FAILURE)
        return figures


def fallbacks_record(fallbacks: dict[str, int]) -> dict[str, Any]:
    """The agent's `cpu_fallbacks` record: each op with its count, most frequent first, and the total."""
    ops = [{"op": op, "count": count} for op, count in sorted(fallbacks.items(), key=lambda item: (-item[1], item[0]))]
    return {"total": sum(fallbacks.values()), "ops": ops}


# --- why it compiled: torch_xla's debug output (PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE) -------------------

_PREFIX = "Compilation Analysis: "
_POST_PREFIX = "Post Compilation Analysis: "
_RULE = "=" * 20
_FRAME = re.compile(r"^(?P<function>.+?) \((?P<path>.+):(?P<line>\d+)\)$")
_SIZE = re.compile(r"^(?P<what>Graph input|Graph output|Aliased Input|Intermediate tensor|Compiled program) size: "
                   r"(?P<gb>[0-9.]+) GB$")
_SIZE_KEYS = {"Graph input": "input", "Graph output": "output", "Aliased Input": "aliased",
              "Intermediate tensor": "intermediate", "Compiled program": "program"}


@dataclass
class CompileBlock:
    """One compile as torch_xla's debug output describes it: why, which graph, from where, how large."""

    cause: str
    graph_hash: str | None = None
    inputs: int | None = None
    outputs: int | None = None
    frames: list[str] = field(default_factory=list)  # "function (path:line)", innermost first
    sizes_gb: dict[str, float] = field(default_factory=dict)  # input, output, aliased, intermediate, program


class DebugOutputParser:
    """Turns the debug file's text, fed as it grows, into `CompileBlock`s (one per compile, in order).

    A block's sizes come in the post-compilation part that follows it; they are added to the last block when
    they arrive. Only whole lines are read: a line still being written waits for the next feed.
    """

    def __init__(self) -> None:
        self.blocks: list[CompileBlock] = []
        self._partial = ""
        self._current: CompileBlock | None = None
        self._section = ""

    def feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line.rstrip())

    def _line(self, line: str) -> None:
        if line.startswith(_POST_PREFIX):
            size = _SIZE.match(line[len(_POST_PREFIX):].strip())
            if size and self.blocks:
                self.blocks[-1].sizes_gb[_SIZE_KEYS[size["what"]]] = float(size["gb"])
            return
        if not line.startswith(_PREFIX):
            return
        body = line[len(_PREFIX):]
        text = body.strip()
        if text.startswith(_RULE):
            if self._current is not None and self._section:  # the closing rule: the block is whole
                self.blocks.append(self._current)
                self._current, self._section = None, ""
            return
        if text == "Compilation Cause":
            self._current, self._section = CompileBlock(""), "cause"
        elif self._current is None:
            return
        elif text.startswith("Graph Info"):
            self._section = "graph"
        elif text.startswith("Python Frame Triggered Execution"):
            self._section = "frames"
        elif text.startswith("-" * 20):
            self._section = "end"
        elif self._section == "cause":
            self._current.cause = f"{self._current.cause} {text}".strip()
        elif self._section == "graph":
            _graph_line(self._current, text)
        elif self._section == "frames" and _FRAME.match(text):
            self._current.frames.append(text)


def _graph_line(block: CompileBlock, text: str) -> None:
    """A `key: value` line of a block's Graph Info: its hash and its numbers of inputs and outputs."""
    key, _, value = text.partition(":")
    value = value.strip()
    if key == "Graph Hash":
        block.graph_hash = value
    elif key == "Number of Graph Inputs" and value.isdigit():
        block.inputs = int(value)
    elif key == "Number of Graph Outputs" and value.isdigit():
        block.outputs = int(value)


def frame_path(frame: str) -> str:
    """The file of a frame written `function (path:line)`."""
    match = _FRAME.match(frame)
    return match["path"] if match else ""


READ_EARLY = "access tensor value before"  # torch_xla's cause for a compile forced by reading a value


def recompile_reasons(block: CompileBlock, before: CompileBlock, site: str) -> list[str]:
    """What differs from the nearest earlier graph compiled at the same line, and the classic cause it points
    to (torch_xla's own cause names only the trigger)."""
    reasons: list[str] = []
    if block.graph_hash and before.graph_hash and block.graph_hash != before.graph_hash:
        reasons.append(f"graph {before.graph_hash[:12]} before, now {block.graph_hash[:12]}")
    counts_differ = False
    for what, now, then in (("inputs", block.inputs, before.inputs), ("outputs", block.outputs, before.outputs)):
        if now is not None and then is not None and now != then:
            counts_differ = True
            reasons.append(f"graph {what}: {then} before, now {now}")
    # torch_xla writes sizes in GB with 6 decimals: kB is as fine as they go
    sizes = [f"{key} size {before.sizes_gb[key] * 1e6:g} kB before, now {value * 1e6:g} kB"
             for key, value in block.sizes_gb.items() if key in before.sizes_gb and before.sizes_gb[key] != value]
    reasons += sizes
    callers = [frame for frame in block.frames if frame != site]
    callers_before = [frame for frame in before.frames if frame != site]
    if callers and callers_before and callers[-1] != callers_before[-1]:
        reasons.append(f"called from {callers_before[-1]} before, now {callers[-1]}")
    if READ_EARLY in block.cause:
        classic = ("a tensor value read before torch_xla.sync (.item(), print, .cpu()) cuts the graph there; read "
                   "it after the sync or in xm.add_step_closure")
    elif counts_differ:
        classic = "a tensor added to or dropped from the step's graph (a value kept across steps, a branch on data)"
    elif sizes:
        classic = ("a dynamic shape (a new batch size, a smaller last batch); pad or bucket the shapes, or drop "
                   "the last batch")
    else:
        classic = ("the same inputs but another graph: a Python scalar that changes every step is traced in as a "
                   "constant; pass it as a tensor")
    # the classic cause first: it is what a narrow screen keeps
    return [f"classic cause: {classic}", f"torch_xla: {block.cause or 'no cause given'}", *reasons]


_MARKS = "__tpu_tools_step_boundary__"  # the marks of each wrapper in a chain of them


def is_torch_xla_frame(path: str) -> bool:
    """A frame of torch_xla's own code or of this module's (the step boundary): not the job's line."""
    return f"{os.sep}torch_xla{os.sep}" in path or path == __file__


def caller_site(frame: Any) -> str:
    """`function (path:line)` of the first frame outside torch_xla (and this module), as torch_xla's debug
    output names frames."""
    while frame is not None:
        path = frame.f_code.co_filename
        if not is_torch_xla_frame(path):
            return f"{frame.f_code.co_name} ({path}:{frame.f_lineno})"
        frame = frame.f_back
    return "?"


def wrapped_by(function: Any, mark: str) -> bool:
    """Whether `function` is, or wraps, a step boundary made with `mark` (the agent and the profiler each wrap
    torch_xla.sync once)."""
    while function is not None:
        if mark in getattr(function, _MARKS, ()):
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def step_boundary(sync: Callable[..., Any], before: Callable[[], None], after: Callable[[str], None],
                  mark: str) -> Callable[..., Any]:
    """`sync` with `before()` and `after(caller's site)` around it; neither ever raises into the job."""

    @functools.wraps(sync)
    def boundary(*args: Any, **kwargs: Any) -> Any:
        try:
            before()
        except Exception:  # noqa: BLE001 the job's step must not fail for its monitoring
            pass
        try:
            return sync(*args, **kwargs)
        finally:  # a sync that raised ends its boundary too: `before` and `after` always come in pairs
            try:
                after(caller_site(sys._getframe(1)))
            except Exception:  # noqa: BLE001 the job's sync returns (or raises) as it would without us
                pass

    setattr(boundary, _MARKS, (mark,))
    return boundary
