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
    hosts = fleet.get("hosts") or []
    title = Line().add(" Hosts", TITLE).add(f"  {len(hosts)} from {fleet.get('source')}", DIM)
    median = fleet.get("median_utilization_percent")
    if median is not None:
        title.add(f"  median util {median:.1f}%", DIM)
    if fleet.get("median_step_time_s") is not None:
        title.add(f"  median step {seconds_text(fleet['median_step_time_s'])}", DIM)
    if fleet.get("digest_outliers"):  # tpu-diag: the fleet as the reference of each host's GEMM digests
        named = sorted({o.get("host") for o in fleet["digest_outliers"]})
        title.add(f"  diag digest differs on {', '.join(map(str, named))}", ERROR)
    if fleet.get("global_metric_findings"):
        title.add(f"  {fleet['global_metric_findings']} global metrics differ between workers", ERROR)
    for silent in fleet.get("silent_clusters") or []:  # many clusters writing to one store: one stopped
        title.add(f"  cluster {silent.get('cluster')} silent for {silent.get('last_sample_age_s'):.0f} s", ERROR)
    if fleet.get("stale"):
        since = str(fleet.get("stale_since") or "")[11:19]  # HH:MM:SS of the ISO time (UTC)
        title.add(f"  STALE since {since} UTC: {fleet.get('error')}", ERROR)
    elif fleet.get("error"):
        title.add(f"  {fleet['error']}", ERROR)
    lines = [title]
    if not hosts:
        return lines
    header = " " + " ".join(fit(name, size, right) for name, size, right in _COLUMNS) + " NOTE"
    lines.append(Line(fill=COLUMNS).add(header, COLUMNS))
    ordered = sorted(hosts, key=lambda h: (h.get("outlier") is None, h.get("host") or ""))
    shown = ordered if max_rows is None or len(ordered) <= max_rows else ordered[: max(1, max_rows - 1)]
    for host in shown:
        cells = [str(host.get("host")), "yes" if host.get("up") else "DOWN", str(host.get("chips", 0)),
                 percent_text(host.get("utilization_percent")), format_bytes_short(host.get("memory_used_bytes")),
                 format_bytes_short(host.get("memory_total_bytes")), str(host.get("jobs", 0)),
                 format_number(host.get("steps_per_second")), seconds_text(host.get("step_time_s")),
                 percent_text(host.get("goodput_percent"))]
        text = " " + " ".join(fit(cell, size, right) for cell, (_, size, right) in zip(cells, _COLUMNS, strict=True))
        line = Line().add(text + " ", ERROR if not host.get("up") else "normal")
        if host.get("outlier"):
            line.add(f"{OUTLIER_MARK} {host['outlier']}", ERROR)
        else:
            line.add(MISSING if host.get("up") else "exporter not scraped", DIM)
        lines.append(line)
    if len(shown) < len(ordered):
        lines.append(Line().add(f"  ... {len(ordered) - len(shown)} more hosts (tpu-monitor lists them all)", DIM))
    return lines
