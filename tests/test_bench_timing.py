"""tpu-bench's timing, noise detection and cost-analysis checks, below the command line."""

from __future__ import annotations

import time
import weakref

import pytest

from tpu_tools.bench.timing import TimingSettings, relative_range, time_back_to_back


def _sleeper(seconds: float):
    """A call that takes `seconds` and returns its argument plus one: the chain is visible in the last output."""

    def call(previous: int) -> int:
        time.sleep(seconds)
        return previous + 1

    return call


def test_back_to_back_calibrates_calls_per_sample_and_chains_every_call():
    settings = TimingSettings(min_time_s=0.06, warmup=2, sample_time=0.01, repeats=3)
    measurement = time_back_to_back(_sleeper(0.001), 0, lambda output: output, settings)
    # A 1 ms call needs several calls to fill a 10 ms sample; a busy host only makes the calls longer (fewer of
    # them), so the bounds are from below for times and from above for counts.
    assert 1 <= measurement.calls_per_sample <= 20
    assert measurement.sample_time_s >= 0.005
    assert all(s > 0.0009 for s in measurement.seconds)  # each call's time is at least its 1 ms sleep
    assert len(measurement.burst_medians) == 3
    assert len(measurement.seconds) >= 3
    # Every call took the previous call's output: the last output counts every call made.
    assert measurement.last == measurement.calls
    values = measurement.values()
    assert values["timing"] == "back_to_back"
    assert values["repeats"] == 3
    assert values["calls_per_sample"] == measurement.calls_per_sample
    assert not measurement.notes


class _Output:
    """A call's output that logs when it is made and when it is freed."""

    def __init__(self, log: list[tuple[str, int]], number: int):
        self.number = number
        log.append(("made", number))
        weakref.finalize(self, log.append, ("freed", number))


def test_every_sample_pays_for_the_frees_of_as_many_outputs_as_it_makes():
    """Steady state: the previous sample's output is let go inside the next sample, before its block, not after.

    (On the CPU runtime freeing a 64 MiB output unmaps its pages: a copy benchmark that freed outside the
    clock read 15-25 % above a loop that waits for every call.)
    """
    log: list[tuple[str, int]] = []

    def call(previous: _Output) -> _Output:
        return _Output(log, previous.number + 1)

    def block(output: _Output) -> _Output:
        log.append(("blocked", output.number))
        return output

    settings = TimingSettings(min_time_s=0.0, warmup=1, sample_time=0.0, min_samples=4, repeats=2)
    measurement = time_back_to_back(call, _Output(log, 0), block, settings)
    blocks = [index for index, event in enumerate(log) if event[0] == "blocked"]
    assert len(blocks) >= 5  # the warm-up, the calibration's sample and the bursts'
    for earlier, later in zip(blocks, blocks[1:]):
        made_between = {n for kind, n in log[earlier:later] if kind == "made"}
        freed_between = {n for kind, n in log[earlier:later] if kind == "freed"}
        assert len(freed_between) == len(made_between), log[earlier:later + 1]  # as many frees as outputs
        assert log[earlier][1] in freed_between  # the output the last block waited for is freed in this sample
    assert measurement.last.number == measurement.calls


def test_a_calibration_that_cannot_reach_the_sample_length_says_so_instead_of_looping():
    settings = TimingSettings(min_time_s=0.01, warmup=0, sample_time=5.0, max_calls_per_sample=64)
    measurement = time_back_to_back(lambda previous: previous + 1, 0, lambda output: output, settings)
    assert measurement.calls_per_sample == 64  # capped, not grown towards the 5 s sample
    (note,) = measurement.notes
    assert "64 back-to-back calls last only" in note
    assert "5.00 s sample length" in note
    assert "e+" not in note


def test_a_calibration_out_of_time_stops_with_a_sentence():
    settings = TimingSettings(min_time_s=0.01, warmup=0, sample_time=10.0, calibration_budget_s=0.05)
    measurement = time_back_to_back(_sleeper(0.002), 0, lambda output: output, settings)
    (note,) = measurement.notes
    assert note.startswith("calibration stopped after 0.05 s")


def test_the_sample_length_follows_the_time_budget_within_bounds():
    assert TimingSettings(min_time_s=0.5).sample_time_s == 0.05
    assert TimingSettings(min_time_s=0.1).sample_time_s == pytest.approx(0.01)
    assert TimingSettings(min_time_s=0.001).sample_time_s == 0.002
    assert TimingSettings(min_time_s=0.5, sample_time=0.2).sample_time_s == 0.2


def test_relative_range_and_burst_quartiles():
    from tpu_tools.bench.stats import summarize_bursts

    assert relative_range([100.0, 105.0, 110.0]) == pytest.approx(0.1 / 1.05)
    assert relative_range([3.0]) == 0.0
    tight = [100.0, 100.5, 101.0, 99.5, 100.0, 100.2]
    summary = summarize_bursts(tight, [90.0, 100.0, 110.0], higher_is_better=True)
    assert summary.p25 == 90.0
    assert summary.p75 == 110.0  # the bursts' spread, not the tight samples'
    assert summary.median == pytest.approx(100.1)
    assert summary.higher_is_better


def test_noise_reasons_come_from_the_repeats_and_from_other_processes():
    from tpu_tools.bench.interference import noise_reasons

    quiet = {"repeat_spread_percent": 1.0, "repeats": 3,
             "interference": {"other_processes_cpu_percent": 2.0, "steal_percent": 0.0}}
    assert noise_reasons(quiet, "cpu") == []
    moving = {**quiet, "repeat_spread_percent": 12.0}
    assert noise_reasons(moving, "gpu") == ["its 3 repeats differ by 12.0% (min to max of their medians)"]
    busy = {**quiet, "interference": {"other_processes_cpu_percent": 45.0, "steal_percent": None}}
    assert noise_reasons(busy, "cpu") == ["other processes used 45% of the host's CPU time while it ran"]
    assert noise_reasons(busy, "gpu") == []  # the host's CPU is not what a GPU benchmark measures


def test_interference_counts_another_process_burning_cpu():
    import subprocess
    import sys

    from tpu_tools.bench.interference import interference, snapshot

    # A grandchild (reparented away from this process) burns one CPU for 0.8 s: that is another process's time.
    burn = "import time\nt = time.time()\nwhile time.time() - t < 0.8: pass"
    spawn = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {burn!r}])"
    before = snapshot()
    subprocess.run([sys.executable, "-c", spawn], check=True, timeout=30)
    time.sleep(1.0)
    host = interference(before, snapshot())
    assert host["cpus"] >= 1
    assert host["load_average_1m"] is not None
    # At least 0.8 s of one CPU in about 1.1 s on every CPU (more where other work runs too).
    assert host["other_processes_cpu_percent"] > 0.5 * 0.8 / (1.3 * host["cpus"]) * 100


def test_cost_checks_skip_missing_counts_and_library_calls():
    import jax
    import jax.numpy as jnp

    from tpu_tools.bench.context import cost_check, library_calls, mismatch_warning, xla_cost

    assert mismatch_warning("FLOPs", 100.0, None) is None
    assert mismatch_warning("FLOPs", 100.0, -1.0) is None  # XLA's "not available"
    assert mismatch_warning("FLOPs", 100.0, 50.0, ["__cublas$gemm"]) is None  # not comparable
    assert mismatch_warning("FLOPs", 100.0, 50.0) == ("FLOPs: XLA's cost analysis counts 50, the analytic count "
                                                     "is 100 (-50%)")
    compiled = jax.jit(jnp.matmul).lower(jnp.ones((8, 8)), jnp.ones((8, 8))).compile()
    assert library_calls(compiled) == []
    assert xla_cost(compiled)["flops"] == pytest.approx(2 * 8 ** 3, rel=0.1)
    assert cost_check(compiled, "flops", devices=2).xla == pytest.approx(4 * 8 ** 3, rel=0.1)

    class GpuProgram:
        """A compiled GEMM as XLA's GPU backend prints it (a cuBLAS custom call), which this host cannot compile."""

        def as_text(self) -> str:
            return ('%gemm = (f32[8,8], s8[0]) custom-call(f32[8,8] %a, f32[8,8] %b), '
                    'custom_call_target="__cublas$gemm", backend_config={}')

        def cost_analysis(self) -> dict:
            return {"flops": -1.0, "bytes accessed": 768.0}

    check = cost_check(GpuProgram(), "flops")
    assert check.xla is None
    assert check.excluded == ["__cublas$gemm"]
    assert check.values("xla_flops_per_call") == {"xla_flops_per_call": None, "xla_cost_excludes": ["__cublas$gemm"]}


def test_the_run_notes_library_calls_once():
    from tpu_tools.bench.records import BenchEnvironment, BenchSettings, Case, CaseResult, RunResult
    from tpu_tools.bench.runner import _note_library_calls

    run = RunResult(environment=BenchEnvironment(), device=None, settings=BenchSettings())
    for name in ("bf16 8192", "f16 8192"):
        result = CaseResult(Case("matmul", name))
        result.values["xla_cost_excludes"] = ["__cublas$lt$matmul$f8", "__cublas$gemm"]
        run.results.append(result)
    run.results.append(CaseResult(Case("memory", "copy 1GiB")))
    _note_library_calls(run)
    (note,) = run.notes
    assert "__cublas$gemm, __cublas$lt$matmul$f8" in note
    assert "2 case(s)" in note
    assert "matmul/bf16/8192" in note
    assert "memory" not in note


def test_a_noisy_case_is_still_gated_and_the_comparison_says_it_was_noisy():
    from tpu_tools.bench.compare import REGRESSION, compare
    from tpu_tools.bench.records import BenchDevice, BenchEnvironment, BenchSettings, Case, CaseResult, RunResult
    from tpu_tools.bench.stats import summarize

    def document(rate: float, noisy: bool) -> dict:
        result = CaseResult(Case("matmul", "f32 64"), primary="throughput_tflops")
        result.stats["throughput_tflops"] = summarize([rate, rate * 1.01, rate * 0.99], higher_is_better=True)
        result.values["noisy"] = noisy
        device = BenchDevice(platform="cpu", kind="cpu", count=1)
        return RunResult(environment=BenchEnvironment(), device=device, settings=BenchSettings(),
                         results=[result]).to_dict()

    (change,) = compare(document(1.0, False), document(0.5, True), 0.05).changes
    assert change.verdict == REGRESSION
    assert change.note == "the current run flagged this case noisy"
    (same,) = compare(document(1.0, True), document(1.0, False), 0.05).changes
    assert same.note is None


def test_a_chained_call_waits_for_the_previous_output_on_the_cpu_runtime():
    """The chain of back-to-back calls: an unused argument still orders the executions (real PJRT CPU)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(1), (384, 384))

    def long_chain(m):
        for _ in range(12):
            m = jnp.tanh(m @ m)
        return m[:2, :2]

    slow = jax.jit(long_chain).lower(a).compile()
    x = jnp.ones((2, 2))
    quick = jax.jit(lambda v, previous: v + 1.0, keep_unused=True).lower(x, x).compile()
    slow(a).block_until_ready()
    quick(x, x).block_until_ready()
    start = time.perf_counter()
    previous = slow(a)
    after = quick(x, previous)
    after.block_until_ready()
    quick_done = time.perf_counter() - start
    previous.block_until_ready()
    slow_done = time.perf_counter() - start
    assert quick_done >= 0.9 * slow_done  # ready only once the slow call it was chained to is
    assert float(after[0, 0]) == 2.0
