"""What tpu-top remembers while it runs: recent figures per device and per job, in bounded rings.

Each series is a fixed-size ring of doubles (8 bytes a sample, NaN for "not
reported"), so memory is bounded by (series x capacity) however long tpu-top
runs. Series of devices and jobs that stopped reporting are dropped once
their last sample has left the window, and the number of series is capped.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.records.devices import Device
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.top.model import ProcessRow, device_memory_fraction

WINDOW_S = 600.0  # the last ten minutes
MAX_SAMPLES = 3600  # per series, whatever the refresh interval
MAX_SUBJECTS = 512  # devices plus jobs remembered at once

DEVICE_SERIES = ("utilization_percent", "memory_percent", "memory_used_bytes")
JOB_SERIES = ("steps_per_second", "step_time_s", "cpu_percent", "rss_bytes")


class Ring:
    """The last `capacity` samples of one figure; None is kept as a gap (NaN)."""

    __slots__ = ("_data", "_next", "_count")

    def __init__(self, capacity: int):
        self._data = array("d", [math.nan]) * capacity
        self._next = 0
        self._count = 0

    @property
    def capacity(self) -> int:
        return len(self._data)

    def append(self, value: float | None) -> None:
        self._data[self._next] = math.nan if value is None else float(value)
        self._next = (self._next + 1) % len(self._data)
        self._count = min(self._count + 1, len(self._data))

    def __len__(self) -> int:
        return self._count

    def values(self, last: int | None = None) -> list[float | None]:
        """Oldest first; at most `last` samples."""
        count = self._count if last is None else max(0, min(last, self._count))
        if count == 0:
            return []
        size = len(self._data)
        start = (self._next - count) % size
        end = start + count
        # Slices of the array, then NaN (which is not equal to itself) back to None: a frame reads many series.
        chunk = self._data[start:end] if end <= size else self._data[start:] + self._data[:end - size]
        return [None if v != v else v for v in chunk]

    def nbytes(self) -> int:
        return self._data.itemsize * len(self._data)


@dataclass
class Subject:
    """The series of one device or one job, and when it last reported."""

    series: dict[str, Ring]
    last_seen: int = 0  # the sample number of its last report
    info: dict[str, Any] = field(default_factory=dict)


class History:
    """Figures of every device and job over the last `WINDOW_S` seconds at `interval_s` per sample."""

    def __init__(self, interval_s: float, window_s: float = WINDOW_S, max_subjects: int = MAX_SUBJECTS):
        self.capacity = max(2, min(MAX_SAMPLES, int(math.ceil(window_s / max(interval_s, 1e-3)))))
        self.max_subjects = max_subjects
        self.devices: dict[str, Subject] = {}
        self.jobs: dict[str, Subject] = {}
        self.samples = 0
        self._last_sequence: object = None

    def _subject(self, table: dict[str, Subject], key: str, names: Iterable[str]) -> Subject:
        subject = table.get(key)
        if subject is None:
            subject = table[key] = Subject({name: Ring(self.capacity) for name in names})
            # A new subject starts with gaps up to now, so that every series of a table lines up in time.
            for ring in subject.series.values():
                for _ in range(min(self.samples - 1, self.capacity)):  # the samples before this one
                    ring.append(None)
        subject.last_seen = self.samples
        return subject

    def record(self, report: MonitorReport, rows: list[ProcessRow]) -> bool:
        """Add one sample from `report` (once per report: a repeated one is ignored). True if added."""
        marker = (report.hostname, report.sequence, report.time_unix_s)
        if marker == self._last_sequence and report.time_unix_s:  # a report with no time (a blank header) is new
            return False
        self._last_sequence = marker
        self.samples += 1
        seen: set[tuple[str, str]] = set()
        for device in report.devices.devices if report.devices is not None else []:
            key = device_key(device)
            subject = self._subject(self.devices, key, DEVICE_SERIES)
            fraction = device_memory_fraction(device)
            subject.series["utilization_percent"].append(device.utilization_percent)
            subject.series["memory_percent"].append(None if fraction is None else 100.0 * fraction)
            subject.series["memory_used_bytes"].append(device.memory_used_or_live_bytes())
            seen.add(("d", key))
        for row in rows:
            key = row.key
            subject = self._subject(self.jobs, key, JOB_SERIES)
            steps = row.agent.steps if row.agent is not None else None
            subject.series["steps_per_second"].append(row.steps_per_second)
            subject.series["step_time_s"].append(steps.last_step_time_s if steps is not None else None)
            subject.series["cpu_percent"].append(row.cpu_percent)
            subject.series["rss_bytes"].append(row.rss_bytes)
            seen.add(("j", key))
        for kind, table in (("d", self.devices), ("j", self.jobs)):
            for key, subject in list(table.items()):
                if (kind, key) not in seen:
                    for ring in subject.series.values():
                        ring.append(None)
                    if self.samples - subject.last_seen >= self.capacity:
                        del table[key]  # nothing of it is left in the window
        self._cap()
        return True

    def _cap(self) -> None:
        excess = len(self.devices) + len(self.jobs) - self.max_subjects
        if excess <= 0:
            return
        # Forget the subjects that reported longest ago first.
        everything = sorted([(s.last_seen, t, k) for t in (self.devices, self.jobs) for k, s in t.items()],
                            key=lambda item: item[0])
        for _, table, key in everything[:excess]:
            del table[key]

    def device(self, key: str, name: str, last: int | None = None) -> list[float | None]:
        subject = self.devices.get(key)
        return subject.series[name].values(last) if subject else []

    def job(self, key: str, name: str, last: int | None = None) -> list[float | None]:
        subject = self.jobs.get(key)
        return subject.series[name].values(last) if subject else []

    def nbytes(self) -> int:
        """The samples' memory (the rings); the dictionaries around them add a few hundred bytes a subject."""
        return sum(ring.nbytes() for table in (self.devices, self.jobs) for s in table.values()
                   for ring in s.series.values())


def device_key(device: Device) -> str:
    host = device.host_name()
    return f"{host}/{device.key}" if host else device.key


def device_graph_series(device: Device) -> tuple[str, float | None]:
    """What a device's one-line graph shows, with its full scale: utilization, else memory as a share of the
    total, else memory used scaled to its own maximum (a platform that reports no total, as the CPU)."""
    if device.utilization_percent is not None:
        return "utilization_percent", 100.0
    if device_memory_fraction(device) is not None:
        return "memory_percent", 100.0
    return "memory_used_bytes", None
