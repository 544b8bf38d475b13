"""Result records of a benchmark run and the `tpu-tools/bench/v1` document they make.

A run is a list of cases (one benchmark at one size, dtype or batch). A case
carries `stats` (sampled figures, each a `Summary`, keyed by name with its unit:
`time_us`, `throughput_tflops`) and `values` (single figures: compile time,
FLOP counts, % of peak). The same records feed the table, the JSON file, JUnit
and the baseline comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from tpu_tools.bench.stats import Summary

SCHEMA = "tpu-tools/bench/v1"

OK = "ok"
UNSUPPORTED = "unsupported"
OUT_OF_MEMORY = "out_of_memory"
FAILED = "failed"
INTERRUPTED = "interrupted"
NOT_RUN = "not_run"
STATUSES = (OK, UNSUPPORTED, OUT_OF_MEMORY, FAILED, INTERRUPTED, NOT_RUN)


class RecordedVersions(msgspec.Struct, kw_only=True):
    """The stack's versions a result was measured with (versions.StackVersions, as written)."""

    tpu_tools: str | None = None
    jax: str | None = None
    jaxlib: str | None = None
    plugins: dict[str, str] = {}  # PJRT plugin distribution -> version


class BenchEnvironment(msgspec.Struct, kw_only=True):
    """Host and software facts a result depends on (environment.environment_record); None where not recorded."""

    host: str | None = None
    os: str | None = None
    python: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    cpus_usable: int | None = None  # CPUs this process may run on (taskset, cpusets)
    versions: RecordedVersions = msgspec.field(default_factory=RecordedVersions)
    variables: dict[str, str] = {}  # the environment variables that change what XLA compiles and runs
    command: str | None = None


class F32Matmul(msgspec.Struct, kw_only=True):
    """What an f32 matmul runs as at one JAX precision, and its per-device peak."""

    arithmetic: str | None = None  # "fp32", "tf32", "bf16_3x (3 passes)"
    peak_ops_per_s: float | None = None


class BenchDevice(msgspec.Struct, kw_only=True):
    """The benchmarked devices and the peaks known for them, per device (environment.device_record)."""

    platform: str | None = None
    platform_version: str | None = None
    kind: str | None = None
    count: int | None = None
    process_count: int | None = None
    chip: str | None = None
    devices_per_chip: int | None = None
    memory_bytes: int | None = None
    peak_ops_per_s_per_device: dict[str, float | None] = {}  # matmul dtype -> dense peak
    f32_matmul: dict[str, F32Matmul] = {}  # JAX precision -> what f32 runs as
    peak_memory_bandwidth_bytes_per_s_per_device: float | None = None


# A setting not given (benchmarks, outside `tpu-bench run`) is left out of the JSON.
class BenchSettings(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How the run measured."""

    min_time_s: float | None = None
    warmup: int | None = None
    min_samples: int | None = None
    seed: int | None = None
    sample_time_s: float | None = None
    repeats: int | None = None
    timeout_s: float | None = None
    benchmarks: list[str] | None = None


@dataclass(frozen=True)
class Case:
    """One planned measurement: `benchmark` names the module, `params` say what to run."""

    benchmark: str
    name: str  # short and human: "bf16 1024x1024x1024", "copy 64.0 MiB"
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """Stable key used to match cases between runs: "matmul/bf16/1024x1024x1024"."""
        return f"{self.benchmark}/{self.name.replace(' ', '/')}"


class CaseFigures(msgspec.Struct, kw_only=True):
    """The figures of a case's `values` that its report line shows, by name: each benchmark writes those of its
    kind (the others stay None). `values` stays the benchmark's own open map, as tpu-bench's JSON writes it."""

    percent_of_peak: float | None = None
    mfu_percent: float | None = None
    arithmetic: str | None = None  # what a matmul ran as (f32 at the default precision: tf32 or bf16)
    percent_of_roofline: float | None = None
    roofline_bound: str | None = None
    measured_bound: str | None = None
    step_time_p50_ms: float | None = None
    step_time_p99_ms: float | None = None
    steps: int | None = None
    run_s: float | None = None
    ended: str | None = None
    compile_time_s: float | None = None
    compile_count: int | None = None
    speedup: float | None = None
    model_flops_per_step: float | None = None
    devices: int | None = None
    global_batch: int | None = None
    cost_per_1m_samples: float | None = None
    compile_ms: float | None = None
    noisy: bool | None = None


class CaseStatistics(msgspec.Struct, kw_only=True):
    """The statistics of a case that its report line shows, by name (each benchmark records those of its kind)."""

    time_us: Summary | None = None
    bandwidth_gbps: Summary | None = None
    latency_us: Summary | None = None
    back_to_back_us: Summary | None = None
    cold_compile_ms: Summary | None = None
    warm_compile_ms: Summary | None = None
    step_time_ms: Summary | None = None
    tokens_per_s: Summary | None = None
    latency_ms: Summary | None = None


_FIGURE_NAMES = frozenset(CaseFigures.__struct_fields__)
_STATISTIC_NAMES = frozenset(CaseStatistics.__struct_fields__)


@dataclass
class CaseResult:
    case: Case
    status: str = OK
    message: str | None = None  # why a case did not run or failed
    primary: str | None = None  # the headline figure: a key of `stats`
    stats: dict[str, Summary] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    duration_s: float = 0.0  # wall time of the whole case: set-up, compile, warm-up and samples

    def figures(self) -> CaseFigures:
        """The shown figures of `values` as a record; none where a value is not of its kind (a damaged result file)."""
        try:
            return msgspec.convert({name: value for name, value in self.values.items() if name in _FIGURE_NAMES},
                                   CaseFigures, strict=False)
        except msgspec.ValidationError:
            return CaseFigures()

    def statistics(self) -> CaseStatistics:
        """The shown statistics as a record."""
        return CaseStatistics(**{name: summary for name, summary in self.stats.items() if name in _STATISTIC_NAMES})

    def warn(self, warning: str | None) -> None:
        """Keep a warning (None is none)."""
        if warning:
            self.warnings.append(warning)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "benchmark": self.case.benchmark,
            "name": self.case.name,
            "params": self.case.params,
            "status": self.status,
            "message": self.message,
            "primary": self.primary,
            "stats": {name: summary.to_dict() for name, summary in self.stats.items()},
            "values": self.values,
            "warnings": self.warnings,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        case = Case(data["benchmark"], data["name"], data.get("params") or {})
        return cls(case=case, status=data["status"], message=data.get("message"), primary=data.get("primary"),
                   stats={k: Summary.from_dict(v) for k, v in (data.get("stats") or {}).items()},
                   values=data.get("values") or {}, warnings=list(data.get("warnings") or []),
                   duration_s=float(data.get("duration_s") or 0.0))


@dataclass
class RunResult:
    environment: BenchEnvironment
    device: BenchDevice | None  # None until the runtime is open (a run that failed before: `{}` in the JSON)
    settings: BenchSettings
    results: list[CaseResult] = field(default_factory=list)
    suite: str | None = None
    time: str = ""
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    comparison: dict[str, Any] | None = None

    @property
    def failed(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == FAILED]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "time": self.time,
            "suite": self.suite,
            "interrupted": self.interrupted,
            "settings": msgspec.to_builtins(self.settings),
            "environment": msgspec.to_builtins(self.environment),
            "device": msgspec.to_builtins(self.device) if self.device is not None else {},
            "results": [r.to_dict() for r in self.results],
            "notes": self.notes,
            "comparison": self.comparison,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        device = data.get("device")
        return cls(environment=msgspec.convert(data.get("environment") or {}, BenchEnvironment),
                   device=msgspec.convert(device, BenchDevice) if device else None,
                   settings=msgspec.convert(data.get("settings") or {}, BenchSettings),
                   results=[CaseResult.from_dict(r) for r in data.get("results") or []],
                   suite=data.get("suite"), time=data.get("time", ""), interrupted=bool(data.get("interrupted")),
                   notes=list(data.get("notes") or []), comparison=data.get("comparison"))
