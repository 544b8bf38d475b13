"""Compare a result with a baseline: every figure's change, and which changes are regressions.

A figure regresses when even the favourable end of its current interquartile
range is worse than the unfavourable end of the baseline's, by more than the
tolerance: for a rate (higher is better) `current.p75 < baseline.p25 * (1 - tol)`,
for a time `current.p25 > baseline.p75 * (1 + tol)`. Noise widens both ranges,
so noise alone does not fail a build. Figures with fewer than 3 samples on
either side have no spread to judge by: they are shown, not gated. A case that
ran in the baseline and failed now (error, out of memory, unsupported) is a
regression too. A gate that judged nothing passes nothing: a case measured in
the baseline and absent now, or a comparison with no figure on both sides,
fails it unless missing cases are allowed (`--allow-missing`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

from tpu_tools.bench.environment import differences
from tpu_tools.bench.records import INTERRUPTED, NOT_RUN, OK, SCHEMA, STATUSES, RunResult
from tpu_tools.bench.stats import Summary
from tpu_tools.errors import UsageError
from tpu_tools.infile import InputFileError, read_input_file
from tpu_tools.outside import OutsideError, convert, plain_json
from tpu_tools.parsing import parse_number
from tpu_tools.shorten import quoted, shorten

MIN_GATED_SAMPLES = 3

SAME = "ok"
BETTER = "better"
WORSE = "worse (within noise)"
REGRESSION = "regression"
NOT_GATED = "not gated (n<3)"
NEW = "new"
INVALID = "invalid (not a finite number)"  # NaN or infinite: nothing can be judged, so the gate fails
LOST = "regression"  # a case that no longer produces figures


@dataclass
class FigureChange:
    case_id: str
    figure: str  # a stats key with its unit: "throughput_tflops"
    baseline_median: float | None
    current_median: float | None
    change_percent: float | None  # of the median, signed: + means the number went up
    verdict: str
    note: str | None = None

    @property
    def regressed(self) -> bool:
        return self.verdict in (REGRESSION, INVALID)


@dataclass
class Comparison:
    tolerance: float  # a fraction: 0.05 for 5 %
    changes: list[FigureChange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    baseline_only: list[str] = field(default_factory=list)  # case ids this run did not include
    missing: list[str] = field(default_factory=list)  # of those, the ones the baseline measured (status ok)
    judged: int = 0  # figures compared with a baseline figure
    allow_missing: bool = False

    @property
    def incomplete(self) -> str | None:
        """Why the gate cannot pass on this comparison (nothing judged, baseline cases not run), or None."""
        if self.allow_missing:
            return None
        if self.missing:
            shown = ", ".join(self.missing[:3]) + (f" and {len(self.missing) - 3} more" if len(self.missing) > 3
                                                   else "")
            count = len(self.missing)
            return (f"{count} baseline case{'s' if count > 1 else ''} {'were' if count > 1 else 'was'} not "
                    f"measured this time: {shown} (--allow-missing lets the gate pass without them)")
        if not self.judged:
            return "no figure was compared with the baseline (--allow-missing lets the gate pass on nothing)"
        return None

    @property
    def regressions(self) -> list[FigureChange]:
        return [c for c in self.changes if c.regressed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tolerance_percent": self.tolerance * 100,
            "regression_count": len(self.regressions),
            "warnings": self.warnings,
            "baseline_only": self.baseline_only,
            "missing": self.missing,
            "judged_count": self.judged,
            "allow_missing": self.allow_missing,
            "changes": [asdict(c) for c in self.changes],
        }


def parse_tolerance(text: str) -> float:
    """"5%", "5" or "2.5 %" as a fraction (0.05). Raises ValueError."""
    cleaned = text.strip().removesuffix("%").strip()
    try:
        value = parse_number(cleaned, "tolerance")
    except ValueError:
        raise ValueError(f"{quoted(text, 40)} is not a percentage (use e.g. 5%)") from None
    if not 0 <= value < 100:
        raise ValueError(f"tolerance {text!r} must be at least 0% and below 100%")
    return value / 100


MAX_RESULT_BYTES = 64 << 20  # a result of thousands of cases is a few MiB; more is not a tpu-bench result


def load_result(path: str | Path, role: str = "baseline") -> dict[str, Any]:
    """A result document read from a file, or a UsageError saying what is wrong with the file.

    The document is checked field by field (types, statuses, every statistic a number) before anything
    uses it, so a damaged or hand-edited file is one error line, never an internal error.
    """
    path = Path(path)
    try:
        text = read_input_file(path, f"{role} file", MAX_RESULT_BYTES).decode("utf-8")
    except InputFileError as error:
        raise UsageError(str(error)) from None
    except UnicodeDecodeError as error:
        raise UsageError(f"cannot read {role} file {path}: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{role} file {path} is not JSON ({error.msg} at line {error.lineno}, "
                         f"column {error.colno})") from None
    except RecursionError:
        raise UsageError(f"{role} file {path} is nested too deeply to be a tpu-bench result") from None
    except ValueError as error:  # an integer of thousands of digits: Python refuses to convert it
        raise UsageError(f"{role} file {path} is a damaged tpu-bench result (a number too long to read: "
                         f"{str(error).split(':')[0][:60]})") from None
    schema = document.get("schema") if isinstance(document, dict) else None
    if schema != SCHEMA:
        shown = f"schema {schema!r}" if isinstance(schema, str) and schema else "no schema key"
        raise UsageError(f"{role} file {path} is not a tpu-bench result ({shorten(shown, 80)}, expected {SCHEMA!r})")
    try:
        document = check_result_document(document)
        RunResult.from_dict(document)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UsageError(f"{role} file {path} is a damaged tpu-bench result ({error})") from None
    return document


# What a comparison reads of a result file (its other fields are kept as data, see `plain_json`).
class _Figure(msgspec.Struct):
    """Every statistic present; a null one is how tpu_tools.jsonout writes a non-finite figure (judged as such)."""

    median: float | None
    p25: float | None
    p75: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None
    mean: float | None
    stdev: float | None
    count: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # samples: no run takes more
    higher_is_better: bool


class _Case(msgspec.Struct):
    benchmark: str
    name: str
    status: str
    params: dict[str, Any] | None = None
    stats: dict[str, _Figure] | None = None
    values: dict[str, Any] | None = None
    primary: str | None = None
    warnings: list[str] | None = None
    message: str | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: {quoted(self.status, 40)} is not one of {', '.join(STATUSES)}")


class _Environment(msgspec.Struct):
    versions: dict[str, Any] | None = None
    variables: dict[str, Any] | None = None


class _Device(msgspec.Struct):
    peak_ops_per_s_per_device: dict[str, Any] | None = None


class _Result(msgspec.Struct):
    environment: _Environment | None = None
    device: _Device | None = None
    settings: dict[str, Any] | None = None
    notes: list[str] | None = None
    time: str | None = None
    suite: str | None = None
    results: list[_Case] | None = None


# Every figure is a time, a rate or a size: its location statistics are above 0. A zero or negative median
# (a hand-edited file) would make every change a nonsense percentage ("better -213.7 %").
_LOCATION_FIGURES = ("median", "p25", "p75", "mean")


def check_result_document(document: dict[str, Any]) -> dict[str, Any]:
    """The clean copy of a result document, or OutsideError naming the first field that does not fit."""
    clean: dict[str, Any] = plain_json(document)
    convert(clean, _Result)
    for index, result in enumerate(clean.get("results") or []):
        for figure, summary in (result.get("stats") or {}).items():
            for name, value in summary.items():
                if value is None and name in Summary.__dataclass_fields__:
                    summary[name] = math.nan
                elif name in _LOCATION_FIGURES and isinstance(value, (int, float)) and value <= 0:
                    where = f"results[{index}].stats.{shorten(str(figure), 40)}.{name}"
                    raise OutsideError(f"{where}: {value:g} is not above 0; no figure of a benchmark is")
    return clean


def check_environments(baseline: dict[str, Any], current: dict[str, Any], allow_mismatch: bool) -> list[str]:
    """Warnings about the environments; a UsageError when the devices differ and that is not allowed."""
    errors, warnings = differences(baseline, current)
    if errors and not allow_mismatch:
        raise UsageError(errors[0] + " (--allow-mismatch compares them anyway)")
    return errors + warnings


def compare(baseline: dict[str, Any], current: dict[str, Any], tolerance: float,
            allow_mismatch: bool = False, allow_missing: bool = False) -> Comparison:
    comparison = Comparison(tolerance, warnings=check_environments(baseline, current, allow_mismatch),
                            allow_missing=allow_missing)
    base_cases = {r.case.id: r for r in RunResult.from_dict(baseline).results}
    cur_cases = {r.case.id: r for r in RunResult.from_dict(current).results}
    for case_id, cur in cur_cases.items():
        base = base_cases.get(case_id)
        if base is None or base.status != OK:
            for figure, summary in cur.stats.items():
                verdict, note = (NEW, None) if _finite(summary) else (INVALID, "the current figure is not finite")
                comparison.changes.append(FigureChange(case_id, figure, None, summary.median, None, verdict, note))
            continue
        if cur.status in (INTERRUPTED, NOT_RUN):
            continue  # the run was cut short; its exit status says so
        if cur.status != OK:
            comparison.changes.append(FigureChange(case_id, "status", None, None, None, LOST,
                                                   note=f"{cur.status}: {cur.message}"))
            continue
        for figure, base_summary in base.stats.items():
            cur_summary = cur.stats.get(figure)
            if cur_summary is None:
                comparison.changes.append(FigureChange(case_id, figure, base_summary.median, None, None, LOST,
                                                       note="figure missing from the current result"))
            else:
                change = judge(case_id, figure, base_summary, cur_summary, tolerance)
                # Still gated (the quartiles already span the repeats' spread), but said: the figure moved in
                # its own run, so a rerun on a quieter host is the first thing to try.
                noisy = [side for side, r in (("baseline", base), ("current", cur)) if r.values.get("noisy")]
                if noisy and change.verdict != SAME:
                    change.note = f"the {' and '.join(noisy)} run flagged this case noisy"
                comparison.changes.append(change)
                comparison.judged += 1
    comparison.baseline_only = [case_id for case_id in base_cases if case_id not in cur_cases]
    comparison.missing = [case_id for case_id in comparison.baseline_only if base_cases[case_id].status == OK]
    return comparison


def _finite(summary: Summary) -> bool:
    return all(math.isfinite(value) for value in (summary.median, summary.p25, summary.p75))


def judge(case_id: str, figure: str, base: Summary, cur: Summary, tolerance: float) -> FigureChange:
    if not (_finite(base) and _finite(cur)):
        which = " and ".join(name for name, s in (("baseline", base), ("current", cur)) if not _finite(s))
        return FigureChange(case_id, figure, base.median, cur.median, None, INVALID,
                            note=f"the {which} figure is not finite")
    change = (cur.median - base.median) / base.median * 100 if base.median else None
    higher = base.higher_is_better
    better_by = ((cur.median - base.median) if higher else (base.median - cur.median)) / base.median \
        if base.median else 0.0
    if higher:
        beyond_noise = cur.p75 < base.p25 * (1 - tolerance)
    else:
        beyond_noise = cur.p25 > base.p75 * (1 + tolerance)
    if beyond_noise:
        verdict = REGRESSION if min(base.count, cur.count) >= MIN_GATED_SAMPLES else NOT_GATED
    elif better_by > tolerance:
        verdict = BETTER
    elif better_by < -tolerance:
        verdict = WORSE
    else:
        verdict = SAME
    return FigureChange(case_id, figure, base.median, cur.median, change, verdict)
