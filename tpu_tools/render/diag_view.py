"""tpu-diag's table (one row per test and device) and its summary lines: coverage and the verdict."""

from __future__ import annotations

from tpu_tools.diag.records import LEVEL_NAMES, STATUSES, DiagReport
from tpu_tools.diag.telemetry import SustainedTelemetry
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
    repeated = any(c.iteration for c in report.checks)
    for check in report.checks:
        time_text = f"{check.duration_s:.2f} s" if check.duration_s else "-"
        test = f"{check.test} #{check.iteration + 1}" if repeated else check.test
        table.add_row(test, check.target, check.status.upper(), time_text, check.why)
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


def sensor_lines(report: DiagReport) -> list[str]:
    """What the device's sensors reached during sustained load, per GPU, as dcgmi diag reports it."""
    lines = []
    for check in [c for c in report.checks if c.test == "sustained"]:
        telemetry = SustainedTelemetry.of(check.figures)
        for index, peaks in sorted(telemetry.sensors.items()):
            parts = []
            if peaks.temperature_peak_celsius is not None:
                parts.append(f"peak {peaks.temperature_peak_celsius:.0f} C")
            if peaks.power_peak_watts is not None:
                parts.append(f"peak {peaks.power_peak_watts:.1f} W")
            if peaks.clock_sm_lowest_hz is not None:
                parts.append(f"lowest SM clock {peaks.clock_sm_lowest_hz / 1e6:.0f} MHz")
            throttled = peaks.throttle_seconds
            parts.append("throttled: " + ", ".join(f"{reason} {seconds:.1f} s" for reason, seconds in
                                                   sorted(throttled.items())) if throttled else "not throttled")
            lines.append(f"sensors GPU {index} ({telemetry.telemetry_source}): {', '.join(parts)}")
        if telemetry.telemetry_source == "libtpu.sdk":
            parts = [f"{metric} worst {found.score:g} of 10 on {found.where}"
                     for metric, found in sorted(telemetry.tpu_worst.items())]
            lines.append(f"sensors (libtpu.sdk): {'; '.join(parts) or 'every throttle and link score 0'}")
        if telemetry.telemetry_error and not telemetry.sensors:
            lines.append(f"sensors: {telemetry.telemetry_error}")
    return lines


def verdict_line(report: DiagReport) -> str:
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in STATUSES}
    parts = ", ".join(f"{counts[s]} {s}" for s in ("pass", "fail", "warn", "skip") if counts[s])
    state = " (partial results: the tests after these did not run)" if report.interrupted else ""
    return f"verdict: {report.status.upper()}{state}  {parts or 'no tests ran'}  in {report.elapsed_s:.1f} s"
