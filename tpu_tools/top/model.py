"""What tpu-top shows, taken from a monitor report, and the state the keys change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    detail: dict[str, Any] = field(default_factory=dict)  # the agent entry, for the selected-process lines


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
)
SORT_KEYS = tuple(c.key for c in SORT_COLUMNS)
DEFAULT_SORT = "devmem"


def rows_from_report(report: dict[str, Any]) -> list[ProcessRow]:
    processes = report.get("processes") or {}
    rows = []
    for agent in processes.get("agents") or []:
        compiles = agent.get("compiles") or {}
        steps = agent.get("steps") or {}
        rows.append(ProcessRow(
            pid=agent["pid"], user=agent.get("user"), tag=agent.get("tag"), command=agent.get("command"),
            cpu_percent=agent.get("cpu_percent"), rss_bytes=agent.get("rss_bytes"),
            device_memory_bytes=agent.get("device_memory_used_bytes"),
            compiles=compiles.get("compile_count"), recompiles=compiles.get("recompile_count"),
            steps_per_second=steps.get("steps_per_second"), error=agent.get("error"), detail=agent,
        ))
    for holder in processes.get("holders") or []:
        rows.append(ProcessRow(
            pid=holder["pid"], user=holder.get("user"), tag=None, command=holder.get("command"),
            cpu_percent=holder.get("cpu_percent"), rss_bytes=holder.get("rss_bytes"), has_agent=False,
            detail=holder,
        ))
    _add_gpu_processes(rows, report)
    return rows


def _add_gpu_processes(rows: list[ProcessRow], report: dict[str, Any]) -> None:
    """Every process NVML lists on a GPU, agent or not, with the GPU memory it holds (the card's own figure)."""
    memory: dict[int, int] = {}
    listed: dict[int, dict[str, Any]] = {}
    for gpu in (report.get("nvml") or {}).get("gpus") or []:
        for process in gpu.get("processes") or []:
            listed.setdefault(process["pid"], process)
            if process.get("gpu_memory_bytes") is not None:
                memory[process["pid"]] = memory.get(process["pid"], 0) + process["gpu_memory_bytes"]
    by_pid = {row.pid: row for row in rows}
    for pid, process in listed.items():
        row = by_pid.get(pid)
        if row is None:
            command = process.get("command") if process.get("visible", True) else "(other PID namespace)"
            row = ProcessRow(pid=pid, user=process.get("user"), tag=process.get("tag"), command=command,
                             has_agent=False, detail=process)
            rows.append(row)
        if pid in memory:
            row.device_memory_bytes = memory[pid]


@dataclass
class ViewState:
    sort_index: int = SORT_KEYS.index(DEFAULT_SORT)
    reversed: bool = False
    selected_pid: int | None = None
    selected_index: int = 0
    paused: bool = False
    show_help: bool = False
    interval_s: float = 1.0

    @property
    def sort(self) -> SortColumn:
        return SORT_COLUMNS[self.sort_index]

    def sorted_rows(self, rows: list[ProcessRow]) -> list[ProcessRow]:
        column = self.sort
        descending = column.descending != self.reversed
        present = [r for r in rows if getattr(r, column.attribute) is not None]
        missing = [r for r in rows if getattr(r, column.attribute) is None]

        def value(row: ProcessRow) -> Any:
            found = getattr(row, column.attribute)
            return found.lower() if isinstance(found, str) else found

        present.sort(key=lambda r: (value(r), r.pid), reverse=descending)
        return present + sorted(missing, key=lambda r: r.pid)  # unknown figures always last

    def resolve_selection(self, rows: list[ProcessRow]) -> int | None:
        """Index of the selected row in `rows` (sorted); follows the PID, else keeps the position."""
        if not rows:
            self.selected_pid = None
            return None
        for index, row in enumerate(rows):
            if row.pid == self.selected_pid:
                self.selected_index = index
                return index
        self.selected_index = max(0, min(self.selected_index, len(rows) - 1))
        self.selected_pid = rows[self.selected_index].pid
        return self.selected_index

    def move(self, rows: list[ProcessRow], delta: int) -> None:
        index = self.resolve_selection(rows)
        if index is None:
            return
        self.selected_index = max(0, min(len(rows) - 1, index + delta))
        self.selected_pid = rows[self.selected_index].pid


QUIT = "quit"
REDRAW = "redraw"
IGNORED = "ignored"


def handle_key(state: ViewState, key: str, rows: list[ProcessRow]) -> str:
    """Apply one key (a character, or "up"/"down"/"home"/"end"/"pageup"/"pagedown") to the state."""
    if state.show_help:
        state.show_help = False  # any key closes the help; q also quits
        return QUIT if key == "q" else REDRAW
    ordered = state.sorted_rows(rows)
    if key == "q":
        return QUIT
    if key in ("up", "k"):
        state.move(ordered, -1)
    elif key in ("down", "j"):
        state.move(ordered, 1)
    elif key == "pageup":
        state.move(ordered, -10)
    elif key == "pagedown":
        state.move(ordered, 10)
    elif key == "home":
        state.move(ordered, -len(ordered))
    elif key == "end":
        state.move(ordered, len(ordered))
    elif key == "s":
        state.sort_index = (state.sort_index + 1) % len(SORT_COLUMNS)
    elif key == "S":
        state.sort_index = (state.sort_index - 1) % len(SORT_COLUMNS)
    elif key == "r":
        state.reversed = not state.reversed
    elif key == "p":
        state.paused = not state.paused
    elif key in ("h", "?"):
        state.show_help = True
    else:
        return IGNORED
    return REDRAW
