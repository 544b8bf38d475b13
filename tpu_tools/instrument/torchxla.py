"""PyTorch/XLA's own figures, read from its structured API (`torch_xla.debug.metrics`), never its text reports.

`metric_data(name)` gives `(total_samples, accumulator, ((unix_ts, value), ...))` with times in nanoseconds
and sizes in bytes; `counter_value(name)` an int or None; `executed_fallback_ops()` the `aten::` ops that ran
on the CPU. (The text report printed a CompileTime of 2.862 s as `03s862ms`: parsed, it is off by one.)

What a reader costs the job: all counters about 25 us, all metrics about 110 us, one `metric_data` 1.5 us on a
busy 2-core host. So `TorchXlaReader` reads a handful of counters per answer and a metric's samples only when
its counter says something happened since the last answer.
"""

from __future__ import annotations

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
