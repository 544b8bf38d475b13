"""`tpu-profile hlo`: a real function lowered and compiled on the CPU platform."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import assert_one_line_error, clean_env, run_tool

HLO_KEYS = {"schema", "target", "args", "platform", "device_kind", "files", "lowering_time_s", "compile_time_s",
            "cost", "memory", "roofline", "model_flops", "xla_to_model_flops_ratio", "outputs"}
COST_KEYS = {"flops", "transcendentals", "bytes_accessed", "output_bytes_accessed"}
MEMORY_KEYS = {"argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes", "peak_bytes"}
ROOFLINE_KEYS = {"chip", "peak_dtype", "peak_flops_per_s", "memory_bandwidth_bytes_per_s",
                 "arithmetic_intensity_flops_per_byte", "ridge_point_flops_per_byte", "bound", "compute_time_us",
                 "memory_time_us", "best_case_time_us", "note"}

MODEL = """
    import jax
    import jax.numpy as jnp

    LAYERS = 3


    def layer(x, w):
        return jnp.tanh(x @ w)


    @jax.jit
    def scaled(x):
        return x * 2.0


    class Model:
        pass
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL))
    return tmp_path


def hlo(project, *args: str):
    return run_tool("tpu-profile", "hlo", *args, cwd=project, env=clean_env(JAX_PLATFORMS="cpu"))


def test_hlo_json_has_files_cost_memory_and_roofline(project):
    result = hlo(project, "model:layer", "--arg", "f32[128,512]", "--arg", "f32[512,256]", "--out", "h", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document) == HLO_KEYS
    assert document["schema"] == "tpu-tools/profile-hlo/v1"
    assert set(document["cost"]) == COST_KEYS
    assert set(document["memory"]) == MEMORY_KEYS
    assert set(document["roofline"]) == ROOFLINE_KEYS
    assert document["args"] == ["f32[128,512]", "f32[512,256]"]
    assert document["platform"] == "cpu"
    # The matmul alone is 2*128*512*256 FLOPs; tanh adds the rest.
    assert document["cost"]["flops"] >= 2 * 128 * 512 * 256
    assert document["cost"]["transcendentals"] == 128 * 256
    assert document["memory"]["argument_bytes"] == (128 * 512 + 512 * 256) * 4
    assert document["memory"]["output_bytes"] == 128 * 256 * 4
    assert document["compile_time_s"] > 0
    assert document["outputs"] == [{"index": 0, "reach": "replicated_input", "axes": [], "devices": 1,
                                    "text": "replicated input, no reduction needed"}]  # one device: nothing to reduce
    stablehlo = (project / document["files"]["stablehlo"]).read_text()
    optimized = (project / document["files"]["optimized_hlo"]).read_text()
    assert "stablehlo.dot_general" in stablehlo
    assert "tensor<128x512xf32>" in stablehlo
    assert optimized.startswith("HloModule jit_layer")
    roof = document["roofline"]
    assert roof["chip"] is None
    assert roof["bound"] is None
    assert "--chip" in roof["note"]
    assert roof["arithmetic_intensity_flops_per_byte"] == pytest.approx(
        document["cost"]["flops"] / document["cost"]["bytes_accessed"])


def test_hlo_roofline_against_a_named_chip(project):
    result = hlo(project, "model:scaled", "--arg", "bf16[1024,1024]", "--chip", "v6e", "--out", "h")
    assert result.returncode == 0, result.stderr
    assert "Roofline against TPU v6e" in result.stdout
    assert "memory-bound" in result.stdout  # one multiply per element: far below the ridge point
    for line in ("StableHLO:", "optimised HLO:", "FLOPs", "bytes accessed", "temporaries", "generated code",
                 "best case"):
        assert line in result.stdout, line


def test_bad_arg_specs(project):
    assert_one_line_error(hlo(project, "model:layer", "--arg", "f32[128,"), 2, "bad --arg 'f32[128,'")
    assert_one_line_error(hlo(project, "model:layer", "--arg", "float[3]"), 2, "bad --arg")
    assert_one_line_error(hlo(project, "model:layer", "--arg", "f32[3,4]"), 2, "cannot be called with 1")


@pytest.mark.budget(20)  # five runs of the program, three of them importing jax
def test_targets_that_are_not_functions(project):
    assert_one_line_error(hlo(project, "model:LAYERS"), 2, "model:LAYERS is not a function (it is an int)")
    assert_one_line_error(hlo(project, "model:Model"), 2, "is not a function (it is the class Model)")
    assert_one_line_error(hlo(project, "model:missing"), 2, "has no 'missing'")
    assert_one_line_error(hlo(project, "model"), 2, "expected MODULE:FUNCTION")
    assert_one_line_error(hlo(project, "no_such_module:f"), 2, "cannot import module 'no_such_module'")


def test_shapes_that_do_not_fit_and_unknown_chips(project):
    mismatch = hlo(project, "model:layer", "--arg", "f32[3,4]", "--arg", "f32[5,6]")
    assert_one_line_error(mismatch, 1, "tracing model:layer with f32[3,4], f32[5,6] failed")
    assert_one_line_error(hlo(project, "model:scaled", "--arg", "f32[2]", "--chip", "z80"), 2, "not a known chip")
    assert sorted(p.name for p in project.iterdir() if p.is_dir() and p.name != "__pycache__") == []


def test_existing_output_folder(project):
    (project / "h").mkdir()
    assert_one_line_error(hlo(project, "model:scaled", "--arg", "f32[2]", "--out", "h"), 2, "already exists")
    assert hlo(project, "model:scaled", "--arg", "f32[2]", "--out", "h", "--force").returncode == 0


def test_builtin_train_workload_is_the_bench_train_step(tmp_path):
    result = hlo(tmp_path, "train", "--preset", "tiny", "--batch", "4", "--out", "h", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["target"] == "train[tiny, batch 4]"
    from tpu_tools.workloads.transformer import config_for, train_step_flops

    assert document["model_flops"] == train_step_flops(config_for("tiny"), 4)
    # XLA counts every op, the analytic figure matrix multiplies only: close, and never far below.
    assert 0.9 <= document["xla_to_model_flops_ratio"] <= 2.0
    assert document["memory"]["argument_bytes"] > 0
    stablehlo = (tmp_path / "h" / "train_tiny_batch_4.stablehlo.mlir").read_text()
    assert "func.func public @main" in stablehlo
    assert "stablehlo.dot_general" in stablehlo


def test_builtin_infer_workload_renders_the_model_flops(tmp_path):
    result = hlo(tmp_path, "infer", "--out", "h")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("infer[tiny, batch ")
    assert "model FLOPs" in result.stdout
    assert "(analytic" in result.stdout


def test_builtin_workload_bad_input(tmp_path):
    assert_one_line_error(hlo(tmp_path, "train", "--arg", "f32[2]"), 2, "knows its arguments")
    assert_one_line_error(hlo(tmp_path, "train", "--preset", "huge"), 2, "unknown preset 'huge'")
    assert_one_line_error(hlo(tmp_path, "train", "--batch", "0"), 2, "--batch")
    assert_one_line_error(hlo(tmp_path, "model:layer", "--preset", "tiny"), 2, "built-in train and infer")
