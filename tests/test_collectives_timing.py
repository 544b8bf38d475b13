"""The back-to-back timing on its own: calibration of k, its bounds, and agreement between processes.

The device is stood in for by a clock: a sample of k calls lasts overhead + k x per_call, the
shape a real runtime gives (one launch-and-wait round trip, then k iterations).
"""

from __future__ import annotations

import itertools
import re

import pytest

from tpu_tools.collectives.timing import MAX_CALLS, TimingPlan, calibrate, per_call_us, plan_for


class Device:
    def __init__(self, per_call_s: float, overhead_s: float):
        self.per_call_s, self.overhead_s = per_call_s, overhead_s
        self.samples: list[int] = []

    def sample(self, calls: int) -> float:
        self.samples.append(calls)
        return self.overhead_s + calls * self.per_call_s

    @property
    def spent_s(self) -> float:
        return sum(self.sample_length(k) for k in self.samples)

    def sample_length(self, calls: int) -> float:
        return self.overhead_s + calls * self.per_call_s


def alone(name: str, value: str) -> str:
    return value


def test_k_is_calibrated_so_a_sample_lasts_the_length_asked():
    device = Device(per_call_s=10e-6, overhead_s=80e-6)  # a small collective on a GPU: 10 us, 80 us round trip
    result = calibrate(device.sample, TimingPlan(sample_s=5e-3, budget_s=1.0), alone)
    assert result.short is None
    assert device.sample_length(result.calls) >= 5e-3
    assert result.calls <= 2 * 16 * 5e-3 / 10e-6  # not wildly past the length asked
    assert result.blocking_call_us == pytest.approx(90)  # one call waited for: the round trip included
    assert device.samples[:3] == [1, 1, 1]
    assert device.samples == sorted(device.samples)
    # Per iteration, the round trip is spread over k calls: within 2 % of the device's own 10 us.
    assert per_call_us([device.sample_length(result.calls)], result.calls)[0] == pytest.approx(10, rel=0.02)


def test_a_call_longer_than_the_sample_needs_no_calibration():
    device = Device(per_call_s=20e-3, overhead_s=0)
    result = calibrate(device.sample, TimingPlan(sample_s=5e-3, budget_s=1.0), alone)
    assert (result.calls, result.short, device.samples) == (1, None, [1, 1, 1])


def test_sample_ms_0_waits_for_every_call():
    device = Device(per_call_s=1e-6, overhead_s=50e-6)
    result = calibrate(device.sample, plan_for(0, 60), alone)
    assert (result.calls, result.short) == (1, None)


def test_the_calls_per_sample_are_capped_and_the_shortfall_said():
    device = Device(per_call_s=1e-9, overhead_s=1e-6)  # so fast that 5 ms would take millions of calls
    result = calibrate(device.sample, TimingPlan(sample_s=5e-3, budget_s=10.0), alone)
    assert result.calls == MAX_CALLS
    assert max(device.samples) == MAX_CALLS
    assert result.short is not None
    assert f"at most {MAX_CALLS} calls per sample" in result.short
    assert "short of the 5 ms asked" in result.short


def test_a_sample_length_out_of_the_budget_is_said_instead_of_looped_for():
    device = Device(per_call_s=1e-3, overhead_s=0)
    result = calibrate(device.sample, TimingPlan(sample_s=1.5, budget_s=1.0), alone)
    assert result.short is not None
    assert "time budget of 1 s would run out" in result.short
    assert device.spent_s <= 1.0  # it stopped before spending more than its budget
    assert result.calls == device.samples[-1]
    assert device.sample_length(result.calls) < 1.5


def test_a_shortfall_of_over_a_second_is_said_in_plain_milliseconds():
    device = Device(per_call_s=0.3, overhead_s=0)  # 4 calls last 1.2 s; 8 would pass the 2 s budget
    result = calibrate(device.sample, TimingPlan(sample_s=2.0, budget_s=2.0), alone)
    assert result.short is not None
    assert "e+" not in result.short
    assert re.search(r"\d+ calls per sample last \d+\.\d ms, short of the 2000 ms asked", result.short), result.short


@pytest.mark.parametrize(("per_call_s", "overhead_s", "sample_s", "budget_s"), list(itertools.product(
    [1e-9, 1e-7, 1e-5, 1e-3, 0.1], [0, 1e-5, 1e-3], [1e-3, 5e-3, 0.1], [0.05, 1.0, 30.0])))
def test_the_calibration_always_ends_within_its_bounds(per_call_s, overhead_s, sample_s, budget_s):
    device = Device(per_call_s, overhead_s)
    plan = TimingPlan(sample_s=sample_s, budget_s=budget_s)
    result = calibrate(device.sample, plan, alone)
    assert 1 <= result.calls <= MAX_CALLS
    assert len(device.samples) <= 3 + 20  # a few steps, never a loop
    calibration_s = device.spent_s - sum(device.sample_length(1) for _ in range(3))
    assert calibration_s <= budget_s
    if result.short is None:
        assert device.sample_length(result.calls) >= sample_s
    else:
        assert device.sample_length(result.calls) < sample_s


def test_every_process_follows_process_0s_decisions():
    # This process measures its own (different) times but must issue exactly the calls process 0 chose,
    # or the collectives of the processes would not pair up.
    decisions = iter(["next 7", "next 300", "done"])
    asked: list[tuple[str, str]] = []

    def follow(name: str, value: str) -> str:
        asked.append((name, value))
        return next(decisions)

    device = Device(per_call_s=1e-6, overhead_s=0)
    result = calibrate(device.sample, TimingPlan(sample_s=5e-3, budget_s=1.0), follow)
    assert device.samples == [1, 1, 1, 7, 300]
    assert result.calls == 300
    assert result.short is None
    assert [name for name, _ in asked] == ["calibrate/0", "calibrate/1", "calibrate/2"]


def test_the_budget_grows_with_the_sample_and_stays_inside_the_timeout():
    assert plan_for(5, 60) == TimingPlan(5e-3, 1.0)
    assert plan_for(500, 60) == TimingPlan(0.5, 5.0)
    assert plan_for(500, 4) == TimingPlan(0.5, 1.0)
    assert plan_for(2000, 8).budget_s == 2.0


def test_an_out_of_place_sample_frees_the_previous_samples_output_before_its_last_wait():
    """As in tpu-bench: each sample pays for as many frees as it makes outputs (the runtime unmaps a large
    output when it is freed, a cost of every call of a long loop)."""
    import weakref

    from tpu_tools.collectives.runner import _OutOfPlace

    log: list[tuple[str, int]] = []

    class Output:
        def __init__(self, number: int):
            self.number = number
            weakref.finalize(self, log.append, ("freed", number))

        def block_until_ready(self) -> Output:
            log.append(("blocked", self.number))
            return self

    chain = _OutOfPlace(lambda inputs, previous: Output(previous.number + 1), None, Output(0), lambda: None, 1000)
    chain.sample(3)
    chain.sample(2)
    blocks = [index for index, event in enumerate(log) if event[0] == "blocked"]
    assert log.index(("freed", 3)) < blocks[-1]  # the first sample's output, freed inside the second sample
    assert {n for kind, n in log if kind == "freed"} == {0, 1, 2, 3, 4}
    assert chain.last.number == 5
