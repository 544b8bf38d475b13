"""The collectives' arithmetic on its own: sizes, bandwidth factors, exact inputs, gates, statistics."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_tools.collectives.data import Crafted, count_wrong
from tpu_tools.collectives.dtypes import DTYPES, parse_dtype
from tpu_tools.collectives.launch import RankOutcome, devices_per_process, strip_option
from tpu_tools.collectives.mesh import MeshPlan, id_ranges, parse_device_ids, parse_mesh_shape
from tpu_tools.collectives.ops import OPS, Case, parse_op, plan_tests
from tpu_tools.collectives.report import CaseResult, CollectivesReport, ProcessInfo, ProcessTime, SizeResult, judge
from tpu_tools.collectives.settings import RunSettings
from tpu_tools.collectives.sizes import plan_sizes, sweep_sizes
from tpu_tools.collectives.stats import algbw_gbps, parse_stats, slow_processes, summarise
from tpu_tools.errors import UsageError


def test_sweep_multiplies_or_steps_and_stays_within_the_bounds():
    assert sweep_sizes(1024, 16384) == [1024, 2048, 4096, 8192, 16384]
    assert sweep_sizes(8, 100, factor=3) == [8, 24, 72]
    assert sweep_sizes(100, 400, step_bytes=100) == [100, 200, 300, 400]
    assert sweep_sizes(5, 5) == [5]
    assert sweep_sizes(1, 3, factor=1.1) == [1, 2, 3]  # a factor too small to grow still advances


@pytest.mark.parametrize(("args", "message"), [
    ((2048, 1024), "larger than --max-bytes"),
    ((1, 8, 1.0), "--step-factor must be greater than 1"),
    ((1, 8, 0.5), "--step-factor must be greater than 1"),
    ((0, 8), "at least 1 byte"),
    ((1, 1 << 30, None, 1), "would have"),
    ((1, 8, 2.0, 1), "either --step-factor or --step-bytes"),
])
def test_bad_sweeps_are_usage_errors(args, message):
    with pytest.raises(UsageError, match=message):
        sweep_sizes(*args)


def test_sizes_round_down_to_whole_elements_per_rank_like_nccl_tests():
    f32 = DTYPES["f32"]
    plans, note = plan_sizes([1000, 1024, 4], OPS["all-gather"], f32, 8)
    assert [(p.size_bytes, p.count) for p in plans] == [(992, 31), (1024, 32), (32, 1)]
    assert "multiple of 8 ranks x 4 B (f32) = 32 B" in note
    assert "1000 -> 992" in note
    assert "4 -> 32" in note
    plans, note = plan_sizes([1000, 1002], OPS["all-reduce"], f32, 8)
    assert [(p.size_bytes, p.count) for p in plans] == [(1000, 250)]  # 1002 rounds onto 1000: run once
    assert "1002 -> 1000" in note
    assert plan_sizes([1024], OPS["all-reduce"], f32, 8)[1] is None


def test_busbw_factors_and_formulas_follow_the_convention():
    assert OPS["all-reduce"].busbw_factor(8) == pytest.approx(1.75)
    for name in ("all-gather", "reduce-scatter", "all-to-all"):
        assert OPS[name].busbw_factor(4) == pytest.approx(0.75)
        assert OPS[name].gathered
    assert OPS["permute"].busbw_factor(8) == OPS["broadcast"].busbw_factor(8) == 1.0
    assert OPS["all-reduce"].busbw_formula(8) == "busbw = algbw * 2(n-1)/n = algbw * 1.750 (n = 8 ranks)"
    assert OPS["all-gather"].size_bytes(31, 4, 8) == 992
    assert OPS["all-reduce"].size_bytes(250, 4, 8) == 1000
    assert algbw_gbps(1_000_000, 1000.0) == pytest.approx(1.0)


def test_ops_dtypes_and_reductions_parse_with_their_aliases():
    assert [o.name for o in parse_op("all")] == list(OPS)
    assert parse_op("allreduce")[0].name == "all-reduce"
    assert parse_dtype("float").name == "f32"
    assert parse_dtype("BF16").name == "bf16"
    with pytest.raises(UsageError, match="unknown op 'reduce'"):
        parse_op("reduce")
    with pytest.raises(UsageError, match="unknown dtype 'f33'"):
        parse_dtype("f33")
    tests, notes = plan_tests(list(OPS.values()), "all")
    assert [t.label for t in tests][:6] == ["all-reduce (sum)", "all-reduce (max)", "all-reduce (min)",
                                            "all-reduce (prod)", "all-reduce (avg)", "all-gather"]
    assert "reduce-scatter (sum)" in [t.label for t in tests]
    assert not notes
    tests, notes = plan_tests(list(OPS.values()), "max")
    assert "reduce-scatter (sum)" in [t.label for t in tests]
    assert notes == ["reduce-scatter runs with sum only (JAX's SPMD collective has no max)"]
    with pytest.raises(UsageError, match="reduce-scatter supports only --redop sum"):
        plan_tests(parse_op("reduce-scatter"), "max")


def _simulate(test: Case, crafted: Crafted, group: int) -> list[np.ndarray]:
    """What each rank must end up with, computed naively in float64 from every rank's input."""
    n, count = crafted.ranks, crafted.count
    inputs = [crafted.input(group, r).astype(np.float64) for r in range(n)]
    stacked = np.stack(inputs)
    outputs = []
    for r in range(n):
        name = test.op.name
        if name == "all-reduce":
            value = {"sum": stacked.sum(0), "max": stacked.max(0), "min": stacked.min(0),
                     "prod": stacked.prod(0), "avg": stacked.sum(0) / n}[test.redop]
        elif name == "reduce-scatter":
            value = stacked.sum(0)[r * count:(r + 1) * count]
        elif name == "all-gather":
            value = np.concatenate(inputs)
        elif name == "all-to-all":
            value = np.concatenate([inputs[k][r * count:(r + 1) * count] for k in range(n)])
        elif name == "permute":
            value = inputs[(r - crafted.shift) % n]
        else:
            value = inputs[crafted.root]
        outputs.append(value)
    return outputs


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "u8", "i8", "i32"])
@pytest.mark.parametrize("ranks", [1, 3, 8, 64])
def test_crafted_results_are_exact_and_match_a_naive_host_reduction(dtype, ranks):
    kind = DTYPES[dtype]
    for op in OPS.values():
        for redop in op.redops or (None,):
            test = Case(op, redop)
            crafted = Crafted(test, kind, ranks, 37, shift=3, root=min(2, ranks - 1))
            for r, wanted in enumerate(_simulate(test, crafted, group=1)):
                expected = crafted.expected(1, r)
                assert np.array_equal(expected.astype(np.float64), wanted), (dtype, ranks, test.label, r)
                assert wanted.max() <= kind.exact_limit  # representable: the comparison can be bit-exact


def test_inputs_differ_by_rank_and_group_so_misplaced_data_is_caught():
    crafted = Crafted(Case(OPS["all-gather"], None), DTYPES["f32"], 8, 64)
    rows = [crafted.input(0, r) for r in range(8)] + [crafted.input(1, 0)]
    assert len({row.tobytes() for row in rows}) == len(rows)


def test_count_wrong_compares_bits():
    f32 = DTYPES["f32"]
    expected = np.arange(8, dtype=np.float32)
    actual = expected.copy()
    assert count_wrong(actual, expected, f32) == 0
    actual[3] = -0.0 if expected[3] == 0 else expected[3] + 1
    actual[0] = -0.0  # equal as a float, different bits: wrong
    assert count_wrong(actual, expected, f32) == 2
    assert count_wrong(actual[:4], expected, f32) == 8  # a missing result: every element


def test_stats_parse_and_percentiles():
    assert parse_stats("p50,p99,min,p50") == ["p50", "p99", "min"]
    assert parse_stats(None) == []
    with pytest.raises(UsageError, match="unknown statistic 'p101'"):
        parse_stats("p101")
    result = summarise([float(v) for v in range(1, 101)], ["p50", "p99", "min", "max"])
    assert result == {"p50": pytest.approx(50.5), "p99": pytest.approx(99.01), "min": 1.0, "max": 100.0}


def test_slow_processes_are_those_over_the_median_by_the_threshold():
    verdict = slow_processes({0: 100.0, 1: 101.0, 2: 150.0, 3: 99.0}, 0.2)
    assert verdict.median_us == pytest.approx(100.5)
    assert set(verdict.slow) == {2}
    assert verdict.slow[2] == pytest.approx(150 / 100.5)
    assert slow_processes({0: 100.0}, 0.0).slow == {}


def _report(rows: list[SizeResult], check: bool = True) -> CollectivesReport:
    test = CaseResult("all-reduce", "sum", None, None, "psum", 8, 1, 1.75, "", rows)
    settings = RunSettings(dtype="f32", min_bytes=8, max_bytes=8, step_factor=2.0, step_bytes=None, iters=1, warmup=0,
                           sample_ms=0.0, check=check, stats=[], root=0, shift=1, timeout_s=60.0, min_busbw_gbps=None,
                           slow_threshold_percent=20.0)
    return CollectivesReport("cmd", "t", "cpu", "cpu", "0", "0", [ProcessInfo(0, "h", 1, [0])], [0], [8], ["x"],
                             "x", 8, 1, settings, [test])


def test_gates_fail_on_wrong_values_then_on_the_bandwidth_floor():
    good = SizeResult(1024, 1024, 256, "f32", "sum", None, time_us=10.0, busbw_gbps=2.0, wrong=0)
    report = _report([good])
    assert judge(report, None) == 0
    assert report.status == "ok"
    assert report.error is None
    assert judge(report, 1.5) == 0
    assert judge(report, 3.0) == 3
    assert report.status == "below_min_busbw"
    assert "below --min-busbw 3" in report.error
    wrong = SizeResult(2048, 2048, 512, "f32", "sum", None, time_us=10.0, busbw_gbps=2.0, wrong=5)
    report = _report([good, wrong])
    assert judge(report, None) == 3
    assert report.status == "wrong_values"
    assert report.wrong == 5
    failed = SizeResult(4096, 4096, 1024, "f32", "sum", None, error="out of memory")
    report = _report([good, wrong, failed])
    assert judge(report, None) == 1
    assert report.status == "failed"
    assert "at 4.0 KiB failed: out of memory" in report.error
    unchecked = SizeResult(1024, 1024, 256, "f32", "sum", None, time_us=10.0, busbw_gbps=2.0, wrong=None)
    assert _report([unchecked], check=False).wrong is None


def test_slow_process_summary_names_host_and_pid():
    row = SizeResult(1024, 1024, 256, "f32", "sum", None, time_us=200.0, busbw_gbps=1.0, wrong=0,
                     processes=[ProcessTime(0, "a", 100.0, {}, 0), ProcessTime(1, "b", 200.0, {}, 0, slow=True),
                                ProcessTime(2, "c", 100.0, {}, 0)])
    report = _report([row])
    report.processes = [ProcessInfo(0, "a", 10), ProcessInfo(1, "b", 11), ProcessInfo(2, "c", 12)]
    (slow,) = report.slow_processes()
    assert (slow.process_id, slow.host, slow.pid, slow.slow_sizes) == (1, "b", 11, 1)
    assert slow.worst_ratio == pytest.approx(2.0)


def test_device_and_mesh_specs():
    assert parse_device_ids("0,1,4-6") == [0, 1, 4, 5, 6]
    assert parse_mesh_shape("2x4") == (2, 4)
    assert parse_mesh_shape(None) is None
    assert id_ranges([0, 1, 2, 5, 2048, 2049]) == "0-2,5,2048-2049"
    for bad in ("a", "3-1", "1,1"):
        with pytest.raises(UsageError, match=r"^--devices "):
            parse_device_ids(bad)
    for bad in ("2x", "0x4", "2x2x2x2"):
        with pytest.raises(UsageError, match=r"^--mesh '.*': use .*sizes joined by x"):
            parse_mesh_shape(bad)


def test_mesh_positions_split_groups_and_ranks_along_the_chosen_axis():
    plan = MeshPlan(mesh=None, axis="x", shape=(2, 4), names=("x", "y"), devices=[])
    assert (plan.ranks, plan.groups) == (2, 4)
    assert plan.position((slice(1, 2), slice(3, 4), slice(None))) == (3, 1)
    plan.axis = "y"
    assert (plan.ranks, plan.groups) == (4, 2)
    assert plan.position((slice(1, 2), slice(3, 4), slice(None))) == (1, 3)


def test_launch_arguments_and_outcomes():
    assert strip_option(["-b", "1K", "--launch", "2", "--launch=3", "all"], "--launch") == ["-b", "1K", "all"]
    assert devices_per_process(8, 2) == 4
    assert devices_per_process(8, 16) == 1
    killed = RankOutcome(2, 1234, returncode=-9)
    assert killed.describe_death() == "process 2 (pid 1234) was killed by SIGKILL"
    aborted = RankOutcome(1, 99, returncode=-6)
    aborted.tail.append("F0000 client.h:80] Terminating process because the JAX distributed service detected")
    assert "ended by the JAX runtime" in aborted.describe_death()
    assert RankOutcome(1, 5, returncode=1, error="x").describe_death() is None
    assert RankOutcome(1, 5, returncode=1).describe_death() == "process 1 (pid 5) exited with status 1"


@pytest.mark.parametrize("ranks", [1, 4])
def test_in_place_buffers_follow_nccl_tests_layout(ranks):
    f32, count = DTYPES["f32"], 5
    gather = Crafted(Case(OPS["all-gather"], None), f32, ranks, count)
    for r in range(ranks):
        buffer = gather.in_place_input(0, r)
        assert buffer.shape == (ranks * count,)
        assert np.array_equal(buffer[r * count:(r + 1) * count], gather.input(0, r))  # own chunk at rank x count
        assert np.array_equal(gather.in_place_expected(0, r), gather.expected(0, r))
    scatter = Crafted(Case(OPS["reduce-scatter"], "sum"), f32, ranks, count)
    for r in range(ranks):
        after = scatter.in_place_expected(0, r)
        before = scatter.in_place_input(0, r)
        assert np.array_equal(before, scatter.input(0, r))
        own = slice(r * count, (r + 1) * count)
        assert np.array_equal(after[own], scatter.expected(0, r))  # the reduced chunk at its own offset
        rest = np.ones(ranks * count, bool)
        rest[own] = False
        assert np.array_equal(after[rest], before[rest])  # the rest of the input untouched
    reduce = Crafted(Case(OPS["all-reduce"], "max"), f32, ranks, count)
    assert np.array_equal(reduce.in_place_input(0, 0), reduce.input(0, 0))
    assert np.array_equal(reduce.in_place_expected(0, 0), reduce.expected(0, 0))
