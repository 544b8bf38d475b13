"""The collectives table: fixed-width columns in the layout nccl-tests users read.

Comment lines start with "#" (header, formula, footer); data rows do not, so
`grep -v '^#'` leaves the numbers. Rows are rendered one at a time, as each
size completes. As in nccl-tests, each row has an out-of-place group of
columns (with any --stats) and an in-place group; a row fits 120 columns.
"""

from __future__ import annotations

import statistics

from tpu_tools.collectives.mesh import id_ranges
from tpu_tools.collectives.report import CaseResult, CollectivesReport, SizeResult
from tpu_tools.collectives.settings import RunSettings
from tpu_tools.shorten import shorten
from tpu_tools.units import format_bytes

# (name, unit, width): two header lines, as nccl-tests prints them; a row fits 80 columns.
_LEAD = [("size", "(B)", 11), ("count", "(elements)", 11), ("type", "", 5), ("redop", "", 5), ("root", "", 4)]
_TIME = [("time", "(us)", 9)]
_RATES = [("algbw", "(GB/s)", 8), ("busbw", "(GB/s)", 8), ("#wrong", "", 6)]
_GROUPS = ("out-of-place", "in-place")


def _out_of_place(stats: list[str]) -> list[tuple[str, str, int]]:
    return [*_TIME, *[(name, "(us)", 9) for name in stats], *_RATES]


def _columns(stats: list[str]) -> list[tuple[str, str, int]]:
    return [*_LEAD, *_out_of_place(stats), *_TIME, *_RATES]


def _group_line(stats: list[str]) -> str:
    """The line naming the two groups of columns above them, centred as nccl-tests does."""
    lead = sum(width + 1 for _, _, width in _LEAD)
    spans = [sum(width + 1 for _, _, width in group) for group in (_out_of_place(stats), [*_TIME, *_RATES])]
    titles = "".join(name.center(span) for name, span in zip(_GROUPS, spans, strict=True))
    return ("#" + " " * (lead - 1) + titles).rstrip()


def _join(cells: list[str], columns: list[tuple[str, str, int]]) -> str:
    return " ".join(cell.rjust(width) for cell, (_, _, width) in zip(cells, columns))


def header_lines(report: CollectivesReport, title: str) -> list[str]:
    settings = report.settings
    processes = report.processes
    hosts = sorted({p.host for p in processes})
    mesh = "x".join(map(str, report.mesh_shape)) + f" ({','.join(report.mesh_axes)})"
    sweep = (f"step x{settings.step_factor:g}" if settings.step_bytes is None
             else f"step +{format_bytes(settings.step_bytes)}")
    return [
        f"# {title}  jax {report.jax_version}, jaxlib {report.jaxlib_version}",
        f"# devices {len(report.device_ids)} ({_kind(report)}, ids "
        f"{id_ranges(report.device_ids)})  processes {len(processes)} on {len(hosts)} "
        f"host{'s' if len(hosts) != 1 else ''} ({', '.join(hosts)})",
        f"# mesh {mesh}  axis {report.axis}: {report.ranks} ranks per group, {report.groups} "
        f"group{'s' if report.groups != 1 else ''}",
        f"# sizes {format_bytes(settings.min_bytes)} to {format_bytes(settings.max_bytes)}, {sweep}  "
        f"dtype {settings.dtype}  iters {settings.iters}  warmup {settings.warmup}  "
        f"check {'on' if settings.check else 'off'}",
        _timing_line(settings),
    ]


def _timing_line(settings: RunSettings) -> str:
    if not settings.sample_ms:
        return (f"# timing: {settings.iters} calls per size, each waited for (--sample-ms 0): time includes "
                "the host's launch-and-wait round trip")
    return (f"# timing: {settings.iters} samples per size, each k calls back to back and one wait, k calibrated "
            f"for samples of {settings.sample_ms:g} ms or more; time = sample / k")


def section_lines(test: CaseResult, stats: list[str]) -> list[str]:
    columns = _columns(stats)
    implementation = f" [{test.implementation}]" if test.implementation else ""
    return [
        "#",
        f"# {test.label}{implementation}: {test.busbw_formula}",
        _group_line(stats),
        "#" + _join([name for name, _, _ in columns], columns)[1:],
        ("#" + _join([unit for _, unit, _ in columns], columns)[1:]).rstrip(),
    ]


def row_line(row: SizeResult, stats: list[str]) -> str:
    columns = _columns(stats)
    lead = [str(row.size_bytes), str(row.count), row.dtype, row.redop or "-",
            "-" if row.root is None else str(row.root)]
    if row.error is not None:
        return _join(lead, columns[: len(_LEAD)]) + "  ERROR: " + row.error
    cells = [*lead, _time(row.time_us), *[_time(row.stats_us.get(name)) for name in stats],
             _rate(row.algbw_gbps), _rate(row.busbw_gbps), _wrong(row.wrong)]
    in_place = row.in_place
    if in_place is None:
        cells += ["-", "-", "-", "-"]
    else:
        cells += [_time(in_place.time_us), _rate(in_place.algbw_gbps), _rate(in_place.busbw_gbps),
                  _wrong(in_place.wrong)]
    return _join(cells, columns)


def _wrong(value: int | None) -> str:
    return "N/A" if value is None else str(value)


def section_footer(test: CaseResult) -> str:
    wrong = test.wrong
    verdict = "N/A" if wrong is None else (f"{wrong} OK" if wrong == 0 else f"{wrong} FAILED")
    return f"# {test.label}: wrong values {verdict}, avg busbw {_rate(test.avg_busbw_gbps)} GB/s"


def footer_lines(report: CollectivesReport) -> list[str]:
    wrong = report.wrong
    if wrong is None:
        verdict = "N/A (--check off)" if not report.settings.check else "N/A (no size completed)"
    else:
        verdict = f"{wrong} OK" if wrong == 0 else f"{wrong} FAILED"
    lines = ["#", *latency_lines(report), f"# Wrong values : {verdict}",
             f"# Avg bus bandwidth : {_rate(report.avg_busbw_gbps)} GB/s"]
    if len(report.processes) > 1:
        lines.extend(process_lines(report))
    return lines


def latency_lines(report: CollectivesReport) -> list[str]:
    """Each test's smallest size: the small-message latency, back to back and with the host's wait."""
    lines = []
    for test in report.tests:
        latency = test.small_message_latency
        if latency is None:
            continue
        in_place = latency.in_place_us
        lines.append(f"# Latency {test.label} at {format_bytes(latency.size_bytes)} : "
                     f"{_time(latency.out_of_place_us)} us out-of-place, "
                     f"{'-' if in_place is None else _time(in_place)} us in-place; "
                     f"{_time(latency.blocking_call_us)} us for one call waited for")
    return lines


def process_lines(report: CollectivesReport) -> list[str]:
    """Each process's own time, relative to the median of all processes at the same size."""
    threshold = report.settings.slow_threshold_percent
    ratios: dict[int, list[float]] = {p.process_id: [] for p in report.processes}
    flagged: dict[int, int] = {p.process_id: 0 for p in report.processes}
    for test in report.tests:
        for row in test.results:
            if not row.processes:
                continue
            median = statistics.median(p.time_us for p in row.processes)
            for timing in row.processes:
                ratios[timing.process_id].append(timing.time_us / median if median else 1.0)
                flagged[timing.process_id] += timing.slow
    lines = ["#", f"# Per-process time: each one's own mean per iteration vs the median at each size "
                  f"(SLOW: over by {threshold:g}%)",
             "#  process  host                  pid  devices           avg vs median    worst  slow sizes"]
    for process in report.processes:
        values = ratios[process.process_id]
        average = _percent(statistics.fmean(values) - 1) if values else "-"
        worst = _percent(max(values) - 1) if values else "-"
        sizes = f"{flagged[process.process_id]} of {len(values)}"
        mark = "  SLOW" if flagged[process.process_id] else ""
        lines.append(f"#  {process.process_id:>7}  {shorten(process.host, 20):<20} {process.pid:>5}  "
                     f"{shorten(id_ranges(process.device_ids), 16):<16}  {average:>13}  {worst:>7}  {sizes:>10}{mark}")
    slow = report.slow_processes()
    if slow:
        names = ", ".join(f"process {s.process_id} on {s.host} (pid {s.pid}, up to "
                          f"{(s.worst_ratio - 1) * 100:.0f}% over the median at {s.slow_sizes} "
                          f"size{'s' if s.slow_sizes != 1 else ''})" for s in slow)
        lines.append(f"# Slow processes : {names}")
    else:
        lines.append(f"# Slow processes : none (threshold {threshold:g}%)")
    return lines


def _percent(fraction: float) -> str:
    value = round(fraction * 100, 1)
    return f"{value + 0.0:+.1f}%"  # + 0.0 turns -0.0 into 0.0


def _kind(report: CollectivesReport) -> str:
    if report.device_kind.lower() == report.platform.lower():
        return report.platform
    return f"{report.platform}, {report.device_kind}"


def _time(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
