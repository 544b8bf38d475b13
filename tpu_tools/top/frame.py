"""One tpu-top frame: lines of styled segments, cut to the terminal's width and height.

The same function draws the live view (curses paints the segments with their
styles) and `tpu-top --once` (the text alone), so what a script captures is
what a user sees. Nothing here touches the terminal. Tables lay out their
columns by priority: on a narrow terminal the least useful columns go first,
whole, so no header is ever cut inside a word.
"""

from __future__ import annotations

import time

from tpu_tools.metrics.libtpu.names import FIELD_METRICS
from tpu_tools.metrics.libtpu.records import NOT_SERVED
from tpu_tools.metrics.records.devices import Device, DeviceExtra
from tpu_tools.metrics.records.gpu import GpuProcess
from tpu_tools.metrics.records.jobs import AgentEntry, EntryCompiles, EntrySteps, StallFinding
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.metrics.tpuhealth import short_health
from tpu_tools.shorten import shorten
from tpu_tools.top.cacheview import shared_cache_lines
from tpu_tools.top.drawing import (
    BAR_LOW,
    DIM,
    ERROR,
    HEADER,
    NORMAL,
    SELECTED,
    TITLE,
    WARN,
    Column,
    Line,
    Segment,
    bar_segments,
    column_header,
    fit,
    graph_rows,
    layout,
    level_style,
    parts_line,
    percent_text,
    seconds_text,
    short_command,
    sparkline,
    table_row,
)
from tpu_tools.top.environ import environment_lines
from tpu_tools.top.fleet_panel import fleet_lines
from tpu_tools.top.history import History, device_graph_series, device_key
from tpu_tools.top.jobview import job_lines
from tpu_tools.top.keys import help_lines
from tpu_tools.top.model import SORT_COLUMNS, ProcessRow, ViewState, device_memory_fraction, gpus_of
from tpu_tools.units import MISSING, format_bytes, format_bytes_short, format_known, format_number

HELP_LINES = help_lines()
# The report groups a frame reads: tpu-top gathers these alone (the workload group's scrapes of the job's own
# metrics endpoint and the device plugin would cost every round and show nowhere on its screens).
SHOWN_GROUPS = ("host", "devices", "processes", "libtpu", "nvml", "amdsmi", "diag")
NOT_SERVED_CELL = "n/s"  # the device panel's short form of NOT_SERVED


def _hosts(report: MonitorReport) -> set[str]:
    """Hosts named by the report's records: a source that reads several hosts sets `host` on each record."""
    devices = report.devices.devices if report.devices is not None else []
    agents = report.processes.agents if report.processes else []
    return {a.host_name for a in agents if a.host_name} | {host for host in (d.host_name() for d in devices) if host}


# --- panels ----------------------------------------------------------------------------------------------

def header_line(report: MonitorReport, state: ViewState, width: int, interactive: bool) -> Line:
    devices = report.devices.devices if report.devices is not None else []
    platforms = sorted({d.platform for d in devices if d.platform})
    clock = time.strftime("%H:%M:%S", time.localtime(report.time_unix_s or time.time()))
    hosts = _hosts(report)
    where = f"{len(hosts)} hosts" if len(hosts) > 1 else f"host {(report.hostname or '?')}"
    right = ("PAUSED " if state.paused else "") + ("h help " if interactive else "")
    left = parts_line([(" tpu-top", HEADER), (where, HEADER), (f"platform {','.join(platforms) or 'none'}", HEADER),
                   (clock, HEADER), (f"refresh {state.interval_s:g}s", HEADER)], max(0, width - len(right) - 1))
    gap = max(1, width - len(left.text) - len(right))
    if len(left.text) + gap + len(right) > width:
        right = ""
    return Line(fill=HEADER).add(left.text + " " * gap + right, HEADER)


def host_lines(report: MonitorReport, width: int) -> list[Line]:
    host = report.host
    if host is None:
        return []
    if host.error:
        return [Line().add(" host: ", TITLE).add(host.error, ERROR)]
    cpu, used, total = host.cpu_percent, host.memory_used_bytes, host.memory_total_bytes
    cpu_text = f" {percent_text(cpu)}%"
    memory_text = f" {format_bytes(used)} / {format_bytes(total)}"
    bar_width = max(6, (width - 6 - len(cpu_text) - 6 - len(memory_text) - 4) // 2)
    if width < 60:  # no room for bars: the figures alone
        first = parts_line([(f" CPU{cpu_text}", NORMAL), (f"MEM{memory_text}", NORMAL)], width, "   ")
    else:
        first = Line().add(" CPU ", TITLE)
        first.segments += bar_segments(None if cpu is None else cpu / 100, bar_width)
        first.add(cpu_text + "   ").add("MEM ", TITLE)
        first.segments += bar_segments(used / total if used is not None and total else None, bar_width)
        first.add(memory_text)
    loads = [host.load_average_1m, host.load_average_5m, host.load_average_15m]
    load_text = " ".join(MISSING if v is None else f"{v:.2f}" for v in loads)
    agents = report.processes.agents if report.processes is not None else None
    parts = [(f" LOAD {load_text}", NORMAL), (f"CPUS {host.cpu_count or MISSING}", NORMAL),
             (f"SWAP {format_bytes(host.swap_used_bytes)} / {format_bytes(host.swap_total_bytes)}", NORMAL)]
    if agents is not None:
        parts.append((f"AGENTS {len(agents)}", NORMAL))
    return [first, parts_line(parts, width, "   ")]


def _holders_text(device: Device, gpu_processes: dict[str, list[GpuProcess]]) -> str:
    names = [f"{process.pid} {process.tag or ''}".strip() for process in device.processes]
    seen = {p.pid for p in device.processes}
    for gpu_process in gpu_processes.get(device.key, []):  # NVML's list: every process on the GPU
        if gpu_process.pid not in seen:
            seen.add(gpu_process.pid)
            label = gpu_process.tag or short_command(gpu_process.command).split(" ")[0]
            names.append(f"{gpu_process.pid} {label}".strip())
    for holder in device.holders:
        if holder.pid not in seen:
            names.append(f"{holder.pid} {short_command(holder.command).split(' ')[0]}")
    return ", ".join(names) or MISSING


def _libtpu_not_served(report: MonitorReport) -> set[str]:
    """Device figures ("duty_cycle_percent", "hbm_used_bytes") that an answering libtpu service does not serve."""
    answered = [s for s in (report.libtpu.services if report.libtpu is not None else []) if not s.error]
    return {figure for figure in ("duty_cycle_percent", "hbm_used_bytes")
            if any(FIELD_METRICS[figure] in s.not_served_metrics for s in answered)}


def _libtpu_status(report: MonitorReport, not_served: set[str]) -> Segment | None:
    """One phrase about libtpu's metrics services: which answered and what they do not serve, or why none did."""
    group = report.libtpu
    if group is None:
        return None
    services = group.services
    answered = [s.address for s in services if not s.error]
    if answered:
        missing = [label for figure, label in (("duty_cycle_percent", "duty cycle"), ("hbm_used_bytes", "HBM use"))
                   if figure in not_served]
        text = f"libtpu {', '.join(answered)}" + (f"; {' and '.join(missing)} {NOT_SERVED} ({NOT_SERVED_CELL})"
                                                  if missing else "")
        return Segment(text, DIM)
    errors = [s.error or "" for s in services]
    if services and all("connection refused" in e for e in errors):
        return Segment(f"libtpu: no metrics service ({', '.join(s.address for s in services)})", DIM)
    informative = [e for e in errors if "connection refused" not in e]
    return Segment(f"libtpu: {informative[0] if informative else group.error or 'no metrics service'}", ERROR)


def device_condition(device: Device) -> str | None:
    """"lost" (the device stopped answering a GPU library's calls), when a source says so."""
    return "lost" if device.extra.gpu_status in ("lost", "not_answering") else None


def _device_columns(devices: list[Device], multi_host: bool, with_history: bool) -> list[Column]:
    # A fleet's device keys carry their host (HOST:PORT/tpu:0): room for them, as for a local key.
    key_width = max(6, min(32 if multi_host else 16, max(len(d.key) for d in devices)))
    columns = [Column("host", "HOST", 12, priority=1)] if multi_host else []
    columns += [Column("key", "DEVICE", key_width, priority=0), Column("name", "NAME", 12, priority=7),
                Column("bar", "MEMORY", 8, priority=5, flex_max=30),
                Column("memory", "USED / TOTAL", 21, right=True, priority=1),
                Column("util", "UTIL%", 5, right=True, priority=2)]
    if any(d.extra.temperature_celsius is not None for d in devices):
        columns.append(Column("temp", "TEMP", 5, right=True, priority=8))
    if any(d.extra.power_draw_watts is not None for d in devices):
        columns.append(Column("power", "POWER", 6, right=True, priority=9))
    if any(d.extra.diag_status for d in devices):
        columns.append(Column("diag", "DIAG", 9, priority=4))
    if with_history:
        columns.append(Column("history", "HISTORY", 6, priority=6, flex_max=40))
    columns.append(Column("processes", "PROCESSES", 12, priority=3, flex_max=200))
    return columns


_DIAG_STYLE = {"fail": ERROR, "warn": WARN, "skip": DIM}


def age_text(seconds: float | None) -> str:
    """A compact age: 45s, 12m, 5h, 3d."""
    if seconds is None:
        return MISSING
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def diag_cell(extra: DeviceExtra) -> tuple[str, str]:
    """A device's last tpu-diag verdict and its age (the monitor's diag group)."""
    status = extra.diag_status
    if not status:
        return (MISSING, DIM)
    return (f"{status.upper()} {age_text(extra.diag_age_s)}", _DIAG_STYLE.get(status, NORMAL))


def diag_status(report: MonitorReport) -> Segment | None:
    """The host's last tpu-diag run in a phrase, e.g. "diag -r 2 FAIL 3h ago (gemm f32 device 3)"."""
    last = report.diag.last if report.diag is not None else None
    if last is None or last.error or not last.status:
        return None
    text = f"diag -r {last.level} {last.status.upper()} {age_text(last.age_s)} ago"
    failed = [c for c in last.checks if c.status == "fail"]
    if failed:
        first = failed[0]
        where = f" link {first.link}" if first.link else (f" device {first.device}" if first.device is not None
                                                          else "")
        text += f" ({first.test}{where}" + (f", +{len(failed) - 1} more" if len(failed) > 1 else "") + ")"
    return Segment(text, _DIAG_STYLE.get(last.status, DIM))


def device_lines(report: MonitorReport, width: int, max_rows: int | None, state: ViewState | None = None,
                 history: History | None = None) -> list[Line]:
    group = report.devices
    if group is None:
        return []
    state = state or ViewState()
    not_served = _libtpu_not_served(report)
    title = Line().add(" Devices", TITLE)
    status = _libtpu_status(report, not_served)
    if status is not None and len(title.text) + 2 + len(status.text) <= width:
        title.add("  ").add(status.text, status.style)
    verdict = diag_status(report)
    if verdict is not None and len(title.text) + 2 + len(verdict.text) <= width:
        title.add("  ").add(verdict.text, verdict.style)
    lines = [title]
    if group.error:
        return [*lines, Line().add(f"  {group.error}", ERROR)]
    devices = state.filters.devices_of(report)
    if not devices:
        text = "no device matches --device" if state.filters.devices and group.devices else \
            "no accelerator found, and no agent reports a device"
        return [*lines, Line().add(f"  {text}", DIM)]
    columns = layout(_device_columns(devices, len(_hosts(report)) > 1, history is not None), width)
    gpu_processes = {gpu.device_key: gpu.processes for gpu in gpus_of(report) if gpu.device_key}
    lines.append(column_header(columns))
    history_width = next((size for column, size in columns if column.key == "history"), 0)
    shown = devices if max_rows is None or len(devices) <= max_rows else devices[: max(1, max_rows - 1)]
    for device in shown:
        used = device.memory_used_or_live_bytes()
        total = device.memory_total_bytes
        utilization = device.utilization_percent
        from_libtpu = "libtpu" in device.sources
        used_text = NOT_SERVED_CELL if used is None and from_libtpu and "hbm_used_bytes" in not_served \
            else format_bytes(used)
        util_text = NOT_SERVED_CELL if utilization is None and from_libtpu and "duty_cycle_percent" in not_served \
            else percent_text(utilization)
        condition = device_condition(device)
        temperature, power = device.extra.temperature_celsius, device.extra.power_draw_watts
        series, top = device_graph_series(device)
        graph = sparkline(history.device(device_key(device), series, history_width), history_width, top,
                          state.unicode) if history is not None and history_width else ""
        cells: dict[str, list[Segment] | tuple[str, str]] = {
            "host": (device.host_name() or MISSING, NORMAL),
            "key": (device.key, ERROR if condition == "lost" else NORMAL),
            "name": (condition.upper() if condition else device.extra.gpu_name or device.name or MISSING,
                     ERROR if condition == "lost" else WARN if condition else NORMAL),
            "bar": bar_segments(device_memory_fraction(device), next((s for c, s in columns if c.key == "bar"), 8)),
            "memory": (f"{used_text} / {format_bytes(total)}", NORMAL),
            "util": (util_text, level_style(None if utilization is None else utilization / 100)
                     if utilization is not None else NORMAL),
            "temp": (MISSING if temperature is None else f"{temperature:.0f}C", NORMAL),
            "power": (MISSING if power is None else f"{power:.0f}W", NORMAL),
            "history": [Segment(graph, level_style(None if utilization is None else utilization / 100)
                                if utilization is not None else DIM)],
            "processes": (_holders_text(device, gpu_processes), NORMAL),
            "diag": diag_cell(device.extra),
        }
        lines.append(table_row(columns, cells))
    if len(shown) < len(devices):
        lines.append(parts_line([(f"  ... {len(devices) - len(shown)} more devices", DIM),
                             ("(tpu-monitor lists them all)", DIM)], width, " "))
    return lines


def _process_columns(multi_host: bool, host_width: int = 12, health: bool = False, gpus: bool = False,
                     times: bool = True) -> list[Column]:
    # Fits 80 columns with room for the command; narrower, the least useful go first.
    priorities = {"pid": 0, "user": 5, "tag": 1, "cpu": 6, "rss": 7, "devmem": 2, "compiles": 8, "recompiles": 4,
                  "steps": 3, "sm": 7, "time": 9}
    widths = {"pid": 7, "user": 8, "tag": 10, "cpu": 5, "rss": 7, "devmem": 7, "compiles": 5, "recompiles": 6,
              "steps": 6, "sm": 4, "time": 10}
    columns = [Column("host", "HOST", host_width, priority=1)] if multi_host else []
    columns += [Column(c.key, c.header, widths[c.key], right=c.key not in ("user", "tag"), priority=priorities[c.key])
                for c in SORT_COLUMNS
                if (gpus or c.key != "sm") and (times or c.key != "time")]  # SM% where a GPU is; TIME where known
    if health:  # only where an agent read libtpu's ICI link health or throttle score
        columns.append(Column("health", "HEALTH", 7, priority=2))
    columns.append(Column("command", "COMMAND", 8, priority=4, flex_max=1000))
    return columns


def elapsed_text(seconds: float | None) -> str:
    """A process's running time as ps and nvitop show it: 05:07, 3:05:07, 2-03:05:07."""
    if seconds is None:
        return MISSING
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _process_cells(row: ProcessRow, now: float, marked: bool = False) -> dict[str, list[Segment] | tuple[str, str]]:
    agent = row.has_agent and row.error is None
    tail = f"error: {row.error}" if row.error else short_command(row.command)
    frontend = row.agent.frontend if agent and row.agent else None
    if frontend and frontend != "jax":  # a frontend other than JAX is named: [torch_xla] train.py
        tail = f"[{frontend}] {tail}"
    if row.depth:  # the tree view: under its parent
        tail = "  " * (row.depth - 1) + "`- " + tail
    return {
        "host": (row.host or MISSING, NORMAL),
        "pid": (("*" if marked else "") + str(row.pid), WARN if marked else NORMAL),
        "user": (row.user or MISSING, NORMAL),
        "tag": (row.tag or MISSING, NORMAL),
        "cpu": (percent_text(row.cpu_percent), NORMAL),
        "rss": (format_bytes_short(row.rss_bytes), NORMAL),
        "devmem": (format_bytes_short(row.device_memory_bytes)
                   if agent or row.device_memory_bytes is not None else MISSING, NORMAL),
        "compiles": (str(row.compiles) if agent and row.compiles is not None else MISSING, NORMAL),
        "recompiles": (str(row.recompiles) if agent and row.recompiles is not None else MISSING,
                       WARN if agent and row.recompiles else NORMAL),
        # a job whose steps stopped (tpu_tools.metrics.stall): its last rate would hide it
        "steps": ("STALL", ERROR) if agent and row.agent and row.agent.stalled_s is not None
        else (format_number(row.steps_per_second) if agent else MISSING, NORMAL),
        "sm": (percent_text(row.sm_percent), NORMAL),
        "time": (elapsed_text(None if row.started_unix_s is None else now - row.started_unix_s), NORMAL),
        "health": _health_cell(row),
        "command": (tail, ERROR if row.error else DIM if not row.has_agent else NORMAL),
    }


def _health_cell(row: ProcessRow) -> tuple[str, str]:
    sdk = row.agent.tpu_sdk if row.agent is not None else None
    text, level = short_health(sdk.health if sdk is not None else None)
    return (MISSING if level == "none" else text), {"error": ERROR, "warn": WARN}.get(level, NORMAL)


def stall_finding_lines(findings: list[StallFinding], width: int) -> list[Line]:
    """One line per stalled job whose workers are in different places: the worker that differs, and where."""
    lines = []
    for finding in findings:
        workers = ", ".join(f"{w.host}/{w.pid}" if w.host else str(w.pid) for w in finding.workers)
        where = finding.workers[0].where if finding.workers else None
        text = (f"  stalled job {finding.tag or MISSING}: worker {workers} differs, in {where}; "
                f"the others in {', '.join(finding.others_where)}")
        lines.append(Line().add(shorten(text, width), ERROR))
    return lines


def process_lines(report: MonitorReport, state: ViewState, width: int, max_rows: int | None,
                  interactive: bool, drawn: dict[int, str] | None = None) -> tuple[list[Line], ProcessRow | None]:
    """The process panel, and the selected row; `drawn` gets id(line) -> row key, for mouse clicks."""
    group = report.processes
    if group is None:
        return [], None
    direction = "^" if state.sort.descending == state.reversed else "v"
    title_parts = [(" Processes", TITLE), (f"sorted by {state.sort.header} {direction}", DIM)]
    if state.tree:
        title_parts.append(("tree (t)", DIM))
    if state.filters.active():
        title_parts.append((f"filter: {' '.join(state.filters.active())}", WARN))
    if state.marked:
        title_parts.append((f"{len(state.marked)} marked (space)", WARN))
    lines = [parts_line(title_parts, width)]
    if group.error:
        return [*lines, Line().add(f"  {group.error}", ERROR)], None
    lines += stall_finding_lines(group.stall_findings, width)
    hosts = _hosts(report)
    # HOST:PORT of a fleet's hosts in full where they fit (up to 22 characters), else cut with a mark
    health = any(a.tpu_sdk is not None and a.tpu_sdk.health is not None for a in group.agents)
    gpus = bool(gpus_of(report))
    rows = state.visible_rows(report)
    times = any(row.started_unix_s is not None for row in rows)
    columns = layout(_process_columns(len(hosts) > 1, max(4, min(22, max(map(len, hosts), default=4))), health,
                                      gpus, times), width)
    lines.append(column_header(columns, state.sort.key))
    now = report.time_unix_s or time.time()
    selected = state.resolve_selection(rows) if interactive else None
    if not rows:
        text = "no process matches the filter" if state.filters.active() and (group.agents or group.holders) \
            else "no job runs the agent: start one with python -m tpu_tools.agent script.py"
        lines.append(Line().add(f"  {text}", DIM))
        return lines, None
    start = 0
    rows_shown = rows
    if max_rows is not None and len(rows) > max_rows:
        visible = max(1, max_rows - 1)  # one line says how many more there are
        if selected is not None and selected >= visible:
            start = selected - visible + 1
        rows_shown = rows[start:start + visible]
    for offset, row in enumerate(rows_shown):
        is_selected = selected is not None and start + offset == selected
        lines.append(table_row(columns, _process_cells(row, now, row.key in state.marked),
                               SELECTED if is_selected else None))
        if drawn is not None:
            drawn[id(lines[-1])] = row.key
    hidden = len(rows) - len(rows_shown)
    if hidden:
        lines.append(Line().add(f"  ... {hidden} more processes (up/down to scroll)", DIM))
    return lines, (rows[selected] if selected is not None else None)


def detail_lines(row: ProcessRow | None, width: int = 120, history: History | None = None,
                 unicode: bool = True) -> list[Line]:
    """Two lines about the selected process: step times and their recent rate, compile time, the last
    recompilation."""
    if row is None:
        return [Line(), Line()]
    label = f" {row.pid} {row.tag or ''}".rstrip() + ": "
    if row.error:
        return [Line().add(label, TITLE).add(row.error, ERROR), Line()]
    if not row.has_agent:
        return [Line().add(label, TITLE).add("holds a device; no tpu-tools agent in this process", DIM), Line()]
    agent = row.agent or AgentEntry(pid=row.pid)
    steps, compiles = agent.steps or EntrySteps(), agent.compiles or EntryCompiles()
    first = parts_line([(label + f"steps {steps.count if steps.count is not None else MISSING}", NORMAL),
                    (f"last {seconds_text(steps.last_step_time_s)}", NORMAL),
                    (f"p50 {seconds_text(steps.p50_step_time_s)}", NORMAL),
                    (f"p99 {seconds_text(steps.p99_step_time_s)}", NORMAL),
                    (f"compile time {seconds_text(compiles.compile_time_s)}", NORMAL),
                    (f"cache hits {format_known(compiles.cache_hits)} misses "
                     f"{format_known(compiles.cache_misses)}", NORMAL)], width)
    room = width - len(first.text) - 12
    if history is not None and room >= 8:
        rates = history.job(row.key, "steps_per_second", room)
        if any(v is not None for v in rates):
            first.add("  steps/s ", DIM).add(sparkline(rates, room, None, unicode), BAR_LOW)
    recompiles = compiles.recent_recompiles
    second = Line().add(" last recompile: ", TITLE)
    if recompiles:
        last = recompiles[-1]
        second.add(f"{last.function} ({seconds_text(last.backend_compile_time_s)})"
                   + (f": {last.reason}" if last.reason else "  (reason: start the job with --explain-recompiles)"))
    else:
        second.add("none", DIM)
    return [first, second]


MAX_GRAPH_ROWS = 4  # a device's graphs grow this tall in the history panel when the terminal has the room


def history_rows_wanted(device_count: int, with_job: bool) -> int:
    """The rows the history panel would fill at its tallest: its title, each device's graphs, the job's line."""
    return 1 + device_count * MAX_GRAPH_ROWS + (1 if with_job else 0)


def history_lines(report: MonitorReport, state: ViewState, history: History, width: int, max_rows: int,
                  selected: ProcessRow | None) -> list[Line]:
    """The history panel: each device's utilization and memory over the window, and the selected job's
    steps/s. Shown when the terminal has room for it; the graphs grow up to MAX_GRAPH_ROWS tall with it."""
    devices = state.filters.devices_of(report)
    if max_rows < 2 or not devices:
        return []
    seconds = history.capacity * state.interval_s
    lines = [parts_line([(" History", TITLE), (f"last {seconds / 60:g} min, one sample a refresh", DIM)], width)]
    key_width = max(6, min(16, max(len(d.key) for d in devices)))
    graph = max(4, (width - key_width - 2 - 2 * 16) // 2)
    budget = max_rows - 1 - (1 if selected is not None and selected.has_agent else 0)
    shown = devices[: max(0, budget)]
    rows = max(1, min(MAX_GRAPH_ROWS, budget // max(1, len(shown))))
    for device in shown:
        lines += _device_history(device, history, state, width, key_width, graph, rows)
    if selected is not None and selected.has_agent:
        label = f" STEP/S of {selected.pid} {selected.tag or ''}".rstrip() + " "
        room = max(4, width - len(label) - 8)
        rates = history.job(selected.key, "steps_per_second", room)
        last = next((v for v in reversed(rates) if v is not None), None)
        lines.append(Line().add(label, DIM).add(sparkline(rates, room, None, state.unicode), BAR_LOW)
                     .add(" " + format_number(last)))
    return lines


def _device_history(device: Device, history: History, state: ViewState, width: int, key_width: int,
                    graph: int, rows: int) -> list[Line]:
    """One device's UTIL and MEM graphs, `rows` tall, side by side; labels and last values on the top line."""
    key = device_key(device)
    utilization = history.device(key, "utilization_percent", graph)
    memory_series, memory_top = ("memory_percent", 100.0) if device_memory_fraction(device) is not None \
        else ("memory_used_bytes", None)
    has_utilization = any(v is not None for v in utilization)
    memory_graph = graph if has_utilization else max(4, width - key_width - 2 - 12)  # memory takes the line
    memory = history.device(key, memory_series, memory_graph)
    last_util = next((v for v in reversed(utilization) if v is not None), None)
    last_memory = next((v for v in reversed(memory) if v is not None), None)
    util_style = level_style(None if last_util is None else last_util / 100)
    memory_style = level_style(last_memory / 100) if memory_top and last_memory is not None else BAR_LOW

    def drawn(values: list[float | None], size: int, top: float | None) -> list[str]:
        if rows == 1:  # one line: the sparkline's finer ASCII ramp
            return [sparkline(values, size, top, state.unicode)]
        return graph_rows(values, size, rows, top, state.unicode)

    util_rows, memory_rows = drawn(utilization, graph, 100.0), drawn(memory, memory_graph, memory_top)
    lines = []
    for row in range(rows):
        first = row == 0  # the labels and the last values go on the top line
        line = Line().add(" " + fit(device.key if first else "", key_width) + " ")
        if has_utilization:
            line.add(" UTIL " if first else " " * 6, DIM).add(fit(util_rows[row], graph), util_style)
            line.add((fit(percent_text(last_util), 6, True) if first else " " * 6) + " ")
        line.add(" MEM " if first else " " * 5, DIM).add(fit(memory_rows[row], memory_graph), memory_style)
        if first:
            line.add(fit(percent_text(last_memory) if memory_top else format_bytes_short(last_memory), 6, True))
        lines.append(line)
    return lines


def footer_line(state: ViewState, width: int) -> Line:
    """The bottom line: the filter being typed, a signal to confirm, the last result, or the keys."""
    if state.editing_filter:
        return Line(fill=HEADER).add(f" filter: /{state.filters.text}_", HEADER).add(
            "   Enter keep  Esc clear" if width >= 40 + len(state.filters.text) else "", HEADER)
    if state.pending is not None:
        row = state.pending.row
        label = f"{row.pid}" + (f" ({row.tag})" if row.tag else "") + (f" on {row.host}" if row.host else "")
        if state.pending.rows:  # the question first: a long list of PIDs is cut at the width, not it
            refused = f"; {len(state.pending.refused)} refused" if state.pending.refused else ""
            return Line(fill=WARN).add(f" send {state.pending.signal_name} to {len(state.pending.rows)} marked "
                                       f"processes? y / n   PIDs {' '.join(str(r.pid) for r in state.pending.rows)}"
                                       f"{refused}", WARN)
        return Line(fill=WARN).add(f" send {state.pending.signal_name} to {label}? y / n", WARN)
    message = state.current_message()
    if message is not None:
        return Line().add(" " + message[0], ERROR if message[1] else TITLE)
    if state.environment is not None:
        hints = ["Esc back", "up/down scroll", "q quit", "h help"]
    elif state.job_key is not None:
        hints = ["Esc back", "m arrays", "e environment", "I/T/K signal", "q quit", "h help"]
    else:
        hints = ["q quit", "j/k select", "Enter job", "/ filter", "a all", "I/T/K signal", "s/S sort",
                 "r reverse", "p pause", "h help"]
    line = parts_line([(" " + hints[0], HEADER), *[(h, HEADER) for h in hints[1:]]], width)
    line.fill = HEADER
    return line


def _overlay_help(lines: list[Line], width: int, height: int) -> None:
    box_width = min(width, max(len(t) for t in HELP_LINES) + 4)
    top = max(0, (height - len(HELP_LINES) - 2) // 2)
    left = max(0, (width - box_width) // 2)
    body = ["+" + "-" * (box_width - 2) + "+"]
    body += ["| " + fit(text, box_width - 4) + " |" for text in HELP_LINES]
    body.append(body[0])
    while len(lines) < top + len(body):
        lines.append(Line())
    for offset, text in enumerate(body[: max(0, height - top)]):
        original = lines[top + offset].text.ljust(width)
        lines[top + offset] = Line().add(original[:left]).add(text, HEADER).add(original[left + box_width:])


def render(report: MonitorReport, state: ViewState, width: int, height: int | None,
           interactive: bool = True, history: History | None = None) -> list[Line]:
    """The frame for `report` at `width` x `height` (height None: as tall as needed, for --once)."""
    width = max(20, width)
    if (state.job_key is not None or state.environment is not None) and interactive:
        state.row_at = {}  # no process rows to click here
        body = environment_lines(state.environment, width, None if height is None else height - 2) \
            if state.environment is not None else \
            job_lines(report, state, history, width, None if height is None else height - 2)
        lines = [header_line(report, state, width, interactive), *body]
        if height is not None:
            lines = lines[: height - 1]
            lines += [Line()] * max(0, height - 1 - len(lines))
        lines.append(footer_line(state, width))
        if height is not None and state.show_help:
            _overlay_help(lines, width, height)
        return [line.cut(width) for line in lines]
    top = [header_line(report, state, width, interactive), *host_lines(report, width),
           *shared_cache_lines(report, width), Line()]
    hosts = fleet_lines(report, width, None if height is None else max(3, height // 4))
    if hosts:  # a fleet view (--from-prometheus): the hosts, the slice's outliers first
        top += [*hosts, Line()]
    footer = [footer_line(state, width)] if interactive else []
    drawn: dict[int, str] = {}
    details_budget = 2 if interactive and (height is None or height >= 16) else 0
    graphs: list[Line] = []
    if height is None:
        devices = device_lines(report, width, None, state, history)
        processes, selected = process_lines(report, state, width, None, interactive, drawn)
    else:
        fixed = len(top) + len(footer) + details_budget + 1  # + the blank line between panels
        available = height - fixed
        shown = len(state.visible_rows(report)) if report.processes else 0
        device_need = len(state.filters.devices_of(report)) + 2 if report.devices is not None else 0
        process_need = shown + 2
        # The processes keep at least half the room they ask for; the devices take what is left, and the
        # history panel takes what neither needs, when there is enough of it.
        device_budget = min(max(device_need, 3), max(3, available - min(process_need, max(6, available // 2))))
        devices = device_lines(report, width, max(1, device_budget - 2), state, history)
        process_budget = available - len(devices) - 2  # minus the title and column lines
        spare = process_budget - max(shown + 1, 4) - 1
        panel = 0
        if history is not None and interactive and spare >= 3:
            panel = min(spare, history_rows_wanted(device_need - 2, True))
            process_budget -= panel + 1
        processes, selected = process_lines(report, state, width, max(1, process_budget), interactive, drawn)
        if panel and history is not None:
            graphs = history_lines(report, state, history, width, panel, selected)
    lines = [*top, *devices, Line(), *processes]
    if report.host is None and report.devices is None and report.processes is None:
        lines.append(Line().add(" gathering the first report...", DIM))
    if graphs:
        lines += [Line(), *graphs]
    if height is not None:  # the details and the footer sit at the bottom of the screen
        lines += [Line()] * max(0, height - len(lines) - len(footer) - details_budget)
    if details_budget:
        lines += detail_lines(selected, width, history, state.unicode)
    if height is not None:
        lines = lines[: max(0, height - len(footer))] + footer
        lines = lines[:height]
        if state.show_help:
            _overlay_help(lines, width, height)
    else:
        lines += footer
    state.row_at = {index: drawn[id(line)] for index, line in enumerate(lines) if id(line) in drawn}
    return [line.cut(width) for line in lines]


def frame_text(lines: list[Line]) -> str:
    return "\n".join(line.text.rstrip() for line in lines)
