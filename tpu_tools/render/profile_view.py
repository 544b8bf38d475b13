"""The profile report, rendered from a `tpu-tools/profile/v1` document.

`report_blocks` returns headings, sentences and tables; the CLI prints them (rich
tables on a terminal) and `report_text` lays them out as plain text for report.txt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tools.render.table import Column, TableData, plain_table
from tpu_tools.units import MISSING, format_duration_us, format_percent

if TYPE_CHECKING:
    from tpu_tools.profile.document import ProfileSummary, WindowRecord

Block = str | TableData


def _seconds(value: float | None) -> str:
    if value is None:
        return MISSING
    return format_duration_us(value * 1e6)


def _count(value: int | None) -> str:
    return MISSING if value is None else str(value)


def header_lines(doc: ProfileSummary) -> list[str]:
    lines = []
    program = doc.program
    if program:
        status = (f"exit {program.exit_code}" if program.status == "exited" else
                  f"raised {program.error}" if program.status == "raised" else program.status)
        argv = program.argv
        head = ("-m " + argv[0]) if program.module else argv[0]
        lines.append(f"program: {' '.join([head, *argv[1:]])}  ({status}, {_seconds(program.wall_time_s)})")
    trace = doc.trace
    window = doc.window
    if trace:
        span = format_duration_us(trace.duration_us)
        what = f" ({_window_text(window)})" if window else ""
        devices = ", ".join(d.device for d in doc.devices or []) or "none"
        lines.append(f"trace: {span}{what}, {len(trace.hosts)} host(s), devices: {devices}")
    elif window:
        lines.append(f"trace: none ({_window_text(window)} was never traced)")
    return lines


def _window_text(window: WindowRecord) -> str:
    if window.mode == "time":
        opened, closed = window.opened_at_s, window.closed_at_s
        if opened is not None and closed is not None:
            return f"window {opened:.1f} s to {closed:.1f} s of the run"
        return f"window from {window.delay_s:g} s"
    if window.mode == "steps":
        return f"steps {window.first_step} to {window.last_step}"
    return "the whole run"


def device_table(doc: ProfileSummary) -> TableData | None:
    if not doc.devices:
        return None
    table = TableData([Column("DEVICE"), Column("OPS", "right"), Column("BUSY", "right"), Column("IDLE", "right"),
                       Column("BUSY %", "right")], title="Devices: busy and idle over the trace")
    for d in doc.devices:
        table.add_row(d.device, d.op_count, format_duration_us(d.busy_us), format_duration_us(d.idle_us),
                      format_percent(d.busy_percent))
    return table


def top_ops_table(doc: ProfileSummary) -> TableData | None:
    if not doc.top_ops:
        return None
    total = format_duration_us(doc.device_time_us)
    table = TableData([Column("OP", max_width=48), Column("PROGRAM", max_width=32), Column("COUNT", "right"),
                       Column("TOTAL", "right"), Column("MEAN", "right"), Column("% DEVICE", "right")],
                      title=f"Top ops by device time (all devices: {total})")
    for op in doc.top_ops:
        table.add_row(op.name, op.module or MISSING, op.count, format_duration_us(op.total_us),
                      format_duration_us(op.mean_us), format_percent(op.percent_of_device_time))
    return table


def dispatch_line(doc: ProfileSummary) -> str | None:
    host = doc.host_dispatch
    if not host:
        return None
    if not host.dispatches:
        return "Host dispatch: no calls into jitted code in the trace"
    steady = host.dispatches - host.compiling_dispatches
    text = (f"Host dispatch: {host.dispatches} calls into jitted code; {steady} ran compiled code and spent "
            f"{format_duration_us(host.dispatch_time_us)} on the host "
            f"(mean {format_duration_us(host.mean_dispatch_us)} a call)")
    if host.compiling_dispatches:
        text += (f"; {host.compiling_dispatches} compiled first, "
                 f"{format_duration_us(host.compiling_dispatch_time_us)}")
    return text


def compile_table(doc: ProfileSummary) -> TableData | None:
    rows = doc.compiles
    if not rows:
        return None
    torch_xla = doc.compile_source == "torch_xla"
    monitored = doc.compile_source == "monitoring" or torch_xla
    persistent = any(row.persistent_cache_hits for row in rows)
    # Compile events cover the whole run; calls come from the trace, which may be a window of it.
    partial = monitored and doc.window is not None and doc.window.mode in ("time", "steps")
    calls_heading = "CALLS IN TRACE" if partial else "CALLS"
    columns = [Column("FUNCTION", max_width=40), Column("DEFINED AT", max_width=40), Column("COMPILES", "right"),
               Column("COMPILE TIME", "right"), Column(calls_heading, "right"), Column("CACHE HITS", "right")]
    if persistent:
        columns.append(Column("FROM DISK CACHE", "right"))
    if monitored:
        scope = "; over the whole run" if partial else ""
        title = (f"Compilation (torch_xla's CompileTime{scope}; each graph's XLA compile, at the line that called "
                 "torch_xla.sync)" if torch_xla else f"Compilation (jax.monitoring{scope}; compile time = trace + "
                 "lower + XLA)")
    else:
        title = "Compilation (from the trace; lowering + XLA compile)"
    table = TableData(columns, title=title)
    for row in rows:
        cells = [row.function, row.defined_at or MISSING, _count(row.compiles), _seconds(row.compile_time_s),
                 _count(row.calls), _count(row.cache_hits)]
        if persistent:
            cells.append(_count(row.persistent_cache_hits))
        table.add_row(*cells)
    return table


def recompile_table(doc: ProfileSummary) -> TableData | None:
    if not doc.recompilations:
        return None
    table = TableData([Column("FUNCTION", max_width=40), Column("RECOMPILES", "right"), Column("TIMES", "right"),
                       Column("REASON (as JAX states it)", max_width=70), Column("CALLED AT", max_width=40)],
                      title="Recompilations, grouped by function and where it is defined")
    for group in doc.recompilations:
        name = group.function + (f" ({group.defined_at})" if group.defined_at else "")
        for index, reason in enumerate(group.reasons):
            table.add_row(name if index == 0 else "", group.recompiles if index == 0 else "", reason.count,
                          reason.reason, ", ".join(reason.call_sites) or MISSING)
    return table


def eager_blocks(doc: ProfileSummary) -> list[Block]:
    eager = doc.eager
    if not eager or not eager.dispatches:
        return ["Op-by-op dispatch: none (every call went into jitted code)"] if eager else []
    blocks: list[Block] = [f"Op-by-op (eager) dispatch: {eager.dispatches} JAX operations called one at a time "
                           f"outside jit, {format_duration_us(eager.host_time_us)} on the host"]
    ops = TableData([Column("OP"), Column("DISPATCHES", "right"), Column("HOST TIME", "right")],
                    title="Eager ops")
    for op in eager.ops:
        ops.add_row(op.name, op.count, format_duration_us(op.host_time_us))
    blocks.append(ops)
    sites = TableData([Column("CALLED FROM (function, file:line where defined)", max_width=60),
                       Column("DISPATCHES", "right"), Column("OPS", max_width=50)],
                      title="Top call sites: candidates for jax.jit")
    for site in eager.call_sites:
        ops_text = ", ".join(f"{name} x{count}" for name, count in list(site.ops.items())[:6])
        sites.add_row(site.call_site, site.dispatches, ops_text)
    blocks.append(sites)
    return blocks


def report_blocks(doc: ProfileSummary) -> list[Block]:
    header = header_lines(doc)
    blocks: list[Block] = ["\n".join(header)] if header else []
    for block in (device_table(doc), top_ops_table(doc), dispatch_line(doc), compile_table(doc),
                  recompile_table(doc)):
        if block is not None:
            blocks.append(block)
    if doc.compiles == [] and doc.compile_source:
        blocks.append("Compilation: nothing was compiled during the trace")
    blocks += eager_blocks(doc)
    blocks += [f"note: {note}" for note in doc.notes or []]
    return blocks


def report_text(doc: ProfileSummary) -> str:
    parts = []
    for block in report_blocks(doc):
        parts.append(plain_table(block) if isinstance(block, TableData) else block)
    return "\n\n".join(parts) + "\n"
