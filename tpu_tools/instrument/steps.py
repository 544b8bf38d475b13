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
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

StepCallback = Callable[[int, "float | None"], None]

_RECENT_STEPS = 1024  # step times kept for percentiles
_RATE_WINDOW_S = 10.0  # steps/s is measured over the last this many seconds

_log = logging.getLogger("tpu_tools.agent")


@dataclass
class StepStats:
    count: int
    steps_per_second: float | None
    last_step_time_s: float | None
    p50_step_time_s: float | None
    p99_step_time_s: float | None
    last_step_age_s: float | None  # seconds since the last step ended

    def to_dict(self) -> dict[str, float | int | None]:
        return dict(vars(self))


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when empty."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, int(round(fraction * (len(sorted_values) - 1)))))
    return sorted_values[rank]


class StepTracker:
    """Counts step boundaries, keeps recent step times, calls the registered callbacks."""

    def __init__(self) -> None:
        self._count = 0
        self._last_end: float | None = None
        self._times: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._ends: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._callbacks: list[StepCallback] = []
        self._lock = threading.Lock()  # guards the counter against steps marked from several threads
        self.callback_errors: list[str] = []  # one line per callback disabled because it raised

    def on_step(self, callback: StepCallback) -> Callable[[], None]:
        """Call `callback(step_index, step_time_s)` at every step boundary; returns a function that removes it.

        What is not callable is refused here (TypeError), not at the next step of the job.
        """
        if not callable(callback):
            raise TypeError(f"on_step needs a callable (index, step_time_s), got {type(callback).__name__}")
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
        now = time.perf_counter()
        with self._lock:
            index = self._count
            self._count += 1
            if step_time_s is None and self._last_end is not None:
                step_time_s = now - self._last_end
            self._last_end = now
        if step_time_s is not None:
            self._times.append(step_time_s)
        self._ends.append(now)
        for callback in list(self._callbacks):
            try:
                callback(index, step_time_s)
            except Exception as error:  # never into the training loop: the callback is reported and disabled
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
        except Exception:  # an exception whose str() raises too
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
        times = sorted(self._times)
        ends = list(self._ends)
        last = self._times[-1] if self._times else None
        rate = None
        if ends:
            window_start = now - _RATE_WINDOW_S
            if ends[0] > window_start:  # the window is not full yet: intervals between the ends we have
                rate = (len(ends) - 1) / (now - ends[0]) if len(ends) > 1 and now > ends[0] else None
            else:
                rate = sum(1 for t in ends if t > window_start) / _RATE_WINDOW_S
        return StepStats(
            count=self._count,
            steps_per_second=rate,
            last_step_time_s=last,
            p50_step_time_s=percentile(times, 0.50),
            p99_step_time_s=percentile(times, 0.99),
            last_step_age_s=(now - ends[-1]) if ends else None,
        )


_process = StepTracker()
os.register_at_fork(after_in_child=_process.after_fork)


def process_steps() -> StepTracker:
    """The tracker `tpu_tools.agent.step()` marks in this process."""
    return _process
