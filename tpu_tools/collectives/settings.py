"""What a run is asked to do, checked and gathered from the command line's raw values."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from tpu_tools.collectives.dtypes import DType
from tpu_tools.collectives.mesh import parse_device_ids, parse_mesh_shape
from tpu_tools.collectives.ops import Case, OpSpec, plan_tests
from tpu_tools.collectives.sizes import sweep_sizes
from tpu_tools.collectives.stats import parse_stats
from tpu_tools.errors import UsageError


class RunSettings(msgspec.Struct, kw_only=True):
    """The settings a report records (its `settings`), in their JSON key order."""

    dtype: str
    min_bytes: int
    max_bytes: int
    step_factor: float | None  # None: sizes step by step_bytes
    step_bytes: int | None
    iters: int
    warmup: int
    sample_ms: float  # 0: each sample is one call, waited for
    check: bool
    stats: list[str]
    root: int
    shift: int
    timeout_s: float
    min_busbw_gbps: float | None
    slow_threshold_percent: float


@dataclass(frozen=True)
class Settings:
    tests: list[Case]
    dtype: DType
    sizes: list[int]  # requested, before rounding
    iters: int = 20  # timed samples per size and column
    warmup: int = 5
    sample_ms: float = 5.0  # each sample lasts at least this long (k calls back to back); 0: one call, waited for
    check: bool = True
    stats: list[str] = field(default_factory=list)
    root: int = 0
    shift: int = 1
    device_ids: list[int] | None = None
    mesh_shape: tuple[int, ...] | None = None
    axis: str | None = None
    timeout_s: float = 60.0
    min_busbw_gbps: float | None = None
    slow_threshold: float = 0.2
    min_bytes: int = 0  # the sweep asked for, for the record
    max_bytes: int = 0
    step_factor: float | None = 2.0
    step_bytes: int | None = None

    def record(self) -> RunSettings:
        return RunSettings(dtype=self.dtype.name, min_bytes=self.min_bytes, max_bytes=self.max_bytes,
                           step_factor=self.step_factor, step_bytes=self.step_bytes, iters=self.iters,
                           warmup=self.warmup, sample_ms=self.sample_ms, check=self.check, stats=self.stats,
                           root=self.root, shift=self.shift, timeout_s=self.timeout_s,
                           min_busbw_gbps=self.min_busbw_gbps, slow_threshold_percent=self.slow_threshold * 100)



def build_settings(*, ops: list[OpSpec], redop: str, dtype: DType, min_bytes: int, max_bytes: int,
                   step_factor: float | None, step_bytes: int | None, iters: int, warmup: int, check: bool,
                   stats: str | None, root: int, shift: int, devices: str | None, mesh: str | None,
                   axis: str | None, min_busbw: float | None, slow_threshold_percent: float,
                   timeout_s: float, sample_ms: float = 5.0) -> tuple[Settings, list[str]]:
    """Settings and the notes worth telling the user; UsageError for values that cannot work."""
    sizes = sweep_sizes(min_bytes, max_bytes, step_factor, step_bytes)
    tests, notes = plan_tests(ops, redop)
    if iters < 1:
        raise UsageError(f"--iters must be at least 1, got {iters}")
    if warmup < 0:
        raise UsageError(f"--warmup must not be negative, got {warmup}")
    if not sample_ms >= 0 or sample_ms == float("inf"):
        raise UsageError(f"--sample-ms must be a number of milliseconds, 0 or more, got {sample_ms:g}")
    if sample_ms / 1e3 > timeout_s / 4:
        raise UsageError(f"--sample-ms {sample_ms:g} does not fit in --timeout {timeout_s:g} s: a sample must "
                         "end well within the timeout (at most a quarter of it)")
    if root < 0:
        raise UsageError(f"--root must not be negative, got {root}")
    if min_busbw is not None and min_busbw < 0:
        raise UsageError(f"--min-busbw must not be negative, got {min_busbw:g}")
    if slow_threshold_percent < 0:
        raise UsageError(f"--slow-threshold must not be negative, got {slow_threshold_percent:g}")
    settings = Settings(tests=tests, dtype=dtype, sizes=sizes, iters=iters, warmup=warmup, sample_ms=sample_ms,
                        check=check,
                        stats=parse_stats(stats), root=root, shift=shift, device_ids=parse_device_ids(devices),
                        mesh_shape=parse_mesh_shape(mesh), axis=axis, timeout_s=timeout_s,
                        min_busbw_gbps=min_busbw, slow_threshold=slow_threshold_percent / 100,
                        min_bytes=min_bytes, max_bytes=max_bytes,
                        step_factor=None if step_bytes is not None else (step_factor or 2.0), step_bytes=step_bytes)
    return settings, notes
