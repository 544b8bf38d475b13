"""tpu-diag's table (one row per test and device) and its summary lines: coverage and the verdict."""

from __future__ import annotations

from tpu_tools.diag.records import LEVEL_NAMES, STATUSES, DiagReport
from tpu_tools.render.table import Column, TableData
from tpu_tools.units import format_bytes

STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


def header_line(report: DiagReport) -> str:
    kind = f"{report.device_kind} x{len(report.device_ids)}" if report.device_ids else "no device"
    processes = f", {report.process_count} processes" if report.process_count > 1 else ""
    return (f"tpu-diag -r {report.level} ({LEVEL_NAMES.get(report.level, '?')})  {kind} "
            f"({report.platform or '?'}){processes}  host {report.host}")


def checks_table(report: DiagReport) -> TableData:
    table = TableData([Column("TEST", no_wrap=True), Column("TARGET", no_wrap=True), Column("STATUS", no_wrap=True),
                       Column("TIME", align="right", no_wrap=True, priority=1), Column("WHY", priority=2)])
    for check in report.checks:
        time_text = f"{check.duration_s:.2f} s" if check.duration_s else "-"
        table.add_row(check.test, check.target, check.status.upper(), time_text, check.why)
    return table


def coverage_lines(report: DiagReport) -> list[str]:
    coverage = report.coverage
    lines = []
    tested = [d for d in coverage.devices.values() if d.memory_tested_bytes]
    if tested:
        sizes = sorted({d.memory_tested_bytes for d in tested})
        shares = [d.memory_share for d in tested if d.memory_share is not None]
        share = f" ({min(shares) * 100:.1f} % of free memory)" if shares else ""
        size = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])} to {format_bytes(sizes[-1])}"
        lines.append(f"memory tested: {size} per device{share} on {len(tested)} devices")
    if coverage.links:
        shown = ", ".join(coverage.links[:16]) + (" ..." if len(coverage.links) > 16 else "")
        lines.append(f"links exercised: {len(coverage.links)} ({shown})")
    if coverage.dtypes:
        lines.append(f"dtypes: {', '.join(coverage.dtypes)}")
    return lines


def verdict_line(report: DiagReport) -> str:
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in STATUSES}
    parts = ", ".join(f"{counts[s]} {s}" for s in ("pass", "fail", "warn", "skip") if counts[s])
    state = " (interrupted: partial results)" if report.interrupted else ""
    return f"verdict: {report.status.upper()}{state}  {parts or 'no tests ran'}  in {report.elapsed_s:.1f} s"
