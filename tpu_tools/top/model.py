"""What tpu-top shows, taken from a monitor report, and the state the keys change."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.records.devices import Device
from tpu_tools.metrics.records.gpu import GpuProcess, GpuRecord
from tpu_tools.metrics.records.jobs import AgentEntry, ProcessesGroup
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.top.arrays_view import ArraysBoard


@dataclass
class ProcessRow:
    pid: int
    user: str | None
    tag: str | None
    command: str | None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    device_memory_bytes: int | None = None
    compiles: int | None = None
    recompiles: int | None = None
    steps_per_second: float | None = None
    has_agent: bool = True
    error: str | None = None
    agent: AgentEntry | None = None  # the agent entry, for the selected-process lines and the job screen
    chips: list[int] | None = None  # the chips a process without an agent holds
    host: str | None = None  # set by a source that reads several hosts
    sm_percent: float | None = None  # NVML's per-process SM utilization, the busiest GPU's where it uses several
    started_unix_s: float | None = None  # from /proc, for local processes (procinfo.ProcessInfo)
    parent_pid: int | None = None
    depth: int = 0  # in the tree view (`t`): how many listed ancestors the process has

    @property
    def key(self) -> str:
        """Identifies the process across reports (a PID is unique only within its host)."""
        return f"{self.host}/{self.pid}" if self.host else str(self.pid)

    def matches(self, text: str) -> bool:
        """The `/` filter: a case-insensitive substring of the tag, user, command, PID or host."""
        needle = text.lower()
        return any(needle in str(value).lower() for value in (self.tag, self.user, self.command, self.pid,
                                                              self.host) if value is not None)


@dataclass(frozen=True)
class SortColumn:
    key: str  # also the --sort choice
    header: str
    attribute: str
    descending: bool  # the natural direction: biggest first for figures, A-Z for names


SORT_COLUMNS = (
    SortColumn("pid", "PID", "pid", False),
    SortColumn("user", "USER", "user", False),
    SortColumn("tag", "TAG", "tag", False),
    SortColumn("cpu", "CPU%", "cpu_percent", True),
    SortColumn("rss", "RSS", "rss_bytes", True),
    SortColumn("devmem", "DEV MEM", "device_memory_bytes", True),
    SortColumn("compiles", "COMP", "compiles", True),
    SortColumn("recompiles", "RECOMP", "recompiles", True),
    SortColumn("steps", "STEP/S", "steps_per_second", True),
    SortColumn("sm", "SM%", "sm_percent", True),
    SortColumn("time", "TIME", "started_unix_s", False),  # the earliest start, the longest running, first
)
SORT_KEYS = tuple(c.key for c in SORT_COLUMNS)
DEFAULT_SORT = "devmem"


def rows_from_report(report: MonitorReport) -> list[ProcessRow]:
    processes = report.processes or ProcessesGroup()
    rows = []
    for agent in processes.agents:
        rows.append(ProcessRow(
            pid=agent.pid, user=agent.user, tag=agent.tag, command=agent.command, cpu_percent=agent.cpu_percent,
            rss_bytes=agent.rss_bytes, device_memory_bytes=agent.device_memory_used_bytes,
            compiles=agent.compiles.compile_count if agent.compiles else None,
            recompiles=agent.compiles.recompile_count if agent.compiles else None,
            steps_per_second=agent.steps.steps_per_second if agent.steps else None, error=agent.error, agent=agent,
            host=agent.host_name,
        ))
    for holder in processes.holders:
        rows.append(ProcessRow(
            pid=holder.pid, user=holder.user, tag=None, command=holder.command, cpu_percent=holder.cpu_percent,
            rss_bytes=holder.rss_bytes, has_agent=False, chips=holder.chips,
        ))
    _add_gpu_processes(rows, report)
    return rows


def device_memory_fraction(device: Device) -> float | None:
    """Used / total of a device's memory (the platform's figure, else the live arrays); None when unknown."""
    used, total = device.memory_used_or_live_bytes(), device.memory_total_bytes
    return used / total if used is not None and total else None


def device_matches(device: Device, wanted: tuple[str, ...]) -> bool:
    """--device: a device key (`tpu:0`, `cpu:1@4242`) or its part before `@`, or a platform (`tpu`)."""
    if not wanted:
        return True
    return any(w in (device.key, device.key.split("@")[0], device.platform) for w in wanted)


def device_pids(device: Device) -> set[int]:
    """The processes a device panel row names: agents using it and processes holding it."""
    return {p.pid for p in device.processes} | {h.pid for h in device.holders}


@dataclass
class Filters:
    """What the process panel (and, for devices, the device panel) shows."""

    text: str = ""  # the `/` filter
    users: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    show_all: bool = True  # `a`: processes without an agent (device holders) too

    def active(self) -> list[str]:
        parts = [f"/{self.text}"] if self.text else []
        parts += [f"user {','.join(self.users)}"] if self.users else []
        parts += [f"pid {','.join(map(str, self.pids))}"] if self.pids else []
        parts += [f"device {','.join(self.devices)}"] if self.devices else []
        parts += [] if self.show_all else ["agents only"]
        return parts

    def devices_of(self, report: MonitorReport) -> list[Device]:
        devices = report.devices.devices if report.devices is not None else []
        return [d for d in devices if device_matches(d, self.devices)]

    def rows(self, report: MonitorReport, rows: list[ProcessRow]) -> list[ProcessRow]:
        on_devices: set[int] | None = None
        if self.devices:
            on_devices = set()
            for device in self.devices_of(report):
                on_devices |= device_pids(device)
        return [r for r in rows
                if (self.show_all or r.has_agent)
                and (not self.users or r.user in self.users)
                and (not self.pids or r.pid in self.pids)
                and (on_devices is None or r.pid in on_devices)
                and (not self.text or r.matches(self.text))]


MESSAGE_S = 5.0  # how long a result line stays


@dataclass
class Pending:
    """A signal waiting for `y` on the confirmation line: to `row`, or to every marked process (`rows`)."""

    signal_name: str
    row: ProcessRow
    rows: list[ProcessRow] = field(default_factory=list)  # the marked processes, when several
    refused: list[str] = field(default_factory=list)  # why some marked processes are left out

    @property
    def targets(self) -> list[ProcessRow]:
        return self.rows or [self.row]

def gpus_of(report: MonitorReport) -> list[GpuRecord]:
    """The GPUs of the report's GPU groups (NVML's, then amdsmi's)."""
    return [gpu for group in (report.nvml, report.amdsmi) if group is not None for gpu in group.gpus]


def _add_gpu_processes(rows: list[ProcessRow], report: MonitorReport) -> None:
    """Every process NVML (or amdsmi) lists on a GPU, agent or not, with the GPU memory it holds (the card's own
    figure)."""
    memory: dict[int, int] = {}
    busy: dict[int, float] = {}
    listed: dict[int, GpuProcess] = {}
    for gpu in gpus_of(report):
        for process in gpu.processes:
            listed.setdefault(process.pid, process)
            if process.gpu_memory_bytes is not None:
                memory[process.pid] = memory.get(process.pid, 0) + process.gpu_memory_bytes
            if process.sm_utilization_percent is not None:
                busy[process.pid] = max(busy.get(process.pid, 0.0), process.sm_utilization_percent)
    by_pid = {row.pid: row for row in rows}
    for pid, process in listed.items():
        row = by_pid.get(pid)
        command = process.command if process.visible else "(other PID namespace)"
        if row is None:
            row = ProcessRow(pid=pid, user=process.user, tag=process.tag or None, command=command, has_agent=False)
            rows.append(row)
        elif not row.has_agent and row.command in (None, "?"):  # a holder the driver named: its words for it
            row.command = command
        if pid in memory:
            row.device_memory_bytes = memory[pid]
        row.sm_percent = busy.get(pid)


@dataclass
class Environment:
    """The environment screen's content (top/environ.py reads it once, when `e` opens the screen)."""

    pid: int
    label: str
    lines: list[str] = field(default_factory=list)  # VAR=value, values redacted
    error: str | None = None  # why there is nothing to show
    top: int = 0  # the first line shown (scrolling)


@dataclass
class ViewState:
    sort_index: int = SORT_KEYS.index(DEFAULT_SORT)
    reversed: bool = False
    selected_key: str | None = None  # the selected row's key (PID, with its host when there are several)
    selected_index: int = 0
    paused: bool = False
    show_help: bool = False
    interval_s: float = 1.0
    filters: Filters = field(default_factory=Filters)
    editing_filter: bool = False  # `/` was pressed: keys type into the filter
    job_key: str | None = None  # the job screen of this process is open
    pending: Pending | None = None
    message: tuple[str, bool, float] | None = None  # (text, is_error, shown until, monotonic)
    unicode: bool = True  # block characters for graphs; ASCII otherwise
    readonly: bool = False  # --readonly: no signal can be sent from this screen
    arrays: ArraysBoard = field(default_factory=ArraysBoard)  # `m` on a job screen: its arrays, read on request
    annotate: Callable[[list[ProcessRow]], None] | None = None  # adds start times and parents (ProcessInfo)
    marked: set[str] = field(default_factory=set)  # keys of the processes marked with space for one signal
    tree: bool = False  # `t`: children under their parent
    environment: Environment | None = None  # the environment screen (`e`) is open
    read_environment: Callable[[ProcessRow], Environment] | None = None  # for `e`; None: not offered
    row_at: dict[int, str] = field(default_factory=dict)  # screen line -> the process row drawn there (mouse)
    # the rows of the last report asked for: a frame, the keys and the history read them again and again
    _rows_of: tuple[MonitorReport, list[ProcessRow]] | None = field(default=None, init=False, repr=False,
                                                                    compare=False)

    @property
    def sort(self) -> SortColumn:
        return SORT_COLUMNS[self.sort_index]

    def report_rows(self, report: MonitorReport) -> list[ProcessRow]:
        """Every process row of `report`, with their start times and parents: made once per report (a report is
        never changed once made), then the same rows."""
        if self._rows_of is not None and self._rows_of[0] is report:
            return self._rows_of[1]
        rows = rows_from_report(report)
        if self.annotate is not None:
            self.annotate(rows)
        self._rows_of = (report, rows)
        return rows

    def listed_rows(self, report: MonitorReport) -> list[ProcessRow]:
        """The process panel's rows, filtered, not yet sorted."""
        return self.filters.rows(report, self.report_rows(report))

    def visible_rows(self, report: MonitorReport) -> list[ProcessRow]:
        """The process panel's rows: filtered, then sorted."""
        return self.sorted_rows(self.listed_rows(report))

    def sorted_rows(self, rows: list[ProcessRow]) -> list[ProcessRow]:
        column = self.sort
        descending = column.descending != self.reversed
        present = [r for r in rows if getattr(r, column.attribute) is not None]
        missing = [r for r in rows if getattr(r, column.attribute) is None]

        def value(row: ProcessRow) -> Any:
            found = getattr(row, column.attribute)
            return found.lower() if isinstance(found, str) else found

        present.sort(key=lambda r: (value(r), r.host or "", r.pid), reverse=descending)
        flat = present + sorted(missing, key=lambda r: (r.host or "", r.pid))  # unknown figures always last
        if self.tree:
            return tree_order(flat)
        for row in flat:
            row.depth = 0
        return flat

    def resolve_selection(self, rows: list[ProcessRow]) -> int | None:
        """Index of the selected row in `rows` (sorted); follows the process, else keeps the position."""
        if not rows:
            self.selected_key = None
            return None
        for index, row in enumerate(rows):
            if row.key == self.selected_key:
                self.selected_index = index
                return index
        self.selected_index = max(0, min(self.selected_index, len(rows) - 1))
        self.selected_key = rows[self.selected_index].key
        return self.selected_index

    def move(self, rows: list[ProcessRow], delta: int) -> None:
        index = self.resolve_selection(rows)
        if index is None:
            return
        self.selected_index = max(0, min(len(rows) - 1, index + delta))
        self.selected_key = rows[self.selected_index].key

    def selected_row(self, rows: list[ProcessRow]) -> ProcessRow | None:
        index = self.resolve_selection(rows)
        return None if index is None else rows[index]

    def say(self, text: str, error: bool = False, now: float | None = None) -> None:
        self.message = (text, error, (time.monotonic() if now is None else now) + MESSAGE_S)

    def current_message(self, now: float | None = None) -> tuple[str, bool] | None:
        if self.message is None:
            return None
        text, error, until = self.message
        if (time.monotonic() if now is None else now) > until:
            self.message = None
            return None
        return text, error


def tree_order(rows: list[ProcessRow]) -> list[ProcessRow]:
    """Each process followed by its listed children (depth first), siblings in the order of `rows`; a
    process whose parent is not listed is a root. Sets each row's `depth`."""
    listed = {(r.host, r.pid) for r in rows}
    children: dict[tuple[str | None, int], list[ProcessRow]] = {}
    roots = []
    for row in rows:
        parent = (row.host, row.parent_pid)
        if row.parent_pid is not None and parent in listed and row.parent_pid != row.pid:
            children.setdefault(parent, []).append(row)
        else:
            roots.append(row)
    ordered: list[ProcessRow] = []
    seen: set[tuple[str | None, int]] = set()
    stack = [(row, 0) for row in reversed(roots)]
    while stack:
        row, depth = stack.pop()
        if (row.host, row.pid) in seen:
            continue
        seen.add((row.host, row.pid))
        row.depth = depth
        ordered.append(row)
        stack += [(child, depth + 1) for child in reversed(children.get((row.host, row.pid), []))]
    # a parent loop (a PID reused as its own ancestor's parent) has no root: list those rows flat, last
    ordered += [r for r in rows if (r.host, r.pid) not in seen]
    return ordered
