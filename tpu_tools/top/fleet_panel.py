"""tpu-top's Hosts panel, shown when the report is a fleet's (`--from-prometheus`): one line per host.

Hosts are listed with the slice's outliers first (the host furthest from the median duty cycle or step
time, the slow worker), then by name; a report that could not be refreshed says so in the title.
"""

from __future__ import annotations

from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.top.drawing import COLUMNS, DIM, ERROR, TITLE, Line, fit, percent_text, seconds_text
from tpu_tools.units import MISSING, format_bytes_short, format_number

OUTLIER_MARK = "<<"
_COLUMNS = (("HOST", 22, False), ("UP", 4, False), ("CHIPS", 5, True), ("UTIL%", 6, True), ("HBM USED", 8, True),
            ("HBM TOTAL", 9, True), ("JOBS", 4, True), ("STEP/S", 6, True), ("STEP p50", 9, True),
            ("GOODPUT", 7, True))


def fleet_lines(report: MonitorReport, width: int, max_rows: int | None) -> list[Line]:
    fleet = report.fleet
    if fleet is None:
        return []
    hosts = fleet.hosts
    title = Line().add(" Hosts", TITLE).add(f"  {len(hosts)} from {fleet.source}", DIM)
    if fleet.median_utilization_percent is not None:
        title.add(f"  median util {fleet.median_utilization_percent:.1f}%", DIM)
    if fleet.median_step_time_s is not None:
        title.add(f"  median step {seconds_text(fleet.median_step_time_s)}", DIM)
    if fleet.digest_outliers:  # tpu-diag: the fleet as the reference of each host's GEMM digests
        named = sorted({o.host for o in fleet.digest_outliers})
        title.add(f"  diag digest differs on {', '.join(named)}", ERROR)
    if fleet.global_metric_findings:
        title.add(f"  {fleet.global_metric_findings} global metrics differ between workers", ERROR)
    for silent in fleet.silent_clusters:  # many clusters writing to one store: one stopped
        title.add(f"  cluster {silent.cluster} silent for {silent.last_sample_age_s:.0f} s", ERROR)
    if fleet.stale:
        since = (fleet.stale_since or "")[11:19]  # HH:MM:SS of the ISO time (UTC)
        title.add(f"  STALE since {since} UTC: {fleet.error}", ERROR)
    elif fleet.error:
        title.add(f"  {fleet.error}", ERROR)
    lines = [title]
    if not hosts:
        return lines
    header = " " + " ".join(fit(name, size, right) for name, size, right in _COLUMNS) + " NOTE"
    lines.append(Line(fill=COLUMNS).add(header, COLUMNS))
    ordered = sorted(hosts, key=lambda h: (h.outlier is None, h.host))
    shown = ordered if max_rows is None or len(ordered) <= max_rows else ordered[: max(1, max_rows - 1)]
    for host in shown:
        cells = [host.host, "yes" if host.up else "DOWN", str(host.chips), percent_text(host.utilization_percent),
                 format_bytes_short(host.memory_used_bytes), format_bytes_short(host.memory_total_bytes),
                 str(host.jobs), format_number(host.steps_per_second), seconds_text(host.step_time_s),
                 percent_text(host.goodput_percent)]
        text = " " + " ".join(fit(cell, size, right) for cell, (_, size, right) in zip(cells, _COLUMNS, strict=True))
        line = Line().add(text + " ", ERROR if not host.up else "normal")
        if host.outlier:
            line.add(f"{OUTLIER_MARK} {host.outlier}", ERROR)
        else:
            line.add(MISSING if host.up else "exporter not scraped", DIM)
        lines.append(line)
    if len(shown) < len(ordered):
        lines.append(Line().add(f"  ... {len(ordered) - len(shown)} more hosts (tpu-monitor lists them all)", DIM))
    return lines
