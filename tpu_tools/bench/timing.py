"""The timed loops: calibrated back-to-back samples (device throughput) and per-call samples (latency).

`time_back_to_back` measures what the device sustains. Each sample issues k
calls back to back and blocks once at the end; the time per call is the sample
over k. k is calibrated so that a sample lasts `sample_time_s` (50 ms by default): the host's
launch-and-wait round trip (tens of microseconds on a CPU, about 0.3 ms on a
GPU) is then paid once per sample, not once per call. Each call receives the
previous call's output as an argument (the callers keep it as an unused
parameter of the compiled program): the runtime waits for an argument to be
ready before it starts an execution, so the calls run one after another, as on
a device's single stream. Without that chain the CPU runtime runs independent
executions concurrently and k calls in flight would overstate one call's rate.

The samples are taken in `repeats` bursts, apart in time; the spread between
the bursts' medians is the run-to-run variation a user will see, which the
spread of samples inside one burst hides.

`time_calls` times one call per sample, blocked on its result: the latency of
a call (dispatch, inference latency, transfers).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.bench.interrupts import raise_kept_interrupt
from tpu_tools.units import format_duration_us


@dataclass(frozen=True)
class TimingSettings:
    min_time_s: float = 0.5  # time budget of the timed samples, per benchmark case
    warmup: int = 3  # untimed calls before the first sample
    min_samples: int = 3
    max_samples: int = 100_000
    # A back-to-back sample lasts at least this, so the host round trip is noise: by default a tenth of
    # min_time_s, between 2 and 50 ms (50 ms at the suites' 0.5 s and 2 s, where a GPU's 0.3 ms is 0.6 %).
    sample_time: float | None = None
    repeats: int = 3  # bursts of back-to-back samples per case, apart in time
    max_calls_per_sample: int = 100_000
    calibration_budget_s: float = 2.0  # calibration gives up (and says so) after this long

    @property
    def sample_time_s(self) -> float:
        if self.sample_time is not None:
            return self.sample_time
        return min(0.05, max(0.002, self.min_time_s / 10))


@dataclass
class Measurement:
    """Seconds per call of back-to-back samples, with how they were taken."""

    seconds: list[float]  # per call: each sample's time over its calls, every burst in order
    burst_medians: list[float]  # the median seconds per call of each burst
    calls_per_sample: int
    sample_time_s: float  # the median wall time of one sample
    notes: list[str] = field(default_factory=list)  # calibration that fell short, said in a sentence
    last: Any = field(default=None, repr=False)  # the last call's output (a train step's state and loss)
    calls: int = 0  # every call made, warm-up and calibration included

    @property
    def burst_spread(self) -> float:
        """(max - min) / median of the bursts' medians: 0 when they agree."""
        return relative_range(self.burst_medians)

    def values(self) -> dict[str, Any]:
        return {"timing": "back_to_back", "calls_per_sample": self.calls_per_sample,
                "sample_ms": self.sample_time_s * 1e3, "repeats": len(self.burst_medians),
                "repeat_spread_percent": 100 * self.burst_spread}


def relative_range(values: Sequence[float]) -> float:
    """(max - min) / median; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


class CalibrationShort(Exception):
    """Calibration could not reach the sample length: the message says why."""


def time_back_to_back(call: Callable[[Any], Any], first: Any, block: Callable[[Any], Any],
                      settings: TimingSettings) -> Measurement:
    """Seconds per call of `call`, issued back to back: call(previous output) -> output, not blocked.

    `first` is the argument of the first call (an output-shaped buffer); `block`
    waits for an output (jax.block_until_ready). Warm-up calls block one by one.
    """
    previous = first
    made = 0
    for _ in range(settings.warmup):
        raise_kept_interrupt()
        previous = call(previous)
        block(previous)
        made += 1

    def sample(calls: int) -> float:
        nonlocal previous, made
        raise_kept_interrupt()
        made += calls
        start = time.perf_counter()
        # Let go of the previous sample's output here, not after the clock stops: it is freed once the first call
        # is done with it, so every sample pays for as many frees as it makes outputs (steady state). On the
        # CPU runtime freeing a large output unmaps its pages, a cost of every call a loop makes.
        output, previous = previous, None
        for _ in range(calls):
            output = call(output)
        block(output)
        elapsed = time.perf_counter() - start
        previous = output
        return elapsed

    calls, elapsed, notes = _calibrate(sample, settings)
    repeats = max(1, settings.repeats)
    per_burst_time = settings.min_time_s / repeats
    per_burst_samples = max(1, math.ceil(settings.min_samples / repeats))
    seconds: list[float] = []
    sample_times: list[float] = [elapsed]
    medians: list[float] = []
    for burst in range(repeats):
        if burst:
            time.sleep(min(0.05, settings.sample_time_s))  # apart in time: let a burst of load pass or show
        burst_seconds: list[float] = []
        spent = 0.0
        while len(seconds) + len(burst_seconds) < settings.max_samples:
            took = sample(calls)
            sample_times.append(took)
            burst_seconds.append(took / calls)
            spent += took
            if len(burst_seconds) >= per_burst_samples and spent >= per_burst_time:
                break
        seconds.extend(burst_seconds)
        medians.append(statistics.median(burst_seconds))
    return Measurement(seconds, medians, calls, statistics.median(sample_times), notes, previous, made)


def _calibrate(sample: Callable[[int], float], settings: TimingSettings) -> tuple[int, float, list[str]]:
    """(calls per sample, the last calibration sample's seconds, notes): grow k until a sample is long enough."""
    calls = 1
    started = time.perf_counter()
    while True:
        elapsed = sample(calls)
        if elapsed >= settings.sample_time_s:
            return calls, elapsed, []
        if calls >= settings.max_calls_per_sample:
            return calls, elapsed, [f"{calls} back-to-back calls last only {format_duration_us(elapsed * 1e6)}, "
                                    f"below the {format_duration_us(settings.sample_time_s * 1e6)} sample length: "
                                    "the host round trip may weigh in this figure"]
        if time.perf_counter() - started > settings.calibration_budget_s:
            return calls, elapsed, [f"calibration stopped after {settings.calibration_budget_s:g} s at {calls} "
                                    f"calls per sample ({format_duration_us(elapsed * 1e6)}, below the "
                                    f"{format_duration_us(settings.sample_time_s * 1e6)} sample length): the calls' "
                                    "times vary too much to calibrate"]
        wanted = calls * settings.sample_time_s / max(elapsed, 1e-9) * 1.2
        calls = min(settings.max_calls_per_sample, max(calls * 2, min(calls * 100, math.ceil(wanted))))


def time_calls(call: Callable[[Any], Any], settings: TimingSettings,
               prepare: Callable[[], Any] | None = None) -> list[float]:
    """Seconds per call, one blocked call per sample, after the warm-up calls.

    `prepare()` (untimed) makes the argument of each call, for calls that
    consume their input; without it `call(None)` is timed. Sampling stops once
    there are `min_samples` and `min_time_s` has passed, or at `max_samples`.
    """
    for _ in range(settings.warmup):
        raise_kept_interrupt()
        call(prepare() if prepare else None)
    samples: list[float] = []
    spent = 0.0
    while len(samples) < settings.max_samples:
        raise_kept_interrupt()
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
