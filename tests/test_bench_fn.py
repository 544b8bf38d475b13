"""`tpu-bench fn MODULE:FUNCTION --arg SPEC`: a user's function timed on the real CPU runtime, its figures from
XLA's cost analysis, the roofline placement, and the --baseline gate."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_tool

from tpu_tools.bench.fn import placement

USER_MODULE = '''
import jax
import jax.numpy as jnp


def gemm(a, b):
    return jnp.tanh(a @ b)


@jax.jit
def halves(x):
    return {"half": x * 0.5, "total": jnp.sum(x)}


def broken(x):
    raise ValueError("no such thing")
'''
FAST = ("--min-time", "0.1", "--warmup", "1")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("userfn")
    (folder / "userkernels.py").write_text(USER_MODULE)
    return folder


def bench(workdir: Path, *args: str):
    return run_tool("tpu-bench", "fn", *args, *FAST, cwd=workdir, timeout=240)


@pytest.fixture(scope="module")
def gemm_run(workdir) -> dict:
    path = workdir / "gemm.json"
    result = bench(workdir, "userkernels:gemm", "--arg", "f32[256,256]", "--arg", "f32[256,256]", "--json",
                   str(path))
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text())


def test_a_user_gemm_is_timed_and_its_flops_come_from_xla(gemm_run):
    (case,) = gemm_run["results"]
    assert case["status"] == "ok"
    assert case["benchmark"] == "fn"
    assert case["id"] == "fn/userkernels:gemm/f32[256,256],f32[256,256]"
    assert case["params"] == {"target": "userkernels:gemm", "args": ["f32[256,256]", "f32[256,256]"]}
    values = case["values"]
    assert values["xla_flops_per_call"] >= 2 * 256 ** 3  # the matmul, and tanh's work on top
    assert values["xla_bytes_per_call"] >= 3 * 256 * 256 * 4  # two inputs read, one output written
    assert values["timing"] == "back_to_back"
    assert values["calls_per_sample"] >= 1
    assert case["primary"] == "throughput_tflops"
    time_s = case["stats"]["time_us"]["median"] / 1e6
    rate = case["stats"]["throughput_tflops"]["median"] * 1e12
    assert rate == pytest.approx(values["xla_flops_per_call"] / time_s, rel=0.05)
    bandwidth = case["stats"]["bandwidth_gbps"]["median"] * 1e9
    assert bandwidth == pytest.approx(values["xla_bytes_per_call"] / time_s, rel=0.05)
    assert values["arithmetic_intensity_flops_per_byte"] == pytest.approx(
        values["xla_flops_per_call"] / values["xla_bytes_per_call"])
    assert values["peak_dtype"] == "f32"
    # The CPU has no published peak: no % of peak, no roofline, and nothing made up.
    assert values["percent_of_peak"] is None
    assert values["percent_of_roofline"] is None


def test_the_text_report_shows_the_rate_and_the_compile_time(workdir):
    result = bench(workdir, "userkernels:gemm", "--arg", "f32[128,128]", "--arg", "f32[128,128]")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("fn "))
    assert "userkernels:gemm f32[128,128],f32[128,128]" in row
    assert "FLOP/s" in row
    assert "compile" in row


def test_a_jitted_function_with_a_pytree_output_is_timed(workdir):
    result = bench(workdir, "userkernels:halves", "--arg", "bf16[512,512]", "--json", "-")
    assert result.returncode == 0, result.stderr
    (case,) = json.loads(result.stdout)["results"]
    assert case["status"] == "ok"
    assert case["values"]["peak_dtype"] == "bf16"
    assert case["stats"]["time_us"]["count"] >= 3


def _faster(document: dict, factor: float) -> dict:
    """The same run with every rate `factor` times higher and every time `factor` times shorter."""
    forged = copy.deepcopy(document)
    for case in forged["results"]:
        for summary in case["stats"].values():
            scale = factor if summary["higher_is_better"] else 1 / factor
            for key in ("median", "p25", "p75", "p90", "p99", "min", "max", "mean"):
                summary[key] *= scale
    return forged


def test_the_baseline_gate_fails_a_regression_and_passes_a_match(workdir, gemm_run):
    faster = workdir / "faster.json"
    faster.write_text(json.dumps(_faster(gemm_run, 1000.0)))
    args = ("userkernels:gemm", "--arg", "f32[256,256]", "--arg", "f32[256,256]")
    result = bench(workdir, *args, "--baseline", str(faster))
    assert_one_line_error(result, 3, "regressed beyond 5%", "fn/userkernels:gemm/f32[256,256],f32[256,256]")
    slower = workdir / "slower.json"
    slower.write_text(json.dumps(_faster(gemm_run, 1 / 1000.0)))
    passed = bench(workdir, *args, "--baseline", str(slower), "--json", "-")
    assert passed.returncode == 0, passed.stderr
    comparison = json.loads(passed.stdout)["comparison"]
    assert comparison["regression_count"] == 0
    assert {c["figure"] for c in comparison["changes"]} == {"time_us", "throughput_tflops", "bandwidth_gbps"}


@pytest.mark.parametrize(("args", "fragments"), [
    (("nosuchmodule:f", "--arg", "f32[2]"), ("cannot import module 'nosuchmodule'",)),
    (("userkernels:missing", "--arg", "f32[2]"), ("has no 'missing'",)),
    (("userkernels:gemm", "--arg", "f32[2]"), ("cannot be called with 1 argument",)),
    (("userkernels:gemm", "--arg", "f32[2,x]", "--arg", "f32[2]"), ("bad --arg",)),
    (("userkernels", "--arg", "f32[2]"), ("expected MODULE:FUNCTION",)),
])
def test_a_wrong_target_or_argument_is_a_usage_error(workdir, args, fragments):
    assert_one_line_error(bench(workdir, *args), 2, *fragments)


def test_a_function_that_fails_to_trace_is_a_failed_case_with_its_reason(workdir):
    result = bench(workdir, "userkernels:broken", "--arg", "f32[4]", "--json", "-")
    assert result.returncode == 1
    (case,) = json.loads(result.stdout)["results"]
    assert case["status"] == "failed"
    assert "ValueError: no such thing" in case["message"]


def test_placement_against_the_ceilings():
    # 1 GFLOP and 1 GB in 10 ms on a device of 1 TFLOP/s and 1 TB/s: both ceilings give 1 ms.
    compute_bound = placement(0.010, 4e9, 1e9, 1e12, 1e12)
    assert compute_bound.predicted_bound == "compute"
    assert compute_bound.measured_bound == "compute"
    assert compute_bound.compute_percent == pytest.approx(40.0)
    assert compute_bound.bandwidth_percent == pytest.approx(10.0)
    assert compute_bound.best_case_us == pytest.approx(4000.0)
    assert compute_bound.percent_of_roofline == pytest.approx(40.0)
    memory_bound = placement(0.004, 1e9, 2e9, 1e12, 1e12)
    assert memory_bound.predicted_bound == "memory"
    assert memory_bound.percent_of_roofline == pytest.approx(50.0)
    unknown = placement(0.004, 1e9, 2e9, None, None)
    assert unknown.percent_of_roofline is None
    assert unknown.predicted_bound is None
