"""Device memory by allocation on a job's screen: `m` asks that job's agent once, in the background.

The agent reads its arrays on the `arrays` request only (tpu_tools.agent.arrays), which can take a
second on a job with many arrays, so the request runs on a thread of its own and the keys never wait
for it. Nothing is asked between two presses of `m`: the screen shows the last read with its time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tpu_tools.errors import first_line
from tpu_tools.metrics import wire
from tpu_tools.metrics.agent_client import query_snapshot
from tpu_tools.metrics.records.agent import AgentSnapshot, Arrays
from tpu_tools.shorten import shorten
from tpu_tools.top.drawing import DIM, ERROR, NORMAL, TITLE, Column, Line, column_header, layout, table_row
from tpu_tools.units import format_bytes

ASK_TIMEOUT_S = 10.0  # the agent bounds its own read to about half a second; this covers a busy job
MAX_ARRAY_ROWS = 10
MAX_SITE_ROWS = 8

Ask = Callable[[int], AgentSnapshot]  # PID -> the agent's answer to the arrays request


def ask_agent(pid: int) -> AgentSnapshot:
    return query_snapshot(pid, ASK_TIMEOUT_S, request=wire.REQUEST_ARRAYS)


@dataclass(frozen=True)
class ArraysRead:
    """One read of a job's arrays: still under way (`finished_unix_s` None), answered, or failed."""

    pid: int
    asked_unix_s: float
    finished_unix_s: float | None = None
    report: Arrays | None = None  # the agent's arrays_report
    error: str | None = None

    @property
    def pending(self) -> bool:
        return self.finished_unix_s is None


class ArraysBoard:
    """The last arrays read of each job asked with `m`; at most one read under way per job."""

    def __init__(self, ask: Ask = ask_agent):
        self._ask = ask
        self._lock = threading.Lock()
        self._reads: dict[str, ArraysRead] = {}
        self.version = 0  # +1 whenever a read starts or ends: the screen redraws when it changes

    def read(self, key: str) -> ArraysRead | None:
        with self._lock:
            return self._reads.get(key)

    def pending(self) -> bool:
        """Whether a read is under way (its end changes the screen)."""
        with self._lock:
            return any(read.pending for read in self._reads.values())

    def ask(self, key: str, pid: int) -> bool:
        """Start reading the arrays of process `pid` (row `key`); False when a read of it is under way."""
        with self._lock:
            current = self._reads.get(key)
            if current is not None and current.pending:
                return False
            self._reads[key] = ArraysRead(pid, time.time())
            self.version += 1
        threading.Thread(target=self._run, args=(key, pid), name="tpu-top-arrays", daemon=True).start()
        return True

    def _run(self, key: str, pid: int) -> None:
        asked = self.read(key)
        report: Arrays | None = None
        error: str | None = None
        try:
            answer = self._ask(pid)
            report = answer.arrays_report
            if report is None:
                error = answer.arrays_error or "the agent read no arrays"
        except Exception as exc:  # noqa: BLE001 any failure of one job's agent is that job's one line, never the screen's
            error = first_line(exc)
        with self._lock:
            self._reads[key] = ArraysRead(pid, asked.asked_unix_s if asked else time.time(), time.time(), report,
                                          error)
            self.version += 1


def arrays_lines(read: ArraysRead | None, width: int) -> list[Line]:
    """The job screen's device-memory-by-allocation section: a hint, the read under way, its error, or its
    tables (largest arrays by shape, dtype, sharding and source line; largest allocation sites)."""
    if read is None:  # nothing asked yet: the footer's "m arrays" offers it, and the screen keeps its room
        return []
    title = Line().add(" Memory by allocation", TITLE)
    if read.pending:
        return [Line(), title.add(f"  asking the agent of {read.pid} (since {_clock(read.asked_unix_s)})...", DIM)]
    when = f"  read at {_clock(read.finished_unix_s)}"
    if read.error is not None:
        return [Line(), title.add(when, DIM), Line().add(shorten(f"  {read.error}", width), ERROR)]
    report = read.report or Arrays()
    arrays = report.arrays or []
    took = report.elapsed_s
    title.add(f"{when} in {took:.2f} s, {report.arrays_looked_at or 0} arrays looked at" if took is not None
              else when, DIM)
    if report.truncated:
        title.add("  (stopped at its bound: the figures are partial)", ERROR)
    lines = [Line(), title]
    columns = layout([Column("bytes", "BYTES", 10, right=True), Column("count", "#", 5, right=True),
                      Column("shape", "SHAPE", 14, priority=0, flex_max=24),
                      Column("dtype", "DTYPE", 8, priority=1),
                      Column("sharding", "SHARDING", 14, priority=3, flex_max=40),
                      Column("source", "MADE AT", 16, priority=2, flex_max=1000)], width)
    if not arrays:
        lines.append(Line().add("  no live arrays", DIM))
    else:
        lines.append(column_header(columns))
        for group in arrays[:MAX_ARRAY_ROWS]:
            lines.append(table_row(columns, {
                "bytes": (format_bytes(group.bytes), NORMAL), "count": (_text(group.count), NORMAL),
                "shape": (_text(group.shape), NORMAL), "dtype": (_text(group.dtype), NORMAL),
                "sharding": (_text(group.sharding), NORMAL),
                "source": (_short_source(group.source) or "(no traceback)", NORMAL if group.source else DIM)}))
        if len(arrays) > MAX_ARRAY_ROWS:
            lines.append(Line().add(f"  ... {len(arrays) - MAX_ARRAY_ROWS} more groups (tpu-monitor --arrays)", DIM))
    sites = report.sites or []
    lines.append(Line().add(" Allocation sites", TITLE).add("  JAX's device memory profile, by source line", DIM))
    if report.sites_error:
        lines.append(Line().add(f"  {report.sites_error}"[:width], ERROR))
    elif not sites:
        lines.append(Line().add("  none", DIM))
    for site in sites[:MAX_SITE_ROWS]:
        lines.append(Line().add(f"  {format_bytes(site.bytes):>10} {_text(site.count):>5}  ")
                     .add(_short_source(site.source) or "?"))
    return lines


def _text(value: object) -> str:
    """A figure or word of the answer; empty where the agent sent none."""
    return "" if value is None else str(value)


def _short_source(source: str | None) -> str:
    """A source line without its directory: "job.py:13 (<module>)" (the full path is in tpu-monitor --arrays)."""
    if not source:
        return ""
    text = str(source)
    head, _, tail = text.partition(" (")
    return head.rsplit("/", 1)[-1] + (f" ({tail}" if tail else "")


def _clock(unix_s: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix_s or 0))
