"""Reports gathered in the background, so that a slow source never holds up the keys.

A `Collector` runs `collect()` (any callable that returns a report: the local
`ReportBuilder.build`, or another source such as a fleet reader) on its own
thread every `interval_s`, and keeps the last report. The screen redraws from
`latest()` whenever it likes; a source that takes seconds (a libtpu service at
its deadline, an agent that never answers) only makes the figures older.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tpu_tools.errors import first_line
from tpu_tools.metrics.records.report import MonitorReport, waiting_report

Collect = Callable[[], MonitorReport]


@dataclass(frozen=True)
class Snapshot:
    report: MonitorReport
    sequence: int  # 1 for the first report, +1 for each new one
    collect_s: float  # how long collect() took
    error: str | None = None  # collect() raised: the report is the previous one


class Collector:
    def __init__(self, collect: Collect, interval_s: float):
        self._collect = collect
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._paused = False
        self._next_due = 0.0  # monotonic: when the next report starts to be gathered (0: at once)
        self._thread = threading.Thread(target=self._run, name="tpu-top-collector", daemon=True)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot

    def wait_first(self, timeout_s: float) -> Snapshot | None:
        deadline = time.monotonic() + timeout_s
        while self.latest() is None and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)
        return self.latest()

    def next_due(self) -> float | None:
        """When (time.monotonic()) the next report starts to be gathered: past while one is being gathered (or is
        late); None while paused."""
        return None if self._paused else self._next_due

    def pause(self, paused: bool) -> None:
        """While paused no report is gathered; resuming gathers one at once."""
        self._paused = paused
        if not paused:
            self._wake.set()

    def close(self, timeout_s: float = 0.5) -> None:
        # The thread is a daemon: a source stuck beyond `timeout_s` does not hold up the exit.
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if not self._paused:
                self._one()
                self._next_due = started + self.interval_s
            # The next report is due one interval after this one started; a slow one starts the next at once.
            self._wake.wait(max(0.0, self.interval_s - (time.monotonic() - started)) if not self._paused else None)
            self._wake.clear()

    def _one(self) -> None:
        started = time.monotonic()
        previous = self.latest()
        try:
            report = self._collect()
            error = None
        except Exception as exc:  # noqa: BLE001 the screen shows the error and keeps the last figures
            if previous is None:
                report = waiting_report()
            else:
                report = previous.report
            error = first_line(exc)
        snapshot = Snapshot(report, (previous.sequence if previous else 0) + 1, time.monotonic() - started, error)
        with self._lock:
            self._snapshot = snapshot
