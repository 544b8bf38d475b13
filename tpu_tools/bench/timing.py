"""The timed loop: warm-up, then samples until the time budget is spent.

Each sample times one call that blocks on its result before the clock stops
(the callers end their calls with `block_until_ready`). Calls are not batched
into one sample: the CPU runtime runs independent executions concurrently,
so several calls in flight would overstate the throughput of one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimingSettings:
    min_time_s: float = 0.5  # time budget of the timed samples, per benchmark case
    warmup: int = 3  # untimed calls before the first sample
    min_samples: int = 3
    max_samples: int = 100_000


def time_calls(call: Callable[[Any], Any], settings: TimingSettings,
               prepare: Callable[[], Any] | None = None) -> list[float]:
    """Seconds per call, one per sample, after the warm-up calls.

    `prepare()` (untimed) makes the argument of each call, for calls that
    consume their input; without it `call(None)` is timed. Sampling stops once
    there are `min_samples` and `min_time_s` has passed, or at `max_samples`.
    """
    for _ in range(settings.warmup):
        call(prepare() if prepare else None)
    samples: list[float] = []
    spent = 0.0
    while len(samples) < settings.max_samples:
        argument = prepare() if prepare else None
        start = time.perf_counter()
        call(argument)
        elapsed = time.perf_counter() - start
        samples.append(elapsed)
        spent += elapsed
        if len(samples) >= settings.min_samples and spent >= settings.min_time_s:
            break
    return samples


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    """(result, seconds) of one call, for one-off costs such as compilation."""
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start
