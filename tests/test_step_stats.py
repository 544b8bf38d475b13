"""Step statistics: the percentiles kept up to date between requests equal those of sorting every time."""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_tools.instrument.steps import SortedWindow, StepTracker, percentile

RECENT = 1024  # the tracker keeps this many step times

times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
# a job's history: runs of steps (each a list of step times), a stats request after each run
histories = st.lists(st.one_of(st.lists(times, max_size=8), st.lists(times, min_size=300, max_size=1500)),
                     min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(histories)
def test_percentiles_after_every_run_of_steps_equal_a_full_sort(runs: list[list[float]]) -> None:
    tracker = StepTracker()
    marked: list[float] = []
    for run in runs:
        for step_time in run:
            tracker.step(step_time)
        marked += run
        recent = sorted(marked[-RECENT:])
        stats = tracker.stats()
        assert stats.count == len(marked)
        assert stats.p50_step_time_s == percentile(recent, 0.50)
        assert stats.p99_step_time_s == percentile(recent, 0.99)
        assert stats.last_step_time_s == (marked[-1] if marked else None)


def test_a_window_with_a_value_it_cannot_find_is_sorted_again() -> None:
    source: deque[float] = deque(maxlen=3)
    window = SortedWindow(3)
    source.extend([3.0, math.nan, 1.0])
    assert len(window.update(source, 3)) == 3
    source.extend([1.0, 2.0])  # pushes out 3.0 and the NaN, which cannot be found: sorted afresh
    assert window.update(source, 5) == [1.0, 1.0, 2.0]


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=1, max_value=40),
       st.lists(st.lists(st.floats(min_value=-5.0, max_value=5.0, allow_nan=False), max_size=60), max_size=15))
def test_a_window_kept_up_to_date_equals_its_deque_sorted(capacity: int, batches: list[list[float]]) -> None:
    source: deque[float] = deque(maxlen=capacity)
    window = SortedWindow(capacity)
    appended = 0
    for batch in batches:
        source.extend(batch)
        appended += len(batch)
        assert window.update(source, appended) == sorted(source)


def test_the_rate_counts_the_steps_that_ended_within_the_last_ten_seconds() -> None:
    tracker = StepTracker()
    for _ in range(20):
        tracker.step(0.001)
    first_batch_done = time.perf_counter()
    while time.perf_counter() < first_batch_done + 0.001:  # the second batch ends clearly later
        pass
    for _ in range(30):
        tracker.step(0.001)
    # a clock just over 10 s after the first batch: its 20 ends fall before the window, the 30 after in it
    stats = tracker.stats(now=first_batch_done + 10.0005)
    assert stats.count == 50
    assert stats.steps_per_second == 3.0


def test_steps_marked_from_threads_while_stats_are_read_keep_every_count() -> None:
    tracker = StepTracker()
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not stop.is_set():
            stats = tracker.stats()
            seen.append(stats.count)
            assert stats.p50_step_time_s is None or stats.p50_step_time_s == 0.5

    reader = threading.Thread(target=read)
    reader.start()
    markers = [threading.Thread(target=lambda: [tracker.step(0.5) for _ in range(2000)]) for _ in range(3)]
    for marker in markers:
        marker.start()
    for marker in markers:
        marker.join()
    stop.set()
    reader.join()
    assert tracker.stats().count == 6000
    assert tracker.stats().p99_step_time_s == 0.5
    assert seen == sorted(seen)
