"""Text views of benchmark results: the header line, the results table, the comparison table."""

from __future__ import annotations

from tpu_tools.bench.compare import Comparison
from tpu_tools.bench.records import OK, BenchDevice, CaseResult, RunResult
from tpu_tools.bench.stats import Summary
from tpu_tools.render.table import Column, TableData
from tpu_tools.units import MISSING, format_duration_us, format_percent, format_si

_STATUS_TEXT = {"unsupported": "unsupported", "out_of_memory": "out of memory", "failed": "FAILED",
                "interrupted": "interrupted", "not_run": "not run"}


def format_figure(key: str, value: float | None) -> str:
    """A figure shown in the unit its key names: time_us, latency_ms, throughput_tflops, bandwidth_gbps."""
    if value is None:
        return MISSING
    if key.endswith("_us"):
        return format_duration_us(value)
    if key.endswith("_ms"):
        return format_duration_us(value * 1e3)
    if key.endswith("_tflops"):
        return format_si(value * 1e12, "FLOP/s")
    if key.endswith("_tops"):
        return format_si(value * 1e12, "OP/s")
    if key.endswith("_gbps"):
        return format_si(value * 1e9, "B/s")
    if key.endswith("_per_s"):  # "5.72k samples/s"
        number, _, prefix = format_si(value).partition(" ")
        return f"{number}{prefix} {key.removesuffix('_per_s')}/s"
    return f"{value:.4g}"


def header_lines(run: RunResult) -> list[str]:
    device, environment = run.device or BenchDevice(), run.environment
    versions = environment.versions
    settings = [f"suite {run.suite}"] if run.suite else []
    settings.append(f"min-time {run.settings.min_time_s} s")
    return [
        f"device {_known(device.kind)} x{_known(device.count)} ({_known(device.platform)})  "
        f"jax {versions.jax or '-'}, jaxlib {versions.jaxlib or '-'}",
        f"host {_known(environment.host)}: {_known(environment.cpu_model)}, {_known(environment.cpu_count)} CPUs  "
        + "  ".join(settings),
    ]


def _known(value: object) -> str:
    return "?" if value is None else str(value)


def spread_text(summary: Summary) -> str:
    """Half the interquartile range, relative to the median: "±1.7%" ("-" for fewer than 3 samples)."""
    if not summary.median or summary.count < 3:
        return MISSING
    return f"±{summary.iqr / 2 / abs(summary.median) * 100:.1f}%"


def _peak(result: CaseResult) -> float | None:
    figures = result.figures()
    return figures.percent_of_peak if figures.percent_of_peak is not None else figures.mfu_percent


def results_table(run: RunResult) -> TableData:
    """MEDIAN of each case's headline figure, SPREAD (half its IQR), N samples, % of peak (where known)."""
    with_peak = any(_peak(r) is not None for r in run.results)
    columns = [Column("BENCHMARK", no_wrap=True), Column("CASE", no_wrap=True), Column("MEDIAN", "right", no_wrap=True),
               Column("SPREAD", "right", no_wrap=True), Column("N", "right", no_wrap=True)]
    if with_peak:
        columns.append(Column("% PEAK", "right", no_wrap=True))
    columns.append(Column("DETAILS"))
    table = TableData(columns)
    for result in run.results:
        cells: list[object]
        if result.status != OK or result.primary is None:
            cells = [_STATUS_TEXT.get(result.status, result.status), MISSING, MISSING]
            peak, text = MISSING, result.message or ""
        else:
            primary = result.stats[result.primary]
            cells = [format_figure(result.primary, primary.median), spread_text(primary), primary.count]
            value = _peak(result)
            peak, text = (format_percent(value) if value is not None else MISSING), details(result)
        row = [result.case.benchmark, result.case.name, *cells] + ([peak] if with_peak else []) + [text]
        table.add_row(*row)
    return table


def _time(summary: Summary | None, key: str = "time_us") -> str:
    return format_figure(key, summary.median if summary is not None else None)


def details(result: CaseResult) -> str:  # noqa: C901 one short branch per benchmark kind, read as one table
    stats, figures = result.statistics(), result.figures()
    benchmark = result.case.benchmark
    parts: list[str] = []
    if benchmark in ("matmul", "memory", "transfer"):
        parts.append(f"time {_time(stats.time_us)}")
        ran_as = figures.arithmetic
        if benchmark == "matmul" and ran_as and ran_as != result.case.params.get("dtype"):
            parts.append(f"ran as {ran_as}")  # f32 at the default precision: tf32 on NVIDIA, bf16 on a TPU
    elif benchmark == "fn":
        if result.primary != "time_us":
            parts.append(f"time {_time(stats.time_us)}")
        if stats.bandwidth_gbps is not None:
            parts.append(_time(stats.bandwidth_gbps, "bandwidth_gbps"))
        if figures.percent_of_roofline is not None:
            parts.append(f"{figures.percent_of_roofline:.3g}% of the roofline ({figures.roofline_bound}-bound), "
                         f"nearer the {figures.measured_bound} ceiling")
    elif benchmark == "program":
        if figures.step_time_p50_ms is not None and figures.step_time_p99_ms is not None:
            parts.append(f"step p50/p99 {figures.step_time_p50_ms:.4g}/{figures.step_time_p99_ms:.4g} ms")
        parts.append(f"{figures.steps} steps in {figures.run_s or 0.0:.1f} s ({figures.ended})")
        compile_ms = figures.compile_time_s * 1e3 if figures.compile_time_s is not None else None
        parts.append(f"{figures.compile_count} compiles, {format_figure('compile_ms', compile_ms)}")
    elif benchmark == "dispatch" and stats.latency_us is not None:
        parts.append(f"p99 {format_figure('latency_us', stats.latency_us.p99)}")
        if stats.back_to_back_us is not None:
            parts.append(f"back to back {_time(stats.back_to_back_us, 'latency_us')}")
    elif benchmark == "compile":
        parts.append(f"cold {_time(stats.cold_compile_ms, 'cold_ms')}, warm {_time(stats.warm_compile_ms, 'warm_ms')} "
                     f"({figures.speedup or 0.0:.1f}x), cache hit verified")
    elif benchmark == "train" and stats.step_time_ms is not None:
        step = stats.step_time_ms
        parts.append(_time(stats.tokens_per_s, "tokens_per_s"))
        parts.append(f"step p50/p90/p99 {step.median:.4g}/{step.p90:.4g}/{step.p99:.4g} ms")
        parts.append(f"{(figures.model_flops_per_step or 0.0) / 1e9:.4g} GFLOP/step")
        devices = figures.devices or 1
        parts.append(f"{devices} device{'s' if devices != 1 else ''} x batch {(figures.global_batch or 0) // devices}")
    elif benchmark == "infer" and stats.latency_ms is not None:
        latency = stats.latency_ms
        parts.append(f"latency p50/p99 {latency.median:.4g}/{latency.p99:.4g} ms")
        parts.append(_time(stats.tokens_per_s, "tokens_per_s"))
    if figures.cost_per_1m_samples is not None:
        parts.append(f"{figures.cost_per_1m_samples:.4g} per 1M samples")
    if figures.compile_ms is not None:
        parts.append(f"compile {format_figure('compile_ms', figures.compile_ms)}")
    if figures.noisy:
        parts.append("noisy")  # the warnings below say why
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

