"""Text views for `tpu-dump`: the run's report, the progress line, and `show`'s summary (the dump sits
above render, so its views live with its records).

Strings that come from a bundle (names, errors, commands) may come from a
hostile archive: they are shown with control characters escaped, so a member
name cannot move the cursor or recolour the terminal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from tpu_tools.dump.findings import AgentsSummary, DevicesSummary, FileSummary, SoftwareVersions, Summary
from tpu_tools.dump.libtpusummary import LibtpuSummary
from tpu_tools.dump.manifest import CollectorStatus, Manifest, RedactionCounts
from tpu_tools.render.table import Column, TableData
from tpu_tools.sanitize import safe_text
from tpu_tools.units import MISSING, format_bytes, format_percent

_STATUS_WORDS = {"ok": "ok", "failed": "FAILED", "timed_out": "TIMED OUT", "skipped": "skipped"}


def printable(value: Any, keep_newlines: bool = False) -> str:
    """Text with control and invisible format characters shown as escapes (newlines and tabs kept on request)."""
    return safe_text(value, multiline=keep_newlines)


def status_counts(collectors: Sequence[CollectorStatus]) -> str:
    counts = Counter(c.status for c in collectors)
    parts = [f"{counts.get(s, 0)} {w.lower()}" for s, w in _STATUS_WORDS.items() if counts.get(s)]
    return ", ".join(parts) or "none"


def progress_text(done: int, total: int, running: list[tuple[str, float]]) -> str:
    slowest = sorted(running, key=lambda item: -item[1])[:3]
    waiting = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in slowest)
    more = f" and {len(running) - 3} more" if len(running) > 3 else ""
    return f"collecting: {done}/{total} done; waiting for {waiting}{more}"


def collector_table(collectors: Sequence[CollectorStatus], only_problems: bool = False) -> TableData:
    table = TableData([Column("COLLECTOR"), Column("STATUS"), Column("TIME", align="right"),
                       Column("DETAIL", max_width=70)])
    for entry in collectors:
        if only_problems and entry.status == "ok":
            continue
        duration, status = entry.duration_s, entry.status
        table.add_row(printable(entry.name), _STATUS_WORDS.get(str(status), printable(status)),
                      MISSING if duration is None else f"{duration:.1f} s", printable(entry.error or ""))
    return table


def report_lines(manifest: Manifest, path: str, size_bytes: int) -> list[str]:
    """What `tpu-dump` prints after writing a bundle."""
    redaction = manifest.redaction or RedactionCounts()
    files = manifest.files or []
    lines = [f"wrote {path} ({format_bytes(size_bytes)}, {len(files)} files) in {manifest.duration_s or 0:.1f} s",
             f"collectors: {status_counts(manifest.collectors or [])}"]
    if redaction.enabled:
        redacted_files = sum(1 for f in files if f.redactions)
        lines.append(f"redaction: {redaction.redacted_total or 0} values redacted in {redacted_files} files")
    else:
        lines.append("redaction: OFF (--no-redact); review the bundle before you share it")
    lines += [f"note: {note}" for note in manifest.notes or []]
    return lines


def _devices_line(devices: DevicesSummary) -> str:
    parts = []
    if devices.device_count:
        kinds = ", ".join(f"{count} x {printable(kind)}" for kind, count in devices.device_kinds.items())
        parts.append(f"{kinds} on the {printable(devices.platform)} platform")
        if devices.probe_passed or devices.probe_failed:
            parts.append(f"probe {devices.probe_passed} passed, {devices.probe_failed} failed")
    elif devices.runtime_status == "held":
        parts.append("runtime not opened (a TPU is held)")
    elif devices.runtime_status:
        parts.append(f"runtime {printable(devices.runtime_status)}")
    else:
        parts.append("no runtime listing")
    chips = ", ".join(f"{count} x {printable(name)}" for name, count in devices.chips.items())
    parts.append(f"chips: {chips or 'none found'}")
    holders = ", ".join(f"{h.pid} ({printable((h.command or '?').split(' ')[0])})" for h in devices.holders)
    if holders:
        parts.append(f"held by {holders}")
    return "; ".join(parts)


def _versions_line(versions: SoftwareVersions) -> str:
    parts = [f"{name} {printable(version or MISSING)}"
             for name, version in (("jax", versions.jax), ("jaxlib", versions.jaxlib), ("libtpu", versions.libtpu))]
    parts += [f"{printable(name)} {printable(version)}" for name, version in versions.plugins.items()]
    if versions.python:
        parts.append(f"python {printable(versions.python)}")
    agree = versions.agree
    tail = "" if agree is None else ("; they agree" if agree else "; they DO NOT agree")
    return ", ".join(parts) + tail


def _libtpu_line(libtpu: LibtpuSummary) -> str:
    parts = []
    answered = any(not service.error for service in libtpu.services)
    for service in libtpu.services:
        address = printable(service.address)
        if answered and "connection refused" in (service.error or ""):
            continue  # nothing listens there, and another address answered: not worth a word
        if service.error:
            parts.append(f"{address}: {printable(service.error)}")
            continue
        figures = [f"{service.device_count} devices"]
        if service.duty_cycle_percent is not None:
            figures.append(f"duty cycle {format_percent(service.duty_cycle_percent)}")
        if service.hbm_total_bytes is not None:
            figures.append(f"HBM {format_bytes(service.hbm_used_bytes)} / {format_bytes(service.hbm_total_bytes)}")
        parts.append(f"{address}: {', '.join(figures)}")
    if libtpu.core_count:
        parts.append(f"runtime status: {libtpu.core_count} cores, {len(libtpu.cores_in_error)} in error")
    return "; ".join(parts) or "no service figures"


def _agents_line(agents: AgentsSummary) -> str:
    parts = []
    for agent in agents.agents:
        if agent.error:
            parts.append(f"{agent.pid} ({printable(agent.tag or '?')}, error)")
            continue
        compiles = agent.compile_count if agent.compile_count is not None else MISSING
        recompiles = agent.recompile_count if agent.recompile_count is not None else MISSING
        parts.append(f"{agent.pid} ({printable(agent.tag or '-')}, {printable(agent.platform)}, {compiles} compiles, "
                     f"{recompiles} recompiles)")
    if agents.ignored_sockets:
        parts.append(f"{agents.ignored_sockets} sockets ignored")
    return ", ".join(parts) or "none answered"


def summary_header(summary: Summary) -> list[str]:
    bundle, redaction, duration = summary.bundle, summary.redaction, summary.duration_s
    redacted = f"on, {redaction.redacted_total or 0} values redacted" if redaction.enabled else "OFF (--no-redact)"
    return [
        f"bundle     {printable(bundle.path)} ({format_bytes(bundle.size_bytes)}, {bundle.member_count} members)",
        f"host       {printable(summary.host)}, written {printable(summary.time)} by tpu-tools "
        f"{printable(summary.tool_version)}" + (f" in {duration:.1f} s" if duration is not None else ""),
        f"devices    {_devices_line(summary.devices)}",
        f"versions   {_versions_line(summary.versions)}",
        *([f"libtpu     {_libtpu_line(summary.libtpu)}"] if summary.libtpu else []),
        *([f"agents     {_agents_line(summary.agents)}"] if summary.agents else []),
        f"redaction  {redacted}",
        f"collectors {status_counts(summary.collectors)}",
    ]


def files_table(files: list[FileSummary]) -> TableData:
    table = TableData([Column("FILE"), Column("SIZE", align="right"), Column("COLLECTOR"), Column("NOTE")])
    for entry in files:
        notes = []
        if entry.redactions:
            notes.append(f"{entry.redactions} redacted")
        if entry.trimmed_from_bytes:
            notes.append(f"trimmed from {format_bytes(entry.trimmed_from_bytes)}")
        table.add_row(printable(entry.name), format_bytes(entry.size_bytes), printable(entry.collector or MISSING),
                      ", ".join(notes))
    return table
