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
    """The values of a bounded deque in ascending order, brought up to date with what was appended since the
    last call rather than sorted again: a monitor asks 10 times a second while a job marks a few steps in
    between, and sorting all 1,024 step times each time cost the agent's thread about 0.1 ms of the job's CPU."""

    def __init__(self) -> None:
        self._window: list[float] = []  # the deque's values at the last update, oldest first
        self._sorted: list[float] = []
        self._appended = 0  # how many values had been appended to the deque by then

    def update(self, window: list[float], appended: int) -> list[float]:
        """The values of `window` (the deque's values now, oldest first, `appended` of them appended ever) in
        ascending order. The list returned is the window's own: read it, do not change it."""
        new = appended - self._appended
        if not (0 <= new < len(window) and new <= _RESORT_ABOVE and self._drop(len(self._window) + new - len(window))):
            self._sorted = sorted(window)
        else:
            for value in window[len(window) - new:]:
                insort(self._sorted, value)
        self._window, self._appended = window, appended
        return self._sorted

    def _drop(self, evicted: int) -> bool:
        """Take out the `evicted` oldest values of the last window; False where one is not found (a NaN)."""
        if evicted < 0:
            return False
        for value in self._window[:evicted]:
            index = bisect_left(self._sorted, value)
            if index == len(self._sorted) or self._sorted[index] != value:
                return False
            del self._sorted[index]
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
        self._sorted_times = SortedWindow()
        self._lock = threading.Lock()  # guards the counters and deques against steps marked from several threads
        self._stats_lock = threading.Lock()  # guards _sorted_times against stats asked from several threads
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
        self._stats_lock = threading.Lock()

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
        with self._lock:  # one consistent view, copied at C speed
            window, timed, ends, count = list(self._times), self._timed, list(self._ends), self._count
        now = time.perf_counter() if now is None else now
        with self._stats_lock:
            times = self._sorted_times.update(window, timed)
            p50, p99 = percentile(times, 0.50), percentile(times, 0.99)
        last = window[-1] if window else None
        rate = None
        if ends:
            window_start = now - _RATE_WINDOW_S
            if ends[0] > window_start:  # the window is not full yet: intervals between the ends we have
                rate = (len(ends) - 1) / (now - ends[0]) if len(ends) > 1 and now > ends[0] else None
            else:  # the ends are in time order: those after the window's start are the last ones
                rate = (len(ends) - bisect_right(ends, window_start)) / _RATE_WINDOW_S
        return StepStats(
            count=count,
            steps_per_second=rate,
            last_step_time_s=last,
            p50_step_time_s=p50,
            p99_step_time_s=p99,
            last_step_age_s=(now - ends[-1]) if ends else None,
        )


_process = StepTracker()
os.register_at_fork(after_in_child=_process.after_fork)


def process_steps() -> StepTracker:
    """The tracker `tpu_tools.agent.step()` marks in this process."""
    return _process
