"""Step marking: the training loop says where a step ends; nothing else runs between steps.

`process_steps()` is the one tracker of this process: `tpu_tools.agent.step()`
marks it, the agent serves its figures and the profiler's step window listens
to it (`on_step`).

Works with or without the agent server: `step()` only reads a clock and appends
to bounded deques, so a loop can call it every iteration. Statistics (rate,
percentiles) are computed when someone asks (`StepTracker.stats`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

StepCallback = Callable[[int, "float | None"], None]

_RECENT_STEPS = 1024  # step times kept for percentiles
_RATE_WINDOW_S = 10.0  # steps/s is measured over the last this many seconds
_RESORT_ABOVE = 256  # more new step times than this since the last stats: sort them all again

_log = logging.getLogger("tpu_tools.agent")


def _nothing() -> None:
    """What unregisters a callback that was never registered."""


@dataclass
class StepStats:
    """A job's steps: how many were marked, the rate lately and the step times (seconds; None when unknown)."""

    count: int
    steps_per_second: float | None
    last_step_time_s: float | None
    p50_step_time_s: float | None
    p99_step_time_s: float | None
    last_step_age_s: float | None  # seconds since the last step ended

    def to_dict(self) -> dict[str, float | int | None]:
        """The figures as the agent's snapshot carries them under "steps"."""
        return dict(vars(self))


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when empty."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, int(round(fraction * (len(sorted_values) - 1)))))
    return sorted_values[rank]


class SortedWindow:
    """The values of a bounded deque in ascending order, kept up to date from the values appended to it since the
    last call: only those are read (from the deque's right end) and inserted, and those they pushed out of the
    deque are taken out. A monitor asks 10 times a second while a job marks a few steps in between; copying or
    sorting all 1,024 step times each time touched every one of them, which the job's steps in between had
    evicted from the CPU's caches: most of the statistics' cost to the job."""

    def __init__(self, capacity: int) -> None:
        self._mirror: deque[float] = deque(maxlen=capacity)  # the deque's values at the last update, oldest first
        self._sorted: list[float] = []
        self._appended = 0  # how many values had been appended to the deque by then

    def update(self, source: deque[float], appended: int) -> list[float]:
        """The values of `source` (a deque of this window's capacity, `appended` values appended to it ever) in
        ascending order. The list returned is the window's own: read it, do not change it."""
        new = appended - self._appended
        if not (0 <= new <= min(len(source), _RESORT_ABOVE) and self._take_in(source, new)):
            self._mirror = deque(source, maxlen=self._mirror.maxlen)
            self._sorted = sorted(source)
        self._appended = appended
        return self._sorted

    def _take_in(self, source: deque[float], new: int) -> bool:
        """Insert the `new` last values of `source`, taking out the oldest ones as the deque did; False where one
        to take out is not found (a NaN), the window then being out of step."""
        mirror, ordered = self._mirror, self._sorted
        for back in range(new, 0, -1):
            if len(mirror) == mirror.maxlen:
                oldest = mirror.popleft()
                index = bisect_left(ordered, oldest)
                if index == len(ordered) or ordered[index] != oldest:
                    return False
                del ordered[index]
            value = source[-back]
            mirror.append(value)
            insort(ordered, value)
        return True


class StepTracker:
    """Counts step boundaries, keeps recent step times, calls the registered callbacks."""

    def __init__(self) -> None:
        self._count = 0
        self._last_end: float | None = None
        self._times: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._ends: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._callbacks: list[StepCallback] = []
        self._timed = 0  # step times appended to _times, ever
        self._sorted_times = SortedWindow(_RECENT_STEPS)
        # guards the counters, the deques and _sorted_times against steps marked and stats asked from several threads
        self._lock = threading.Lock()
        self.callback_errors: list[str] = []  # one line per callback disabled because it raised

    def on_step(self, callback: StepCallback) -> Callable[[], None]:
        """Call `callback(step_index, step_time_s)` at every step boundary; returns a function that removes it.

        What is not callable is refused here, not at the next step of the job: reported (a warning) and
        never called; nothing raises into the job.
        """
        if not callable(callback):
            _log.warning("on_step needs a callable (index, step_time_s), got %s; it is ignored",
                         type(callback).__name__)
            return _nothing
        self._callbacks.append(callback)

        def remove() -> None:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass

        return remove

    def step(self, step_time_s: float | None = None) -> int:
        """Mark the end of a step; returns its index (0 for the first).

        The step time is the time since the previous boundary unless given
        (the context manager gives the time of its block).
        """
        with self._lock:  # the clock is read inside: step ends are appended in time order
            now = time.perf_counter()
            index = self._count
            self._count += 1
            if step_time_s is None and self._last_end is not None:
                step_time_s = now - self._last_end
            self._last_end = now
            if step_time_s is not None:
                self._times.append(step_time_s)
                self._timed += 1
            self._ends.append(now)
        for callback in list(self._callbacks):
            try:
                callback(index, step_time_s)
            except Exception as error:  # noqa: BLE001 never into the training loop: the callback is reported and disabled
                self._disable(callback, index, error)
        return index

    def _disable(self, callback: StepCallback, index: int, error: Exception) -> None:
        try:
            self._callbacks.remove(callback)
        except ValueError:  # another thread disabled it first
            return
        try:
            name = str(getattr(callback, "__qualname__", None) or type(callback).__name__)
            reason = f"{type(error).__name__}: {error}"
        except Exception:  # noqa: BLE001 an exception whose str() raises too
            name, reason = type(callback).__name__, type(error).__name__
        line = f"step callback {name} raised at step {index} ({reason}); it is disabled"[:500]
        self.callback_errors.append(line)
        _log.warning("%s", line)

    def after_fork(self) -> None:
        """In a forked child: a lock another thread of the parent held would never be released."""
        self._lock = threading.Lock()

    @contextmanager
    def context(self) -> Iterator[None]:
        """Time the block as one step and mark its end (the step time excludes the time between blocks)."""
        start = time.perf_counter()
        yield
        self.step(time.perf_counter() - start)

    @property
    def count(self) -> int:
        return self._count

    def stats(self, now: float | None = None) -> StepStats:
        """Count, rate over the last 10 s, last/p50/p99 step time and age of the last step (None if unknown)."""
        now = time.perf_counter() if now is None else now
        window_start = now - _RATE_WINDOW_S
        # Read in place, under the lock the steps are marked with: only the step times appended since the last
        # call and a few probes of the step ends are touched, not every value kept (see SortedWindow).
        with self._lock:
            count, times, ends = self._count, self._times, self._ends
            ordered = self._sorted_times.update(times, self._timed)
            p50, p99 = percentile(ordered, 0.50), percentile(ordered, 0.99)
            last = times[-1] if times else None
            kept, first_end, last_end = len(ends), ends[0] if ends else None, ends[-1] if ends else None
            # the ends are in time order: those after the window's start are the last ones
            in_window = kept - bisect_right(ends, window_start) if ends else 0
        rate = None
        if first_end is not None and first_end > window_start:  # the window is not full yet: the ends we have
            rate = (kept - 1) / (now - first_end) if kept > 1 and now > first_end else None
        elif first_end is not None:
            rate = in_window / _RATE_WINDOW_S
        return StepStats(
            count=count,
            steps_per_second=rate,
            last_step_time_s=last,
            p50_step_time_s=p50,
            p99_step_time_s=p99,
            last_step_age_s=(now - last_end) if last_end is not None else None,
        )


_process = StepTracker()
os.register_at_fork(after_in_child=_process.after_fork)


def process_steps() -> StepTracker:
    """The tracker `tpu_tools.agent.step()` marks in this process."""
    return _process
