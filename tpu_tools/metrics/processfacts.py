"""Facts a process keeps while it lives (its Slurm job, its container), read again only after a while.

A monitor polling 10 times a second read two /proc files of every agent's process in every round for
them, about 0.25 ms of its CPU per process while the job it watches runs beside it. A process's
environment is fixed when it starts, and a container's processes stay in its cgroup, so each fact is
kept per PID for `max_age_s` (a moved process is seen within that time) and forgotten with the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Generic, TypeVar

_T = TypeVar("_T")

FACT_MAX_AGE_S = 10.0


class ProcessFacts(Generic[_T]):
    """`read(pid)`, kept per PID for `max_age_s` seconds; what the caller forgets is read afresh."""

    def __init__(self, read: Callable[[int], _T], max_age_s: float = FACT_MAX_AGE_S):
        self._read = read
        self._max_age_s = max_age_s
        self._known: dict[int, tuple[float, _T]] = {}  # pid -> (when read, the fact)

    def get(self, pid: int) -> _T:
        now = time.monotonic()
        known = self._known.get(pid)
        if known is None or now - known[0] >= self._max_age_s:
            known = (now, self._read(pid))
            self._known[pid] = known
        return known[1]

    def forget_except(self, pids: Collection[int]) -> None:
        """Drop the facts of every other process: a PID that ends and is reused is read again."""
        for pid in [pid for pid in self._known if pid not in pids]:
            del self._known[pid]
