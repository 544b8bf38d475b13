"""What a collectives run found: plain records that feed the table and the JSON document."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from tpu_tools.collectives.settings import RunSettings
from tpu_tools.errors import EXIT_FAILURE, EXIT_GATE, EXIT_OK
from tpu_tools.units import format_bytes

SCHEMA = "tpu-tools/collectives/v1"

STATUS_OK = "ok"
STATUS_WRONG = "wrong_values"
STATUS_SLOW = "below_min_busbw"
STATUS_FAILED = "failed"


class SmallMessageLatency(msgspec.Struct, kw_only=True):
    """A test's smallest size that ran: what one small collective costs."""

    size_bytes: int
    out_of_place_us: float | None  # back to back
    in_place_us: float | None
    blocking_call_us: float | None  # one call issued and waited for


@dataclass
class ProcessInfo:
    process_id: int
    host: str
    pid: int
    device_ids: list[int] = field(default_factory=list)

    def label(self) -> str:
        return f"process {self.process_id} (host {self.host}, pid {self.pid})"


@dataclass
class ProcessTime:
    """One process's own timing of one size."""

    process_id: int
    host: str
    time_us: float
    stats_us: dict[str, float]
    wrong: int | None
    slow: bool = False
    in_place_time_us: float | None = None
    in_place_wrong: int | None = None


@dataclass
class InPlaceResult:
    """The in-place column of a size: the op writing over its (donated) input."""

    time_us: float
    stats_us: dict[str, float]
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None: not checked (--check off)
    checked_elements: int = 0


@dataclass
class SizeResult:
    requested_bytes: int
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    time_us: float | None = None
    stats_us: dict[str, float] = field(default_factory=dict)
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    wrong: int | None = None  # None: not checked (--check off)
    checked_elements: int = 0
    compile_ms: float | None = None
    processes: list[ProcessTime] = field(default_factory=list)
    error: str | None = None
    # Added with back-to-back timing: the columns above are out-of-place.
    in_place: InPlaceResult | None = None
    calls_per_sample: int | None = None  # k: calls issued back to back per sample
    sample_ms: float | None = None  # mean length of a timed sample (the slowest process's)
    blocking_call_us: float | None = None  # one call issued and waited for: latency with the host round trip
    calibration_note: str | None = None  # why the samples are shorter than --sample-ms, or None

    @property
    def wrong_total(self) -> int | None:
        """Wrong values of both columns; None when not checked."""
        if self.wrong is None:
            return None
        return self.wrong + ((self.in_place.wrong or 0) if self.in_place else 0)


@dataclass
class CaseResult:
    op: str
    redop: str | None
    root: int | None
    shift: int | None
    implementation: str
    ranks: int
    groups: int
    busbw_factor: float
    busbw_formula: str
    results: list[SizeResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.op + (f" ({self.redop})" if self.redop else "")

    @property
    def avg_busbw_gbps(self) -> float | None:
        values = [r.busbw_gbps for r in self.results if r.busbw_gbps is not None]
        return sum(values) / len(values) if values else None

    @property
    def wrong(self) -> int | None:
        """Wrong values of every size, out-of-place and in-place."""
        counts = [r.wrong_total for r in self.results if r.error is None]
        return None if not counts or any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def small_message_latency(self) -> SmallMessageLatency | None:
        """The time of the smallest size that ran: what one small collective costs, back to back."""
        rows = [r for r in self.results if r.time_us is not None]
        if not rows:
            return None
        row = min(rows, key=lambda r: r.size_bytes)
        return SmallMessageLatency(size_bytes=row.size_bytes, out_of_place_us=row.time_us,
                                   in_place_us=row.in_place.time_us if row.in_place else None,
                                   blocking_call_us=row.blocking_call_us)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["avg_busbw_gbps"] = self.avg_busbw_gbps
        data["wrong"] = self.wrong
        data["small_message_latency"] = self.small_message_latency
        return data


@dataclass
class SlowProcess:
    process_id: int
    host: str
    pid: int
    slow_sizes: int  # sizes at which it was flagged
    worst_ratio: float  # its time over the median at its worst size


@dataclass
class CollectivesReport:
    command: str
    time: str
    platform: str
    device_kind: str
    jax_version: str
    jaxlib_version: str
    processes: list[ProcessInfo]
    device_ids: list[int]
    mesh_shape: list[int]
    mesh_axes: list[str]
    axis: str
    ranks: int
    groups: int
    settings: RunSettings
    tests: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    status: str = STATUS_OK
    exit_code: int = 0

    @property
    def wrong(self) -> int | None:
        counts = [t.wrong for t in self.tests if t.results]
        return None if not counts or any(c is None for c in counts) else sum(c or 0 for c in counts)

    @property
    def avg_busbw_gbps(self) -> float | None:
        values = [r.busbw_gbps for t in self.tests for r in t.results if r.busbw_gbps is not None]
        return sum(values) / len(values) if values else None

    def slow_processes(self) -> list[SlowProcess]:
        by_id = {p.process_id: p for p in self.processes}
        found: dict[int, SlowProcess] = {}
        for test in self.tests:
            for result in test.results:
                if result.time_us is None:
                    continue
                median = statistics.median([p.time_us for p in result.processes] or [0.0])
                for timing in result.processes:
                    if not timing.slow:
                        continue
                    info = by_id.get(timing.process_id, ProcessInfo(timing.process_id, timing.host, 0))
                    entry = found.setdefault(timing.process_id, SlowProcess(
                        timing.process_id, info.host, info.pid, 0, 0.0))
                    entry.slow_sizes += 1
                    entry.worst_ratio = max(entry.worst_ratio, timing.time_us / median if median else 0.0)
        return [found[k] for k in sorted(found)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "time": self.time,
            "platform": self.platform,
            "device_kind": self.device_kind,
            "jax_version": self.jax_version,
            "jaxlib_version": self.jaxlib_version,
            "process_count": len(self.processes),
            "processes": [asdict(p) for p in self.processes],
            "device_ids": self.device_ids,
            "mesh": {"shape": self.mesh_shape, "axis_names": self.mesh_axes, "axis": self.axis},
            "ranks": self.ranks,
            "groups": self.groups,
            "settings": self.settings,
            "tests": [t.to_dict() for t in self.tests],
            "wrong": self.wrong,
            "avg_busbw_gbps": self.avg_busbw_gbps,
            "slow_processes": [asdict(s) for s in self.slow_processes()],
            "notes": self.notes,
            "status": self.status,
            "error": self.error,
            "exit_code": self.exit_code,
        }



def judge(report: CollectivesReport, min_busbw_gbps: float | None) -> int:
    """Set the report's status, error and exit code; failures first, then wrong values, then the floor."""
    failed = [(t, r) for t in report.tests for r in t.results if r.error]
    wrong = report.wrong
    below = [t for t in report.tests if min_busbw_gbps is not None and t.results
             and (t.avg_busbw_gbps or 0.0) < min_busbw_gbps]
    if failed:
        test, row = failed[0]
        report.status, report.exit_code = STATUS_FAILED, EXIT_FAILURE
        report.error = f"{test.label} at {format_bytes(row.size_bytes)} failed: {row.error}"
    elif wrong:
        report.status, report.exit_code = STATUS_WRONG, EXIT_GATE
        report.error = f"{wrong} wrong values: the collectives returned results that differ from the host's"
    elif below:
        report.status, report.exit_code = STATUS_SLOW, EXIT_GATE
        report.error = "; ".join(f"{t.label}: average busbw {t.avg_busbw_gbps or 0:.3f} GB/s is below "
                                 f"--min-busbw {min_busbw_gbps:g} GB/s" for t in below)
    else:
        report.status, report.exit_code, report.error = STATUS_OK, EXIT_OK, None
    return report.exit_code


def failure_document(command: str, time: str, message: str, exit_code: int) -> dict[str, Any]:
    """The JSON document of a run that failed before it could describe its devices: same keys, no data."""
    return {
        "schema": SCHEMA, "command": command, "time": time, "platform": None, "device_kind": None,
        "jax_version": None, "jaxlib_version": None, "process_count": None, "processes": [],
        "device_ids": [], "mesh": None, "ranks": None, "groups": None, "settings": None, "tests": [],
        "wrong": None, "avg_busbw_gbps": None, "slow_processes": [], "notes": [], "status": STATUS_FAILED,
        "error": message, "exit_code": exit_code,
    }
