"""tpu-bench's pieces without a runtime: statistics, parsing, comparison, result files, JUnit, rendering."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

import pytest

from tpu_tools.bench import compare as cmp
from tpu_tools.bench.environment import differences
from tpu_tools.bench.failures import classify
from tpu_tools.bench.junit import junit_xml
from tpu_tools.bench.matmul import Shape, parse_shape
from tpu_tools.bench.records import (
    SCHEMA,
    BenchDevice,
    BenchEnvironment,
    BenchSettings,
    Case,
    CaseResult,
    RecordedVersions,
    RunResult,
)
from tpu_tools.bench.stats import percentile, rates, summarize
from tpu_tools.bench.timing import TimingSettings, time_calls
from tpu_tools.errors import UsageError
from tpu_tools.render.bench_view import format_figure, results_table
from tpu_tools.render.table import plain_table
from tpu_tools.workloads.transformer import PRESETS, config_for, forward_flops, parameter_count, train_step_flops


def test_summary_percentiles_interpolate_like_numpy():
    summary = summarize([4.0, 1.0, 3.0, 2.0, 5.0], higher_is_better=True)
    assert (summary.median, summary.p25, summary.p75, summary.min, summary.max, summary.count) == (3, 2, 4, 1, 5, 5)
    assert summary.p90 == pytest.approx(4.6)
    assert summary.p99 == pytest.approx(4.96)
    assert summary.higher_is_better
    assert summary.stdev == pytest.approx(1.5811, rel=1e-4)
    assert percentile([10.0, 20.0], 0.5) == 15.0
    assert rates(100.0, [0.5, 2.0]) == [200.0, 50.0]


def test_timed_loop_warms_up_then_samples_until_the_budget():
    calls = []
    samples = time_calls(lambda argument: calls.append(argument), TimingSettings(min_time_s=0.0, warmup=2,
                                                                                 min_samples=4),
                         prepare=lambda: len(calls))
    assert len(calls) == 6
    assert len(samples) == 4
    assert calls == [0, 1, 2, 3, 4, 5]  # every call got a fresh prepared argument


@pytest.mark.parametrize(("text", "shape"), [("512", Shape(512, 512, 512)), ("8x16x32", Shape(8, 16, 32))])
def test_matrix_sizes_parse(text, shape):
    assert parse_shape(text) == shape
    assert parse_shape(text).flops == 2 * shape.m * shape.k * shape.n


@pytest.mark.parametrize(("text", "reason"), [("0", "at least 1"), ("-3", "at least 1"), ("abc", "not a matrix"),
                                              ("4x4", "not a matrix"), ("99999999999", "absurdly large")])
def test_bad_matrix_sizes_say_why(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_shape(text)


def test_tolerance_parses_percentages():
    assert cmp.parse_tolerance("5%") == pytest.approx(0.05)
    assert cmp.parse_tolerance("2.5") == pytest.approx(0.025)
    for bad in ("abc", "-1%", "100%"):
        with pytest.raises(ValueError, match=r"is not a percentage|must be at least 0% and below 100%"):
            cmp.parse_tolerance(bad)


def _summary(median: float, spread: float, count: int = 9, higher: bool = True):
    return summarize([median - spread, median, median + spread] * (count // 3), higher_is_better=higher)


def test_a_rate_regresses_only_beyond_tolerance_and_spread():
    base = _summary(100.0, 2.0)
    assert cmp.judge("c", "rate", base, _summary(97.0, 2.0), 0.05).verdict == cmp.SAME
    assert cmp.judge("c", "rate", base, _summary(80.0, 2.0), 0.05).verdict == cmp.REGRESSION
    assert cmp.judge("c", "rate", base, _summary(120.0, 2.0), 0.05).verdict == cmp.BETTER
    # 10% worse in the median but the ranges overlap once widened by the tolerance: noise, not a regression
    noisy = cmp.judge("c", "rate", _summary(100.0, 10.0), _summary(90.0, 10.0), 0.05)
    assert noisy.verdict == cmp.WORSE
    assert noisy.change_percent == pytest.approx(-10.0)


def test_a_time_regresses_upwards_and_single_samples_are_not_gated():
    base = _summary(10.0, 0.1, higher=False)
    assert cmp.judge("c", "time_us", base, _summary(12.0, 0.1, higher=False), 0.05).verdict == cmp.REGRESSION
    assert cmp.judge("c", "time_us", base, _summary(8.0, 0.1, higher=False), 0.05).verdict == cmp.BETTER
    one = summarize([10.0], higher_is_better=False)
    assert cmp.judge("c", "time_us", one, summarize([20.0]), 0.05).verdict == cmp.NOT_GATED


def _document(results: list[CaseResult], kind: str = "cpu", jax: str = "0.10.2") -> dict:
    run = RunResult(environment=BenchEnvironment(host="h", cpu_model="x", cpu_count=2,
                                                 versions=RecordedVersions(jax=jax, jaxlib=jax)),
                    device=BenchDevice(platform="cpu", kind=kind, count=1), settings=BenchSettings(min_time_s=0.5),
                    results=results)
    return run.to_dict()


def _result(name: str, median: float, status: str = "ok") -> CaseResult:
    result = CaseResult(Case("matmul", name, {}), status=status, primary="throughput_tflops")
    if status == "ok":
        result.stats["throughput_tflops"] = _summary(median, 0.01)
    return result


def test_comparison_of_documents_flags_lost_cases_and_new_ones():
    baseline = _document([_result("f32 8", 1.0), _result("bf16 8", 1.0), _result("gone 8", 1.0)])
    current = _document([_result("f32 8", 1.0), _result("bf16 8", 0, status="out_of_memory"), _result("new 8", 2)])
    comparison = cmp.compare(baseline, current, 0.05)
    verdicts = {(c.case_id, c.figure): c.verdict for c in comparison.changes}
    assert verdicts[("matmul/f32/8", "throughput_tflops")] == cmp.SAME
    assert verdicts[("matmul/bf16/8", "status")] == cmp.REGRESSION
    assert verdicts[("matmul/new/8", "throughput_tflops")] == cmp.NEW
    assert comparison.baseline_only == ["matmul/gone/8"]
    assert len(comparison.regressions) == 1
    assert comparison.to_dict()["regression_count"] == 1


def test_environments_that_differ_warn_and_other_devices_are_refused():
    errors, warnings = differences(_document([]), _document([], jax="0.9.0"))
    assert not errors
    assert any("jax version differs" in w for w in warnings)
    errors, _ = differences(_document([], kind="TPU v4"), _document([]))
    assert errors
    assert "not comparable" in errors[0]
    with pytest.raises(UsageError, match="allow-mismatch"):
        cmp.compare(_document([], kind="TPU v4"), _document([]), 0.05)
    assert cmp.compare(_document([], kind="TPU v4"), _document([]), 0.05, allow_mismatch=True).warnings


def test_result_files_are_checked(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        cmp.load_result(tmp_path / "missing.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(UsageError, match="is not JSON"):
        cmp.load_result(tmp_path / "text.json")
    (tmp_path / "ls.json").write_text(json.dumps({"schema": "tpu-tools/ls/v1"}))
    with pytest.raises(UsageError, match="not a tpu-bench result"):
        cmp.load_result(tmp_path / "ls.json")
    (tmp_path / "damaged.json").write_text(json.dumps({"schema": SCHEMA, "results": [{"name": "x"}]}))
    with pytest.raises(UsageError, match="damaged"):
        cmp.load_result(tmp_path / "damaged.json")
    (tmp_path / "good.json").write_text(json.dumps(_document([_result("f32 8", 1.0)])))
    assert cmp.load_result(tmp_path / "good.json")["schema"] == SCHEMA


def test_junit_has_a_testcase_per_case_and_failures_for_regressions():
    baseline = _document([_result("f32 8", 10.0), _result("bf16 8", 1.0)])
    current_run = RunResult.from_dict(_document([_result("f32 8", 1.0), _result("bf16 8", 1.0),
                                                 _result("int4 8", 0, status="unsupported"),
                                                 _result("fp8 8", 0, status="failed")]))
    comparison = cmp.compare(baseline, current_run.to_dict(), 0.05)
    suite = ElementTree.fromstring(junit_xml(current_run, comparison))
    assert suite.tag == "testsuite"
    assert suite.get("tests") == "4"
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["f32 8"].find("failure").get("type") == "regression"
    assert cases["bf16 8"].find("failure") is None
    assert cases["int4 8"].find("skipped") is not None


def test_runtime_errors_are_classified():
    assert classify(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes."),
                    "cpu")[0] == "out_of_memory"
    assert classify(MemoryError(), "cpu")[0] == "out_of_memory"
    status, message = classify(RuntimeError("UNIMPLEMENTED: dot of s4"), "tpu")
    assert status == "unsupported"
    assert "unsupported on tpu" in message
    assert classify(ValueError("bad"), "cpu") == ("failed", "ValueError: bad")


def test_figures_are_shown_in_the_unit_their_key_names():
    assert format_figure("throughput_tflops", 0.295) == "295 GFLOP/s"
    assert format_figure("throughput_tops", 1979.0) == "1.98 POP/s"
    assert format_figure("bandwidth_gbps", 3000.0) == "3 TB/s"
    assert format_figure("samples_per_s", 5720.0) == "5.72k samples/s"
    assert format_figure("latency_us", 6.5) == "6.5 us"
    assert format_figure("step_time_ms", 93.7) == "93.70 ms"
    assert format_figure("time_us", None) == "-"


def test_table_shows_statuses_and_percent_of_peak():
    ok = _result("bf16 8", 500.0)
    ok.values.update({"percent_of_peak": 50.5, "compile_ms": 12.0})
    ok.stats["time_us"] = _summary(3.0, 0.1, higher=False)
    skipped = _result("int4 8", 0, status="unsupported")
    skipped.message = "int4 matmul is unsupported on cpu"
    tf32 = CaseResult(Case("matmul", "f32 8", {"dtype": "f32"}), primary="throughput_tflops")
    tf32.stats.update({"throughput_tflops": _summary(300.0, 0.01), "time_us": _summary(3.0, 0.1, higher=False)})
    tf32.values.update({"arithmetic": "tf32", "noisy": True})
    text = plain_table(results_table(RunResult.from_dict(_document([ok, skipped, tf32]))))
    assert "500 TFLOP/s" in text
    assert "50.5%" in text
    assert "int4 matmul is unsupported on cpu" in text
    assert "ran as tf32" in text
    assert "noisy" in text  # what ran, and a figure not to trust
    assert text.count("ran as") == 1  # bf16 ran as bf16: nothing to say


def test_transformer_presets_and_flop_counts():
    assert set(PRESETS) == {"tiny", "small", "base"}
    base = config_for("base")
    assert 100e6 < parameter_count(base) < 130e6  # a GPT-2-small-like model
    tiny = config_for("tiny", n_layers=1)
    assert tiny.n_layers == 1
    assert tiny.d_model == PRESETS["tiny"].d_model
    # hand count for one layer: projections, attention scores and values, logits
    t, d, f, v, s = 8 * 128, 128, 512, 1024, 128
    expected = 2 * t * (4 * d * d + 2 * d * f) + 4 * 8 * s * s * d + 2 * t * d * v
    assert forward_flops(tiny, 8) == expected
    assert train_step_flops(tiny, 8) == 3 * expected
    with pytest.raises(KeyError, match="huge"):
        config_for("huge")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        config_for("tiny", n_heads=3)


class _StandInDevice:
    """A PJRT device of hardware that is not here: just what device_record reads."""

    def __init__(self, kind: str, platform: str) -> None:
        self.device_kind, self.platform = kind, platform
        self.client = type("Client", (), {"platform_version": "stand-in"})()

    def memory_stats(self) -> dict:
        return {"bytes_limit": 80 * 10**9, "bytes_in_use": 0}


@pytest.mark.parametrize(("kind", "platform", "bf16", "int8", "fp8", "f32", "f32_highest", "bandwidth"), [
    # f32 at the default precision runs as TF32 on NVIDIA, one bf16 pass on a TPU; at highest as FP32 or 6 passes.
    ("NVIDIA H100 80GB HBM3", "gpu", 989e12, 1979e12, 1979e12, 494e12, 67e12, 3350e9),
    ("NVIDIA H100 PCIe", "gpu", 756e12, 1513e12, 1513e12, 378e12, 51e12, 2000e9),
    ("NVIDIA H100 NVL", "gpu", 835e12, 1671e12, 1671e12, 418e12, 60e12, 3900e9),
    ("NVIDIA H200", "gpu", 989e12, 1979e12, 1979e12, 494e12, 67e12, 4800e9),
    ("NVIDIA B200", "gpu", 2250e12, 4500e12, 4500e12, 1100e12, 80e12, 8000e9),
    ("NVIDIA A100-SXM4-80GB", "gpu", 312e12, 624e12, None, 156e12, 19.5e12, 2039e9),
    ("NVIDIA A100 80GB PCIe", "gpu", 312e12, 624e12, None, 156e12, 19.5e12, 1935e9),
    ("TPU v5 lite", "tpu", 197e12, 394e12, None, 197e12, 197e12 / 6, 819e9),
    ("TPU v3", "tpu", 123e12 / 2, None, None, 123e12 / 2, 123e12 / 12, 900e9 / 2),  # two devices share a chip
    ("TPU7x", "tpu", 2307e12 / 2, None, 4614e12 / 2, 2307e12 / 2, 2307e12 / 12, 7370e9 / 2),
    ("cpu", "cpu", None, None, None, None, None, None),
])
def test_percent_of_peak_knows_nvidia_and_tpu_device_kinds(kind, platform, bf16, int8, fp8, f32, f32_highest,
                                                            bandwidth):
    from tpu_tools.bench.environment import device_record, matmul_arithmetic, peak_for_dtype

    device = device_record([_StandInDevice(kind, platform)])
    assert peak_for_dtype(device, "bf16") == bf16
    assert peak_for_dtype(device, "f16") == bf16
    assert peak_for_dtype(device, "int8") == int8
    assert peak_for_dtype(device, "fp8") == fp8
    assert peak_for_dtype(device, "f32") == pytest.approx(f32) if f32 else peak_for_dtype(device, "f32") is None
    highest = peak_for_dtype(device, "f32", "highest")
    assert highest == pytest.approx(f32_highest) if f32_highest else highest is None
    arithmetic = matmul_arithmetic(device, "f32", "default")
    assert arithmetic == {"gpu": "tf32", "tpu": "bf16 (1 pass)", "cpu": "fp32"}[platform]
    assert device.peak_memory_bandwidth_bytes_per_s_per_device == bandwidth
    assert device.memory_bytes == 80 * 10**9


@pytest.mark.parametrize(("device_id", "name"), [
    (0x2330, "NVIDIA H100 SXM"), (0x2331, "NVIDIA H100 PCIe"), (0x2321, "NVIDIA H100 NVL"),
    (0x2335, "NVIDIA H200"), (0x2901, "NVIDIA B200"), (0x1234, None),
])
def test_nvidia_parts_are_told_apart_by_pci_device_id(device_id, name):
    from tpu_tools.accelerators import NVIDIA, gpu_spec_for_pci

    spec = gpu_spec_for_pci(NVIDIA, device_id)
    assert (spec.name if spec else None) == name
    assert gpu_spec_for_pci(0x1002, device_id) is None  # an AMD id is never an NVIDIA part


def test_every_chip_with_a_bf16_peak_has_peaks_for_what_its_matmuls_run_as():
    from tpu_tools.accelerators import GPU_SPECS, PRECISIONS, TPU_BY_PCI_ID

    for spec in (*TPU_BY_PCI_ID.values(), *GPU_SPECS):
        for precision in PRECISIONS:
            assert spec.peak_for_matmul("f32", precision), (spec.name, precision)
        if spec.vendor == "nvidia":
            assert spec.peak_tf32_flops, spec.name
            assert spec.peak_int8_ops, spec.name
            assert spec.peak_fp32_flops, spec.name
            assert spec.peak_tf32_flops < spec.peak_bf16_flops < (spec.peak_fp8_flops or float("inf"))
