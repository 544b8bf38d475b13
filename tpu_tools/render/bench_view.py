"""Text views of benchmark results: the header line, the results table, the comparison table."""

from __future__ import annotations

from tpu_tools.bench.compare import Comparison
from tpu_tools.bench.records import OK, CaseResult, RunResult
from tpu_tools.bench.stats import Summary
from tpu_tools.render.table import Column, TableData
from tpu_tools.render.units import MISSING, format_duration_us, format_percent

_STATUS_TEXT = {"unsupported": "unsupported", "out_of_memory": "out of memory", "failed": "FAILED",
                "interrupted": "interrupted", "not_run": "not run"}


def _scaled(value: float, unit: str, prefixes: tuple[tuple[float, str], ...]) -> str:
    for factor, prefix in prefixes:
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    factor, prefix = prefixes[-1]
    return f"{value / factor:.3g} {prefix}{unit}"


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def format_figure(key: str, value: float | None) -> str:
    """A figure shown in the unit its key names: time_us, latency_ms, throughput_tflops, bandwidth_gbps."""
    if value is None:
        return MISSING
    if key.endswith("_us"):
        return format_duration_us(value)
    if key.endswith("_ms"):
        return format_duration_us(value * 1e3)
    if key.endswith("_tflops"):
        return _scaled(value * 1e12, "FLOP/s", _SI)
    if key.endswith("_tops"):
        return _scaled(value * 1e12, "OP/s", _SI)
    if key.endswith("_gbps"):
        return _scaled(value * 1e9, "B/s", _SI)
    if key.endswith("_per_s"):
        return _scaled(value, "/s", _SI).replace(" /s", "/s")
    return f"{value:.4g}"


def header_line(run: RunResult) -> str:
    device, environment = run.device, run.environment
    versions = environment.get("versions") or {}
    parts = [f"device {device.get('kind', '?')} x{device.get('count', '?')} ({device.get('platform', '?')})",
             f"jax {versions.get('jax') or '-'}",
             f"host {environment.get('host', '?')} ({environment.get('cpu_model', '?')}, "
             f"{environment.get('cpu_count', '?')} CPUs)"]
    if run.suite:
        parts.append(f"suite {run.suite}")
    parts.append(f"min-time {run.settings.get('min_time_s')} s")
    return "  ".join(parts)


def _spread(summary: Summary, key: str) -> str:
    return f"{format_figure(key, summary.p25)} .. {format_figure(key, summary.p75)}"


def results_table(run: RunResult) -> TableData:
    table = TableData([
        Column("BENCHMARK"), Column("CASE"), Column("MEDIAN", "right"), Column("IQR (p25 .. p75)", "right"),
        Column("N", "right"), Column("% PEAK", "right"), Column("COMPILE", "right"), Column("DETAILS"),
    ])
    for result in run.results:
        if result.status != OK or result.primary is None:
            table.add_row(result.case.benchmark, result.case.name, _STATUS_TEXT.get(result.status, result.status),
                          MISSING, MISSING, MISSING, MISSING, result.message or "")
            continue
        primary = result.stats[result.primary]
        peak = result.values.get("percent_of_peak", result.values.get("mfu_percent"))
        compile_ms = result.values.get("compile_ms")
        table.add_row(result.case.benchmark, result.case.name, format_figure(result.primary, primary.median),
                      _spread(primary, result.primary), primary.count,
                      format_percent(peak) if peak is not None else MISSING,
                      format_figure("compile_ms", compile_ms) if compile_ms is not None else MISSING,
                      details(result))
    return table


def details(result: CaseResult) -> str:
    stats, values = result.stats, result.values
    benchmark = result.case.benchmark
    parts: list[str] = []
    if benchmark in ("matmul", "memory", "transfer"):
        parts.append(f"time {format_figure('time_us', stats['time_us'].median)}")
    elif benchmark == "dispatch":
        latency = stats["latency_us"]
        parts.append(f"p99 {format_figure('latency_us', latency.p99)}")
    elif benchmark == "compile":
        cold, warm = stats["cold_compile_ms"].median, stats["warm_compile_ms"].median
        parts.append(f"cold {format_figure('cold_ms', cold)}, warm {format_figure('warm_ms', warm)} "
                     f"({values['speedup']:.1f}x), cache hit verified")
    elif benchmark == "train":
        step = stats["step_time_ms"]
        parts.append(f"{format_figure('tokens_per_s', stats['tokens_per_s'].median)} tokens")
        parts.append(f"step p50/p90/p99 {step.median:.4g}/{step.p90:.4g}/{step.p99:.4g} ms")
        parts.append(f"{values['model_flops_per_step'] / 1e9:.4g} GFLOP/step")
        devices = values["devices"]
        parts.append(f"{devices} device{'s' if devices != 1 else ''} x batch {values['global_batch'] // devices}")
    elif benchmark == "infer":
        latency = stats["latency_ms"]
        parts.append(f"latency p50/p99 {latency.median:.4g}/{latency.p99:.4g} ms")
        parts.append(f"{format_figure('tokens_per_s', stats['tokens_per_s'].median)} tokens")
    cost = values.get("cost_per_1m_samples")
    if cost is not None:
        parts.append(f"{cost:.4g} per 1M samples")
    return ", ".join(parts)


def notes(run: RunResult) -> list[str]:
    lines = [f"warning: {r.case.id}: {w}" for r in run.results for w in r.warnings]
    return lines + [f"note: {n}" for n in run.notes]


def comparison_table(comparison: Comparison) -> TableData:
    table = TableData([Column("CASE"), Column("FIGURE"), Column("BASELINE", "right"), Column("CURRENT", "right"),
                       Column("CHANGE", "right"), Column("VERDICT")],
                      title=f"compared with the baseline (tolerance {comparison.tolerance * 100:g}%)")
    for change in comparison.changes:
        verdict = change.verdict + (f": {change.note}" if change.note else "")
        table.add_row(change.case_id, change.figure, format_figure(change.figure, change.baseline_median),
                      format_figure(change.figure, change.current_median),
                      MISSING if change.change_percent is None else f"{change.change_percent:+.1f}%", verdict)
    return table


def comparison_summary(comparison: Comparison) -> list[str]:
    lines = [f"warning: {w}" for w in comparison.warnings]
    if comparison.baseline_only:
        lines.append(f"note: {len(comparison.baseline_only)} baseline cases were not run this time")
    count = len(comparison.regressions)
    lines.append(f"{count} regression{'s' if count != 1 else ''} beyond {comparison.tolerance * 100:g}% "
                 f"(spread taken into account)" if count else
                 f"no regression beyond {comparison.tolerance * 100:g}% (spread taken into account)")
    return lines

