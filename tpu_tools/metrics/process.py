"""CPU, memory and threads of processes, through psutil.

`SelfSampler` serves the agent inside a workload: its CPU % is measured over a
recent window of its own requests, so several clients polling at different
rates do not reset each other's baseline. `ProcessSampler` serves the monitor
and tpu-top for processes without an agent (device holders), keeping one
psutil handle per PID so CPU % is measured between refreshes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import psutil

_MIN_WINDOW_S = 0.2  # CPU % over less than this is mostly noise
_KEEP_SAMPLES_S = 30.0


@dataclass
class ProcessFigures:
    pid: int
    cpu_percent: float | None
    cpu_time_s: float | None
    rss_bytes: int | None
    threads: int | None
    user: str | None = None
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_seconds(times: Any) -> float:  # psutil.Process.cpu_times(): a named tuple per platform
    return float(times.user + times.system)


class SelfSampler:
    """Figures of the current process, CPU % over the last >= 0.2 s of requests (else since start).

    On Linux one read of /proc/self/stat gives CPU time, threads and RSS (psutil reads three files
    for them): the agent answers inside a busy job, so its answer is kept small. The file stays open
    and is read again from its start (procfs makes it anew at each read): opening it cost more than
    reading it (150 against 55 us of CPU with cold caches, at 10 requests a second).
    """

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        self._started = self._process.create_time()
        self._ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page_bytes = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._samples: deque[tuple[float, float]] = deque(maxlen=256)
        self._stat_fd = -1
        self._stat_pid = -1  # the process whose stat file _stat_fd is (a forked child must open its own)
        self._last: ProcessFigures | None = None
        self._last_at = 0.0

    def _read_stat(self) -> bytes:
        if self._stat_pid != os.getpid():
            self.close()
            self._stat_fd = os.open("/proc/self/stat", os.O_RDONLY)  # not inherited by the programs it runs
            self._stat_pid = os.getpid()
        return os.pread(self._stat_fd, 4096, 0)

    def _read(self) -> tuple[float, int, int]:
        """(CPU seconds, RSS bytes, threads) of this process."""
        try:
            fields = self._read_stat().rsplit(b")", 1)[1].split()
            # After the command: state is field 3 of proc(5); utime 14, stime 15, num_threads 20, rss 24.
            cpu = (int(fields[11]) + int(fields[12])) / self._ticks_per_s
            return cpu, int(fields[21]) * self._page_bytes, int(fields[17])
        except (OSError, IndexError, ValueError, AttributeError):  # not Linux (no os.pread), or no /proc
            process = self._process
            with process.oneshot():
                return _cpu_seconds(process.cpu_times()), process.memory_info().rss, process.num_threads()

    def close(self) -> None:
        """Close the stat file (a forked child drops its parent's sampler with it)."""
        if self._stat_fd >= 0:
            try:
                os.close(self._stat_fd)
            except OSError:
                pass
        self._stat_fd, self._stat_pid = -1, -1

    def sample(self, max_age_s: float = 0.0) -> ProcessFigures:
        """The process's figures now, or those of the last call when it is less than `max_age_s` old."""
        now = time.monotonic()
        if self._last is not None and now - self._last_at < max_age_s and self._last.pid == os.getpid():
            return self._last
        cpu, rss, threads = self._read()
        percent = None
        for at, then in reversed(self._samples):
            if now - at >= _MIN_WINDOW_S:
                percent = 100.0 * (cpu - then) / (now - at)
                break
        if percent is None:
            lifetime = time.time() - self._started
            percent = 100.0 * cpu / lifetime if lifetime > 0 else None
        self._samples.append((now, cpu))
        while self._samples and now - self._samples[0][0] > _KEEP_SAMPLES_S:
            self._samples.popleft()
        self._last, self._last_at = ProcessFigures(os.getpid(), percent, cpu, rss, threads), now
        return self._last


class ProcessSampler:
    """Figures of other processes, CPU % between successive calls for the same PID."""

    def __init__(self) -> None:
        self._handles: dict[int, psutil.Process] = {}

    def sample(self, pid: int) -> ProcessFigures | None:
        """None when the process is gone or cannot be read at all."""
        handle = self._handles.get(pid)
        try:
            if handle is None or not handle.is_running():  # is_running also catches a reused PID
                handle = psutil.Process(pid)
                self._handles[pid] = handle
                first = True
            else:
                first = False
            with handle.oneshot():
                percent = handle.cpu_percent(None)
                cpu = _cpu_seconds(handle.cpu_times())
                rss = handle.memory_info().rss
                threads = handle.num_threads()
                user = _safe(handle.username)
                command = " ".join(_safe(handle.cmdline) or []) or _safe(handle.name)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._handles.pop(pid, None)
            return None
        except psutil.AccessDenied:
            return ProcessFigures(pid, None, None, None, None)
        return ProcessFigures(pid, None if first else percent, cpu, rss, threads, user, command)

    def forget_except(self, pids: set[int]) -> None:
        for pid in set(self._handles) - pids:
            del self._handles[pid]


_T = TypeVar("_T")


def _safe(getter: Callable[[], _T]) -> _T | None:
    try:
        return getter()
    except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None
