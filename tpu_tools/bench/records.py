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

from tpu_tools.bench.stats import Summary

SCHEMA = "tpu-tools/bench/v1"

OK = "ok"
UNSUPPORTED = "unsupported"
OUT_OF_MEMORY = "out_of_memory"
FAILED = "failed"
INTERRUPTED = "interrupted"
NOT_RUN = "not_run"
STATUSES = (OK, UNSUPPORTED, OUT_OF_MEMORY, FAILED, INTERRUPTED, NOT_RUN)


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
    environment: dict[str, Any]
    device: dict[str, Any]
    settings: dict[str, Any]
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
            "settings": self.settings,
            "environment": self.environment,
            "device": self.device,
            "results": [r.to_dict() for r in self.results],
            "notes": self.notes,
            "comparison": self.comparison,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        return cls(environment=data.get("environment") or {}, device=data.get("device") or {},
                   settings=data.get("settings") or {},
                   results=[CaseResult.from_dict(r) for r in data.get("results") or []],
                   suite=data.get("suite"), time=data.get("time", ""), interrupted=bool(data.get("interrupted")),
                   notes=list(data.get("notes") or []), comparison=data.get("comparison"))
