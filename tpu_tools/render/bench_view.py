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
    return result.values.get("percent_of_peak", result.values.get("mfu_percent"))


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


def details(result: CaseResult) -> str:  # noqa: C901 one short branch per benchmark kind, read as one table
    stats, values = result.stats, result.values
    benchmark = result.case.benchmark
    parts: list[str] = []
    if benchmark in ("matmul", "memory", "transfer"):
        parts.append(f"time {format_figure('time_us', stats['time_us'].median)}")
        arithmetic = values.get("arithmetic")
        if benchmark == "matmul" and arithmetic and arithmetic != result.case.params.get("dtype"):
            parts.append(f"ran as {arithmetic}")  # f32 at the default precision: tf32 on NVIDIA, bf16 on a TPU
    elif benchmark == "fn":
        if result.primary != "time_us":
            parts.append(f"time {format_figure('time_us', stats['time_us'].median)}")
        if "bandwidth_gbps" in stats:
            parts.append(format_figure("bandwidth_gbps", stats["bandwidth_gbps"].median))
        if values.get("percent_of_roofline") is not None:
            parts.append(f"{values['percent_of_roofline']:.3g}% of the roofline ({values['roofline_bound']}-bound), "
                         f"nearer the {values['measured_bound']} ceiling")
    elif benchmark == "program":
        if values.get("step_time_p50_ms") is not None:
            parts.append(f"step p50/p99 {values['step_time_p50_ms']:.4g}/{values['step_time_p99_ms']:.4g} ms")
        parts.append(f"{values['steps']} steps in {values['run_s']:.1f} s ({values['ended']})")
        compile_text = format_figure("compile_ms", values["compile_time_s"] * 1e3)
        parts.append(f"{values['compile_count']} compiles, {compile_text}")
    elif benchmark == "dispatch":
        latency = stats["latency_us"]
        parts.append(f"p99 {format_figure('latency_us', latency.p99)}")
        if "back_to_back_us" in stats:
            parts.append(f"back to back {format_figure('latency_us', stats['back_to_back_us'].median)}")
    elif benchmark == "compile":
        cold, warm = stats["cold_compile_ms"].median, stats["warm_compile_ms"].median
        parts.append(f"cold {format_figure('cold_ms', cold)}, warm {format_figure('warm_ms', warm)} "
                     f"({values['speedup']:.1f}x), cache hit verified")
    elif benchmark == "train":
        step = stats["step_time_ms"]
        parts.append(format_figure("tokens_per_s", stats["tokens_per_s"].median))
        parts.append(f"step p50/p90/p99 {step.median:.4g}/{step.p90:.4g}/{step.p99:.4g} ms")
        parts.append(f"{values['model_flops_per_step'] / 1e9:.4g} GFLOP/step")
        devices = values["devices"]
        parts.append(f"{devices} device{'s' if devices != 1 else ''} x batch {values['global_batch'] // devices}")
    elif benchmark == "infer":
        latency = stats["latency_ms"]
        parts.append(f"latency p50/p99 {latency.median:.4g}/{latency.p99:.4g} ms")
        parts.append(format_figure("tokens_per_s", stats["tokens_per_s"].median))
    cost = values.get("cost_per_1m_samples")
    if cost is not None:
        parts.append(f"{cost:.4g} per 1M samples")
    if values.get("compile_ms") is not None:
        parts.append(f"compile {format_figure('compile_ms', values['compile_ms'])}")
    if values.get("noisy"):
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

