"""One tpu-top frame: lines of styled segments, cut to the terminal's width and height.

The same function draws the live view (curses paints the segments with their
styles) and `tpu-top --once` (the text alone), so what a script captures is
what a user sees. Nothing here touches the terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.libtpu.names import FIELD_METRICS
from tpu_tools.metrics.libtpu.records import NOT_SERVED
from tpu_tools.units import MISSING, format_bytes
from tpu_tools.top.model import SORT_COLUMNS, ProcessRow, ViewState, rows_from_report

# Styles the screen maps to colours and attributes.
NORMAL, TITLE, HEADER, COLUMNS, SORTED, SELECTED, BAR_LOW, BAR_MID, BAR_HIGH, DIM, ERROR = (
    "normal", "title", "header", "columns", "sorted", "selected", "bar_low", "bar_mid", "bar_high", "dim", "error")

HELP_LINES = (
    "tpu-top keys",
    "",
    "  q            quit",
    "  up/down j/k  select a process",
    "  PgUp/PgDn    move the selection by 10",
    "  s / S        sort by the next / previous column",
    "  r            reverse the sort order",
    "  p            pause / resume refreshing",
    "  h or ?       this help (any key closes it)",
)
_MIN_COMMAND = 8
NOT_SERVED_CELL = "n/s"  # the device panel's short form of NOT_SERVED


@dataclass
class Segment:
    text: str
    style: str = NORMAL


@dataclass
class Line:
    segments: list[Segment] = field(default_factory=list)
    fill: str | None = None  # a style painted to the end of the line (header bars, selection)

    def add(self, text: str, style: str = NORMAL) -> Line:
        self.segments.append(Segment(_printable(text), style))
        return self

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    def cut(self, width: int) -> Line:
        out, used = Line(fill=self.fill), 0
        for segment in self.segments:
            if used >= width:
                break
            piece = segment.text[: width - used]
            out.segments.append(Segment(piece, segment.style))
            used += len(piece)
        return out


def _printable(text: str) -> str:
    # One terminal cell per character: control and wide characters would break the layout.
    return "".join(c if c.isprintable() and ord(c) < 0x1100 else "?" for c in text)


def _fit(text: str, width: int, right: bool = False) -> str:
    if len(text) > width:
        text = text[: max(0, width - 1)] + "~" if width > 1 else text[:width]
    return text.rjust(width) if right else text.ljust(width)


def _bar(fraction: float | None, width: int) -> list[Segment]:
    """`[|||||     ]`, coloured by how full it is; an unknown fraction is an empty bar."""
    inner = max(1, width - 2)
    if fraction is None:
        return [Segment("[" + " " * inner + "]", DIM)]
    fraction = max(0.0, min(1.0, fraction))
    filled = int(round(fraction * inner))
    style = BAR_HIGH if fraction >= 0.9 else BAR_MID if fraction >= 0.7 else BAR_LOW
    return [Segment("["), Segment("|" * filled, style), Segment(" " * (inner - filled) + "]")]


def _short_bytes(value: int | None) -> str:
    """Bytes in at most 7 characters: 512B, 16.0K, 220.7M, 23.6G (powers of 1024)."""
    if value is None:
        return MISSING
    size = float(value)
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            return f"{int(size)}B" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return MISSING


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def _rate(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return MISSING
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def _short_command(command: str | None) -> str:
    if not command:
        return MISSING
    words = command.split()
    words[0] = words[0].rsplit("/", 1)[-1]
    return " ".join(words)


# --- panels ----------------------------------------------------------------------------------------------

def header_line(report: dict[str, Any], state: ViewState, width: int, interactive: bool) -> Line:
    devices = (report.get("devices") or {}).get("devices") or []
    platforms = sorted({d.get("platform") for d in devices if d.get("platform")})
    clock = time.strftime("%H:%M:%S", time.localtime(report.get("time_unix_s") or time.time()))
    left = (f" tpu-top  host {report.get('hostname', '?')}  platform {','.join(platforms) or 'none'}  "
            f"{clock}  refresh {state.interval_s:g}s")
    right = ("PAUSED " if state.paused else "") + ("h help " if interactive else "")
    gap = max(1, width - len(left) - len(right))
    return Line(fill=HEADER).add(left + " " * gap + right, HEADER)


def host_lines(report: dict[str, Any], width: int) -> list[Line]:
    host = report.get("host")
    if host is None:
        return []
    if host.get("error"):
        return [Line().add(" host: ", TITLE).add(host["error"], ERROR)]
    cpu, used, total = host.get("cpu_percent"), host.get("memory_used_bytes"), host.get("memory_total_bytes")
    cpu_text = f" {_percent(cpu)}%"
    memory_text = f" {format_bytes(used)} / {format_bytes(total)}"
    bar_width = max(6, (width - 6 - len(cpu_text) - 6 - len(memory_text) - 4) // 2)
    first = Line().add(" CPU ", TITLE)
    first.segments += _bar(None if cpu is None else cpu / 100, bar_width)
    first.add(cpu_text + "   ").add("MEM ", TITLE)
    first.segments += _bar(used / total if used is not None and total else None, bar_width)
    first.add(memory_text)
    loads = [host.get(f"load_average_{w}") for w in ("1m", "5m", "15m")]
    load_text = " ".join(MISSING if v is None else f"{v:.2f}" for v in loads)
    agents = (report.get("processes") or {}).get("agents")
    second = Line().add(" LOAD ", TITLE).add(load_text)
    second.add("   CPUS ", TITLE).add(str(host.get("cpu_count") or MISSING))
    second.add("   SWAP ", TITLE).add(f"{format_bytes(host.get('swap_used_bytes'))} / "
                                      f"{format_bytes(host.get('swap_total_bytes'))}")
    if agents is not None:
        second.add("   AGENTS ", TITLE).add(str(len(agents)))
    return [first, second]


def _holders_text(device: dict[str, Any], gpu_processes: dict[str, list[dict[str, Any]]]) -> str:
    names = [_gpu_figures(device.get("extra") or {})] if "nvml" in (device.get("sources") or []) else []
    for process in device.get("processes") or []:
        names.append(f"{process['pid']} {process.get('tag') or ''}".strip())
    seen = {p["pid"] for p in device.get("processes") or []}
    for process in gpu_processes.get(str(device.get("key")), []):  # NVML's list: every process on the GPU
        if process["pid"] not in seen:
            seen.add(process["pid"])
            label = process.get("tag") or _short_command(process.get("command")).split(" ")[0]
            names.append(f"{process['pid']} {label}".strip())
    for holder in device.get("holders") or []:
        if holder["pid"] not in seen:
            names.append(f"{holder['pid']} {_short_command(holder.get('command')).split(' ')[0]}")
    return ", ".join(names) or MISSING


def _gpu_figures(extra: dict[str, Any]) -> str:
    """A GPU's temperature and power (from NVML), before its processes."""
    if extra.get("nvml_status") not in (None, "ok"):
        return str(extra["nvml_status"]).replace("_", " ").upper()
    temperature, power = extra.get("temperature_celsius"), extra.get("power_draw_watts")
    return (f"{temperature:.0f}C" if temperature is not None else MISSING) + " " + \
        (f"{power:.0f}W" if power is not None else MISSING)


def _libtpu_not_served(report: dict[str, Any]) -> set[str]:
    """Device figures ("duty_cycle_percent", "hbm_used_bytes") that an answering libtpu service does not serve."""
    answered = [s for s in ((report.get("libtpu") or {}).get("services") or []) if not s.get("error")]
    return {figure for figure in ("duty_cycle_percent", "hbm_used_bytes")
            if any(FIELD_METRICS[figure] in (s.get("not_served_metrics") or []) for s in answered)}


def _libtpu_status(report: dict[str, Any], not_served: set[str]) -> Segment | None:
    """One phrase about libtpu's metrics services: which answered and what they do not serve, or why none did."""
    group = report.get("libtpu")
    if group is None:
        return None
    services = group.get("services") or []
    answered = [s["address"] for s in services if not s.get("error")]
    if answered:
        missing = [label for figure, label in (("duty_cycle_percent", "duty cycle"), ("hbm_used_bytes", "HBM use"))
                   if figure in not_served]
        text = f"libtpu {', '.join(answered)}" + (f"; {' and '.join(missing)} {NOT_SERVED} ({NOT_SERVED_CELL})"
                                                  if missing else "")
        return Segment(text, DIM)
    errors = [s.get("error") or "" for s in services]
    if services and all("connection refused" in e for e in errors):
        return Segment(f"libtpu: no metrics service ({', '.join(s['address'] for s in services)})", DIM)
    informative = [e for e in errors if "connection refused" not in e]
    return Segment(f"libtpu: {informative[0] if informative else group.get('error') or 'no metrics service'}",
                   ERROR)


def device_lines(report: dict[str, Any], width: int, max_rows: int | None) -> list[Line]:
    group = report.get("devices")
    if group is None:
        return []
    not_served = _libtpu_not_served(report)
    title = Line().add(" Devices", TITLE)
    status = _libtpu_status(report, not_served)
    if status is not None:
        title.add("  ").add(status.text, status.style)
    lines = [title]
    if group.get("error"):
        return [*lines, Line().add(f"  {group['error']}", ERROR)]
    devices = group.get("devices") or []
    if not devices:
        return [*lines, Line().add("  no accelerator found, and no agent reports a device", DIM)]
    gpu_processes = {str(gpu.get("device_key")): gpu.get("processes") or []
                     for gpu in (report.get("nvml") or {}).get("gpus") or [] if gpu.get("device_key")}
    key_width = max(6, min(16, max(len(str(d.get("key"))) for d in devices)))
    name_width = 12
    memory_width = 21
    util_width = 5
    rest = width - (1 + key_width + 1 + name_width + 1 + memory_width + 1 + util_width + 1)
    bar_width = max(6, min(30, rest // 2))
    holders_width = max(6, rest - bar_width - 1)
    lines.append(Line(fill=COLUMNS).add(
        " " + _fit("DEVICE", key_width) + " " + _fit("NAME", name_width) + " " + _fit("MEMORY", bar_width) + " "
        + _fit("USED / TOTAL", memory_width, True) + " " + _fit("UTIL%", util_width, True) + " "
        + _fit("PROCESSES", holders_width), COLUMNS))
    shown = devices if max_rows is None or len(devices) <= max_rows else devices[: max(1, max_rows - 1)]
    for device in shown:
        used = device.get("memory_used_bytes")
        if used is None:
            used = device.get("live_array_bytes")
        total = device.get("memory_total_bytes")
        utilization = device.get("utilization_percent")
        from_libtpu = "libtpu" in (device.get("sources") or [])
        used_text = NOT_SERVED_CELL if used is None and from_libtpu and "hbm_used_bytes" in not_served \
            else format_bytes(used)
        util_text = NOT_SERVED_CELL if utilization is None and from_libtpu and "duty_cycle_percent" in not_served \
            else _percent(utilization)
        line = Line().add(" " + _fit(str(device.get("key")), key_width) + " "
                          + _fit(str((device.get("extra") or {}).get("gpu_name") or device.get("name") or MISSING),
                                 name_width) + " ")
        line.segments += _bar(used / total if used is not None and total else None, bar_width)
        line.add(" " + _fit(f"{used_text} / {format_bytes(total)}", memory_width, True) + " "
                 + _fit(util_text, util_width, True) + " "
                 + _fit(_holders_text(device, gpu_processes), holders_width))
        lines.append(line)
    if len(shown) < len(devices):
        lines.append(Line().add(f"  ... {len(devices) - len(shown)} more devices (tpu-monitor lists them all)",
                                DIM))
    return lines


_PROCESS_COLUMNS = (  # header, width, right-aligned; fits 80 columns with room for the command
    ("PID", 7, True), ("USER", 8, False), ("TAG", 10, False), ("CPU%", 5, True), ("RSS", 7, True),
    ("DEV MEM", 7, True), ("COMP", 5, True), ("RECOMP", 6, True), ("STEP/S", 6, True),
)


def _process_cells(row: ProcessRow) -> list[str]:
    agent = row.has_agent and row.error is None
    return [
        str(row.pid),
        row.user or MISSING,
        row.tag or MISSING,
        _percent(row.cpu_percent),
        _short_bytes(row.rss_bytes),
        _short_bytes(row.device_memory_bytes) if agent or row.device_memory_bytes is not None else MISSING,
        str(row.compiles) if agent and row.compiles is not None else MISSING,
        str(row.recompiles) if agent and row.recompiles is not None else MISSING,
        _rate(row.steps_per_second) if agent else MISSING,
    ]


def process_lines(report: dict[str, Any], state: ViewState, width: int, max_rows: int | None,
                  interactive: bool) -> tuple[list[Line], ProcessRow | None]:
    group = report.get("processes")
    if group is None:
        return [], None
    direction = "^" if state.sort.descending == state.reversed else "v"
    lines = [Line().add(" Processes", TITLE).add(f"  sorted by {state.sort.header} {direction}", DIM)]
    if group.get("error"):
        return [*lines, Line().add(f"  {group['error']}", ERROR)], None
    header = Line(fill=COLUMNS).add(" ", COLUMNS)
    for (title, size, right), column in zip(_PROCESS_COLUMNS, SORT_COLUMNS):
        style = SORTED if column.key == state.sort.key else COLUMNS
        header.add(_fit(title, size, right), style).add(" ", COLUMNS)
    header.add("COMMAND", COLUMNS)
    lines.append(header)
    rows = state.sorted_rows(rows_from_report(report))
    selected = state.resolve_selection(rows) if interactive else None
    if not rows:
        lines.append(Line().add("  no job runs the agent: start one with python -m tpu_tools.agent script.py", DIM))
        return lines, None
    command_width = max(_MIN_COMMAND, width - 1 - sum(size + 1 for _, size, _ in _PROCESS_COLUMNS))
    start = 0
    rows_shown = rows
    if max_rows is not None and len(rows) > max_rows:
        visible = max(1, max_rows - 1)  # one line says how many more there are
        if selected is not None and selected >= visible:
            start = selected - visible + 1
        rows_shown = rows[start:start + visible]
    for offset, row in enumerate(rows_shown):
        cells = _process_cells(row)
        text = " " + " ".join(_fit(cell, size, right) for cell, (_, size, right) in zip(cells, _PROCESS_COLUMNS))
        tail = f"error: {row.error}" if row.error else _short_command(row.command)
        is_selected = selected is not None and start + offset == selected
        line = Line(fill=SELECTED if is_selected else None)
        line.add(text + " ", SELECTED if is_selected else NORMAL)
        line.add(_fit(tail, command_width), SELECTED if is_selected else ERROR if row.error else DIM
                 if not row.has_agent else NORMAL)
        lines.append(line)
    hidden = len(rows) - len(rows_shown)
    if hidden:
        lines.append(Line().add(f"  ... {hidden} more processes (up/down to scroll)", DIM))
    return lines, (rows[selected] if selected is not None else None)


def detail_lines(row: ProcessRow | None) -> list[Line]:
    """Two lines about the selected process: step times, compile time, the last recompilation."""
    if row is None:
        return [Line(), Line()]
    label = f" {row.pid} {row.tag or ''}".rstrip() + ": "
    if row.error:
        return [Line().add(label, TITLE).add(row.error, ERROR), Line()]
    if not row.has_agent:
        return [Line().add(label, TITLE).add("holds a device; no tpu-tools agent in this process", DIM), Line()]
    steps = row.detail.get("steps") or {}
    compiles = row.detail.get("compiles") or {}
    compile_time = sum(compiles.get(k) or 0.0 for k in ("trace_time_s", "lowering_time_s", "backend_compile_time_s"))
    first = Line().add(label, TITLE)
    first.add(f"steps {steps.get('count') if steps.get('count') is not None else MISSING}"
              f"  last {_seconds(steps.get('last_step_time_s'))}  p50 {_seconds(steps.get('p50_step_time_s'))}"
              f"  p99 {_seconds(steps.get('p99_step_time_s'))}  compile time {_seconds(compile_time)}"
              f"  cache hits {compiles.get('cache_hits', MISSING)} misses {compiles.get('cache_misses', MISSING)}")
    recompiles = compiles.get("recent_recompiles") or []
    second = Line().add(" last recompile: ", TITLE)
    if recompiles:
        last = recompiles[-1]
        second.add(f"{last['function']} ({_seconds(last.get('backend_compile_time_s'))})"
                   + (f": {last['reason']}" if last.get("reason") else
                      "  (reason: start the job with --explain-recompiles)"))
    else:
        second.add("none", DIM)
    return [first, second]


def _overlay_help(lines: list[Line], width: int, height: int) -> None:
    box_width = min(width, max(len(t) for t in HELP_LINES) + 4)
    top = max(0, (height - len(HELP_LINES) - 2) // 2)
    left = max(0, (width - box_width) // 2)
    body = ["+" + "-" * (box_width - 2) + "+"]
    body += ["| " + _fit(text, box_width - 4) + " |" for text in HELP_LINES]
    body.append(body[0])
    while len(lines) < top + len(body):
        lines.append(Line())
    for offset, text in enumerate(body):
        original = lines[top + offset].text.ljust(width)
        lines[top + offset] = Line().add(original[:left]).add(text, HEADER).add(original[left + box_width:])


def render(report: dict[str, Any], state: ViewState, width: int, height: int | None,
           interactive: bool = True) -> list[Line]:
    """The frame for `report` at `width` x `height` (height None: as tall as needed, for --once)."""
    width = max(20, width)
    top = [header_line(report, state, width, interactive), *host_lines(report, width), Line()]
    footer = [Line(fill=HEADER).add(" q quit  j/k select  s/S sort  r reverse  p pause  h help", HEADER)] \
        if interactive else []
    details_budget = 2 if interactive and (height is None or height >= 16) else 0
    if height is None:
        devices = device_lines(report, width, None)
        processes, selected = process_lines(report, state, width, None, interactive)
    else:
        fixed = len(top) + len(footer) + details_budget + 1  # + the blank line between panels
        device_budget = max(3, (height - fixed) // 3)
        devices = device_lines(report, width, max(1, device_budget - 2))
        process_budget = height - fixed - len(devices) - 2  # minus the title and column lines
        processes, selected = process_lines(report, state, width, max(1, process_budget), interactive)
    lines = [*top, *devices, Line(), *processes]
    if height is not None:  # the details and the footer sit at the bottom of the screen
        lines += [Line()] * max(0, height - len(lines) - len(footer) - details_budget)
    if details_budget:
        lines += detail_lines(selected)
    if height is not None:
        lines = lines[: max(0, height - len(footer))] + footer
        lines = lines[:height]
        if state.show_help:
            _overlay_help(lines, width, height)
    else:
        lines += footer
    return [line.cut(width) for line in lines]


def frame_text(lines: list[Line]) -> str:
    return "\n".join(line.text.rstrip() for line in lines)
