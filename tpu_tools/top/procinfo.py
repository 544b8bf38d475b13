"""Start time and parent of this host's listed processes, read once per PID.

A process's start time never changes and its parent rarely does, so each PID
costs one /proc read when it first appears and none on later refreshes; PIDs
that leave the list are forgotten, so a reused PID is read afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from tpu_tools.top.model import ProcessRow


@dataclass(frozen=True)
class Known:
    started_unix_s: float | None
    parent_pid: int | None


class ProcessInfo:
    def __init__(self) -> None:
        self._known: dict[int, Known] = {}

    def _read(self, pid: int) -> Known:
        try:
            process = psutil.Process(pid)  # reads the start time to tell a reused PID apart
            return Known(process.create_time(), process.ppid())
        except (psutil.Error, OSError, ValueError):  # gone, or in another PID namespace
            return Known(None, None)

    def annotate(self, rows: list[ProcessRow]) -> None:
        """Fill the start time and parent of each local row (a remote host's PIDs are not ours to read)."""
        local = {row.pid for row in rows if row.host is None}
        for pid in [p for p in self._known if p not in local]:
            del self._known[pid]
        for row in rows:
            if row.host is not None:
                continue
            known = self._known.get(row.pid)
            if known is None:
                known = self._known[row.pid] = self._read(row.pid)
            row.started_unix_s = known.started_unix_s
            row.parent_pid = known.parent_pid

    def __len__(self) -> int:
        return len(self._known)
