"""A job's own screen (Enter on a process): who it is, what it uses, what it compiled and how its steps go.

Everything comes from the same report as the main screen (the agent's entry
for the process) and from tpu-top's history of it; nothing is asked of the job
beyond what every refresh asks, except its arrays when `m` is pressed
(tpu_tools.top.arrays_view, read once in the background).
"""

from __future__ import annotations

import time

from tpu_tools.metrics.records.jobs import AgentEntry, EntryCompiles, EntrySteps
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.metrics.tpuhealth import attention
from tpu_tools.top.arrays_view import arrays_lines
from tpu_tools.top.cacheview import cache_section
from tpu_tools.top.drawing import (
    BAR_LOW,
    DIM,
    ERROR,
    NORMAL,
    TITLE,
    WARN,
    Column,
    Line,
    column_header,
    fit,
    graph_rows,
    layout,
    percent_text,
    seconds_text,
    sparkline,
    table_row,
)
from tpu_tools.top.goodput_panel import goodput_lines
from tpu_tools.top.history import History
from tpu_tools.top.jobpanel import job_life_lines
from tpu_tools.top.model import ProcessRow, ViewState, rows_from_report
from tpu_tools.top.stallview import stall_lines
from tpu_tools.units import MISSING, format_bytes, format_bytes_short, format_known, format_number

MAX_FUNCTIONS = 12
MAX_RECOMPILES = 6
HISTOGRAM_BINS = 8


def _wrap(text: str, width: int, indent: str) -> list[str]:
    out, line = [], ""
    for word in text.split(" "):
        while len(word) > width - len(indent):  # a word longer than the line is cut into pieces
            if line:
                out.append(line)
                line = ""
            out.append(indent + word[: width - len(indent)])
            word = word[width - len(indent):]
        candidate = (line + " " + word) if line else indent + word
        if len(candidate) > width and line:
            out.append(line)
            candidate = indent + word
        line = candidate
    if line:
        out.append(line)
    return out


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1)))))]


def histogram(values: list[float], bins: int) -> list[tuple[float, float, int]]:
    """(low, high, count) of `bins` equal ranges from the smallest to the largest value."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high <= low:
        return [(low, high, len(values))]
    step = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / step))] += 1
    return [(low + i * step, low + (i + 1) * step, counts[i]) for i in range(bins)]


def _graph_line(label: str, values: list[float | None], last: str, width: int, top: float | None,
                unicode: bool) -> Line:
    room = max(4, width - len(label) - len(last) - 4)
    return Line().add(f" {label} ", TITLE).add(sparkline(values, room, top, unicode).ljust(room), BAR_LOW) \
        .add(f" {last}")


def job_lines(report: MonitorReport, state: ViewState, history: History | None, width: int,
              height: int | None) -> list[Line]:
    row = next((r for r in rows_from_report(report) if r.key == state.job_key), None)
    if row is None:
        return [Line(), Line().add(f" process {state.job_key} is gone: it exited or no longer reports", ERROR),
                Line().add(" Esc goes back", DIM)]
    lines = [Line().add(f" {row.pid} {row.tag or ''}".rstrip(), TITLE).add(
        "" if row.has_agent else "   (no tpu-tools agent: what the system says of it)", DIM)]
    detail = row.agent or AgentEntry(pid=row.pid)
    lines += [Line().add(text) for text in _wrap(row.command or MISSING, width, " ")][:3]
    uptime = detail.uptime_s
    started = None if uptime is None else (report.time_unix_s or time.time()) - uptime
    facts = [f"user {row.user or MISSING}"]
    if started is not None:
        facts.append(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}")
    if row.host:
        facts.append(f"host {row.host}")
    if detail.platform:
        facts.append(f"platform {detail.platform}")
    if detail.jax_version:
        facts.append(f"jax {detail.jax_version}")
    elif detail.frontend:  # a frontend other than JAX (torch_xla)
        facts.append(f"{detail.frontend} {detail.frontend_version or MISSING}".rstrip())
    if not row.has_agent and row.chips is not None:
        facts.append(f"holds chips {', '.join(map(str, row.chips))}")
    lines.append(Line().add(" " + "  ".join(facts), DIM))
    cpu = history.job(row.key, "cpu_percent") if history else []
    rss = history.job(row.key, "rss_bytes") if history else []
    half = max(20, width // 2)
    first = _graph_line("CPU", cpu, f"{percent_text(row.cpu_percent)}%", half, 100.0, state.unicode)
    second = _graph_line("RSS", rss, format_bytes_short(row.rss_bytes), width - half, None, state.unicode)
    first.segments += second.segments
    lines.append(first)
    if not row.has_agent:
        return lines
    if row.error:
        return [*lines, Line().add(f" agent: {row.error}", ERROR)]
    steps = _steps_section(row, history, state, width)
    lines += steps[:2]  # the percentiles and the steps/s graph near the top: always in view
    lines += stall_lines(detail, width)
    lines += goodput_lines(detail, width)
    lines += job_life_lines(detail, report, width)
    lines += _device_section(detail, width)
    lines += arrays_lines(state.arrays.read(row.key), width)
    lines += _health_section(detail, width)
    lines += startup_lines(detail, width)
    lines += _compile_section(detail, width)
    lines += fallback_lines(detail, width)
    lines += cache_section(detail, width)
    room = None if height is None else height - len(lines) - 1
    if len(steps) > 2 and (room is None or room >= 4):
        histogram_lines = steps[2:] if room is None else steps[2:2 + room - 1]
        lines += [Line(), *histogram_lines]
    spare = 0 if height is None else height - len(lines)
    if spare >= 3 and history is not None:  # room to spare: the steps/s graph grows taller
        tall = _tall_graph("STEP/S", history.job(row.key, "steps_per_second"), format_number(row.steps_per_second),
                           width, min(6, spare + 1), state.unicode)
        index = next(i for i, line in enumerate(lines) if line.text.startswith(" STEP/S "))
        lines[index:index + 1] = tall
    return lines


MAX_FALLBACK_OPS = 6


def startup_lines(detail: AgentEntry, width: int) -> list[Line]:
    """The startup contract's findings (torch_xla: a setting made too late), each with its fix; none when kept."""
    findings = detail.startup or []
    if not findings:
        return []
    lines = [Line(), Line().add(" Startup contract", TITLE).add(f"  {len(findings)} broken", DIM)]
    for finding in findings[:6]:
        lines += [Line().add(text, ERROR) for text in _wrap(f"! {finding.message}", width, "  ")][:2]
        lines += [Line().add(text, DIM) for text in _wrap(f"fix: {finding.fix}", width, "    ")][:2]
    return lines



def fallback_lines(detail: AgentEntry, width: int) -> list[Line]:
    """The ops the frontend ran on the CPU (torch_xla's aten:: fallbacks), most frequent first; none for JAX."""
    fallbacks = detail.cpu_fallbacks
    if fallbacks is None:
        return []
    ops = fallbacks.ops or []
    title = Line().add(" CPU fallbacks", TITLE).add(
        f"  {fallbacks.total} calls of {len(ops)} op{'s' if len(ops) != 1 else ''} ran on the CPU"
        if ops else "  none: every op ran on the device", DIM)
    lines = [title]
    for entry in ops[:MAX_FALLBACK_OPS]:
        lines.append(Line().add(f"  {entry.count!s:>8}  {entry.op}"[:width], WARN))
    if len(ops) > MAX_FALLBACK_OPS:
        lines.append(Line().add(f"  ... {len(ops) - MAX_FALLBACK_OPS} more ops (tpu-monitor --json)", DIM))
    return lines


def _health_section(detail: AgentEntry, width: int) -> list[Line]:
    """libtpu's ICI link health and throttling as the job's agent read them: what needs a look, worst first."""
    health = detail.tpu_sdk.health if detail.tpu_sdk is not None else None
    if health is None or not (health.ici_links or health.throttle or health.problems):
        return []
    said = attention(health)
    title = Line().add(" TPU health", TITLE).add(f"  {len(health.ici_links)} ICI links, {len(health.throttle)} devices",
                                                 DIM)
    if not said:
        return [title.add("  all healthy, none throttled", DIM)]
    return [title, *(Line().add(f"  {text}"[:width], ERROR if " 10 of 10 " in text else WARN) for text in said[:6])]


def _tall_graph(label: str, values: list[float | None], last: str, width: int, rows: int,
                unicode: bool) -> list[Line]:
    known = [v for v in values if v is not None]
    scale = f"max {format_number(max(known))}" if known else ""
    room = max(4, width - len(label) - max(len(last), len(scale)) - 4)
    known = [v for v in values[-room:] if v is not None]
    scale = f"max {format_number(max(known))}" if known else ""
    out = []
    for index, text in enumerate(graph_rows(values, room, rows, None, unicode)):
        first, final = index == 0, index == rows - 1
        out.append(Line().add(f" {label} " if final else " " * (len(label) + 2), TITLE)
                   .add(text.ljust(room), BAR_LOW).add(f" {last}" if final else f" {scale}" if first else ""))
    return out


def _device_section(detail: AgentEntry, width: int) -> list[Line]:
    devices = detail.devices
    lines = [Line(), Line().add(" Devices", TITLE).add(
        f"  live arrays {detail.live_array_count if detail.live_array_count is not None else MISSING}"
        f" ({format_bytes(detail.live_array_bytes)})", DIM)]
    if not devices:
        return [*lines, Line().add("  none reported", DIM)]
    columns = layout([Column("id", "ID", 4, right=True), Column("kind", "KIND", 14, priority=4, flex_max=24),
                      Column("used", "MEMORY USED", 11, right=True, priority=1),
                      Column("peak", "PEAK", 10, right=True, priority=3),
                      Column("limit", "LIMIT", 10, right=True, priority=2),
                      Column("arrays", "ARRAYS", 10, right=True, priority=1),
                      Column("count", "#", 6, right=True, priority=5)], width)
    lines.append(column_header(columns))
    for device in devices[:8]:
        lines.append(table_row(columns, {
            "id": (str(device.id), NORMAL), "kind": (device.device_kind or MISSING, NORMAL),
            "used": (format_bytes(device.memory_used_bytes), NORMAL),
            "peak": (format_bytes(device.memory_peak_bytes), NORMAL),
            "limit": (format_bytes(device.memory_limit_bytes), NORMAL),
            "arrays": (format_bytes(device.live_array_bytes), NORMAL),
            "count": (str(device.live_array_count) if device.live_array_count is not None else MISSING, NORMAL)}))
    if len(devices) > 8:
        lines.append(Line().add(f"  ... {len(devices) - 8} more devices", DIM))
    return lines


def _compile_section(detail: AgentEntry, width: int) -> list[Line]:
    compiles = detail.compiles or EntryCompiles()
    functions = compiles.functions
    lines = [Line(), Line().add(" Compiles by function", TITLE).add(
        f"  {format_known(compiles.compile_count)} compiles, {format_known(compiles.recompile_count)} "
        f"recompiles, {seconds_text(compiles.compile_time_s)}", DIM)]
    if not functions:
        return [*lines, Line().add("  none yet", DIM)]
    columns = layout([Column("name", "FUNCTION", 12, priority=0, flex_max=32),
                      Column("count", "COMP", 5, right=True, priority=0),
                      Column("recompiles", "RECOMP", 6, right=True, priority=1),
                      Column("time", "TIME", 10, right=True, priority=2),
                      Column("hits", "CACHE HIT/MISS", 14, right=True, priority=4),
                      Column("reason", "LAST RECOMPILE REASON", 21, priority=3, flex_max=1000)], width)
    lines.append(column_header(columns))
    for function in functions[:MAX_FUNCTIONS]:
        reason = function.last_recompile_reason
        lines.append(table_row(columns, {
            "name": (str(function.name), NORMAL), "count": (str(function.compile_count), NORMAL),
            "recompiles": (str(function.recompile_count), WARN if function.recompile_count else NORMAL),
            "time": (seconds_text(function.compile_time_s), NORMAL),
            "hits": (f"{function.cache_hits}/{function.cache_misses}", NORMAL),
            "reason": (reason or ("-" if not function.recompile_count else "(no reason recorded)"),
                       NORMAL if reason else DIM)}))
    if len(functions) > MAX_FUNCTIONS:
        lines.append(Line().add(f"  ... {len(functions) - MAX_FUNCTIONS} more functions (tpu-monitor --json)", DIM))
    recompiles = compiles.recent_recompiles
    lines.append(Line().add(" Recent recompiles", TITLE).add("  none" if not recompiles else "", DIM))
    for event in reversed(recompiles[-MAX_RECOMPILES:]):
        when = time.strftime("%H:%M:%S", time.localtime(event.time_unix_s or 0))
        took = seconds_text(event.backend_compile_time_s)
        lines.append(Line().add(f"  {when} {event.function} ({took})")
                     .add(f": {event.reason}" if event.reason else "  (no reason recorded)",
                          NORMAL if event.reason else DIM))
    return lines


def _steps_section(row: ProcessRow, history: History | None, state: ViewState, width: int) -> list[Line]:
    """The steps line, the steps/s graph, then the histogram of sampled step times (as many bins as fit)."""
    steps = (row.agent.steps if row.agent is not None else None) or EntrySteps()
    sampled = [v for v in (history.job(row.key, "step_time_s") if history else []) if v is not None]
    lines = [Line().add(" STEPS ", TITLE).add(
        f"{format_known(steps.count)}  "
        f"{format_number(steps.steps_per_second)}/s  last {seconds_text(steps.last_step_time_s)}  "
        f"p50 {seconds_text(steps.p50_step_time_s)}  p90 {seconds_text(percentile(sampled, 0.9))} (sampled)  "
        f"p99 {seconds_text(steps.p99_step_time_s)}")]
    rates = history.job(row.key, "steps_per_second") if history else []
    lines.append(_graph_line("STEP/S", rates, format_number(row.steps_per_second), width, None, state.unicode))
    if sampled and max(sampled) == min(sampled):
        lines.append(Line().add(f" step time steady at {seconds_text(sampled[0])} over {len(sampled)} samples", DIM))
    elif len(sampled) >= 2:
        lines.append(Line().add(f" Step time histogram  {len(sampled)} samples, one a refresh", TITLE))
        buckets = histogram(sampled, HISTOGRAM_BINS)
        most = max(count for _, _, count in buckets) or 1
        bar_room = max(4, width - 36)
        for low, high, count in buckets:
            label = fit(f"{seconds_text(low)} - {seconds_text(high)}", 24, True)
            lines.append(Line().add(f" {label} ").add(("#" if not state.unicode else "\u2588")
                                                      * max(0, round(bar_room * count / most)), BAR_LOW)
                         .add(f" {count}"))
    return lines
