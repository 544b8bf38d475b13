"""How one size is timed: k calls issued back to back, one wait at the end, k calibrated.

Waiting for every call adds the host's launch-and-wait round trip to each
figure (tens of microseconds on a GPU, more than a small collective takes).
nccl-tests times a loop of iterations and divides; so does this: a sample is
k calls issued back to back and one block on the last result, and the time
per iteration is the sample's length over k. k is calibrated per size so a
sample lasts at least the requested length (--sample-ms), which makes the
round trip noise. The calls are chained (each waits for the previous one's
output, see spmd), so the runtime cannot overlap them and overstate.

The calibration is bounded: it never issues more than MAX_CALLS calls per
sample and never spends more than its time budget; when either stops it short
of the sample length it says so, and the sizes go on with the k it reached.
With several processes every process must issue the same calls: each step's
decision is process 0's, which the others follow (`agree`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

MAX_CALLS = 1 << 16  # calls per sample: enough for 5 ms of 0.1 us calls
BLOCKED_CALLS = 3  # single calls, each waited for: the per-call latency
GROWTH = (2.0, 16.0)  # k grows by at least x2 and at most x16 per calibration step
MARGIN = 1.2  # aim a little past the sample length: the estimate comes from a shorter sample

# A sample: issue this many calls back to back, wait for the last; returns its length in seconds.
RunSample = Callable[[int], float]
# (step name, process 0's decision) -> the decision every process follows.
Agree = Callable[[str, str], str]


@dataclass(frozen=True)
class TimingPlan:
    sample_s: float  # a sample lasts at least this long; 0: one call per sample, each waited for
    budget_s: float  # the calibration of one size spends at most this long
    max_calls: int = MAX_CALLS


@dataclass(frozen=True)
class Calibration:
    calls: int  # k: calls per sample
    blocking_call_us: float  # median time of one call issued and waited for
    sample_s: float  # length of the last calibration sample
    short: str | None  # why the samples are shorter than asked, or None


def plan_for(sample_ms: float, timeout_s: float) -> TimingPlan:
    """The calibration may take ten samples' time (at least 1 s), but no more than a quarter of --timeout:
    no sample it starts can outlast the watchdog, even on a busy machine."""
    sample_s = sample_ms / 1e3
    return TimingPlan(sample_s, min(max(1.0, 10 * sample_s), timeout_s / 4))


def calibrate(run_sample: RunSample, plan: TimingPlan, agree: Agree) -> Calibration:
    """Find k such that k back-to-back calls last at least plan.sample_s, within the plan's bounds."""
    blocked = [run_sample(1) for _ in range(BLOCKED_CALLS)]
    blocking_call_us = statistics.median(blocked) * 1e6
    calls, elapsed, spent = 1, blocked[-1], sum(blocked)
    if plan.sample_s <= 0:
        return Calibration(1, blocking_call_us, elapsed, None)
    step = 0
    while True:
        decision = agree(f"calibrate/{step}", _decide(calls, elapsed, spent, plan))
        step += 1
        verb, _, value = decision.partition(" ")
        if verb != "next":
            short = None if verb == "done" else value
            return Calibration(calls, blocking_call_us, elapsed, short)
        calls = int(value)
        elapsed = run_sample(calls)
        spent += elapsed


def _decide(calls: int, elapsed: float, spent: float, plan: TimingPlan) -> str:
    """"done", "next K", or "short WHY" from this process's last sample."""
    if elapsed >= plan.sample_s:
        return "done"
    reached = f"{calls} calls per sample last {elapsed * 1e3:.1f} ms, short of the {plan.sample_s * 1e3:g} ms asked"
    if calls >= plan.max_calls:
        return f"short {reached} (at most {plan.max_calls} calls per sample)"
    grow = min(max(plan.sample_s / max(elapsed, 1e-9) * MARGIN, GROWTH[0]), GROWTH[1])
    following = min(plan.max_calls, math.ceil(calls * grow))
    predicted = elapsed * following / calls
    if spent + predicted > plan.budget_s:
        return f"short {reached} (the calibration's time budget of {plan.budget_s:.3g} s would run out)"
    return f"next {following}"


def per_call_us(samples_s: list[float], calls: int) -> list[float]:
    """Each sample's time per iteration, in microseconds."""
    return [s / calls * 1e6 for s in samples_s]
