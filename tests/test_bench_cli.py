"""`tpu-bench` end to end: the real console script on the real CPU runtime.

Sizes are tiny and --min-time short: these tests check behaviour (what is
measured, reported, written and gated), not speed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from conftest import REPO, assert_one_line_error, clean_env, run_tool, tool_command
from isolation import kill_tmux_server, tmux_command, unique_name
from programs import require_program
from terminal import StderrOnTerminal

FAST = ("--min-time", "0.02", "--warmup", "1")
TOY_MODEL = ("--layers", "1", "--d-model", "32", "--heads", "2", "--d-ff", "64", "--seq-len", "16", "--vocab", "64",
             "--batch-per-device", "2")

# XLA's cheapest code generation: it halves a cold compile of the train step (seconds on a CPU), and what the
# persistent cache writes and hits is the same; for tests of the compile benchmark's mechanics, not of XLA.
CHEAP_COMPILES = ("--xla-flag", "--xla_backend_optimization_level=0")

DOCUMENT_KEYS = {"schema", "time", "suite", "interrupted", "settings", "environment", "device", "results", "notes",
                 "comparison"}
ENVIRONMENT_KEYS = {"host", "os", "python", "cpu_model", "cpu_count", "cpus_usable", "versions", "variables",
                    "command"}
DEVICE_KEYS = {"platform", "platform_version", "kind", "count", "process_count", "chip", "devices_per_chip",
               "memory_bytes", "peak_ops_per_s_per_device", "f32_matmul",
               "peak_memory_bandwidth_bytes_per_s_per_device"}
RESULT_KEYS = {"id", "benchmark", "name", "params", "status", "message", "primary", "stats", "values", "warnings",
               "duration_s"}
SUMMARY_KEYS = {"median", "p25", "p75", "p90", "p99", "min", "max", "mean", "stdev", "count", "higher_is_better"}


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_tool("tpu-bench", *args, timeout=timeout)


def bench_json(path: Path, *args: str) -> dict:
    result = bench(*args, "--json", str(path))
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text())


def by_id(document: dict) -> dict[str, dict]:
    return {r["id"]: r for r in document["results"]}


def test_matmul_pins_the_schema_and_reports_an_unsupported_dtype_while_the_rest_run(tmp_path):
    result = bench("matmul", "--size", "64,32x48x16", "--dtype", "f32,int8", "--dtype", "int4", *FAST,
                   "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"))
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout  # plain text in a pipe
    assert result.stdout.splitlines()[2].split()[:5] == ["BENCHMARK", "CASE", "MEDIAN", "SPREAD", "N"]
    assert result.stdout.count("int4 matmul is unsupported on cpu") == 2

    document = json.loads((tmp_path / "r.json").read_text())
    assert set(document) == DOCUMENT_KEYS
    assert document["schema"] == "tpu-tools/bench/v1"
    assert set(document["environment"]) == ENVIRONMENT_KEYS
    assert set(document["device"]) == DEVICE_KEYS
    assert document["device"]["kind"] == "cpu"
    assert document["device"]["count"] == 1
    assert document["environment"]["versions"]["jax"]
    assert document["settings"]["min_time_s"] == 0.02
    cases = by_id(document)
    assert list(cases) == ["matmul/f32/64", "matmul/f32/32x48x16", "matmul/int8/64",
                           "matmul/int8/32x48x16", "matmul/int4/64", "matmul/int4/32x48x16"]
    for case in cases.values():
        assert set(case) == RESULT_KEYS
    f32 = cases["matmul/f32/64"]
    assert f32["status"] == "ok"
    assert f32["primary"] == "throughput_tflops"
    assert set(f32["stats"]) == {"time_us", "throughput_tflops"}
    for summary in f32["stats"].values():
        assert set(summary) == SUMMARY_KEYS
        assert summary["count"] >= 3
        assert summary["p25"] <= summary["median"] <= summary["p75"]
    assert f32["stats"]["throughput_tflops"]["higher_is_better"] is True
    assert f32["values"]["flops_per_call"] == 2 * 64 ** 3
    assert f32["values"]["xla_flops_per_call"] == pytest.approx(2 * 64 ** 3, rel=0.1)
    assert f32["values"]["percent_of_peak"] is None  # no published peak for a CPU
    # Calls back to back (the calibration itself is tested in test_bench_timing.py: on a busy host one call
    # may already last the 2 ms sample); what ran and what else ran beside it.
    assert f32["values"]["timing"] == "back_to_back"
    assert f32["values"]["calls_per_sample"] >= 1
    assert f32["values"]["sample_ms"] > 0
    assert f32["values"]["repeats"] == 3
    assert f32["values"]["repeat_spread_percent"] >= 0
    assert f32["values"]["precision"] == "default"
    assert f32["values"]["arithmetic"] == "fp32"
    assert set(f32["values"]["interference"]) == {"other_processes_cpu_percent", "steal_percent",
                                                  "load_average_1m", "cpu_mhz", "cpus"}
    assert isinstance(f32["values"]["noisy"], bool)
    assert document["device"]["f32_matmul"]["highest"]["arithmetic"] == "fp32"
    assert f32["values"]["compile_ms"] > 0
    assert cases["matmul/f32/32x48x16"]["values"]["flops_per_call"] == 2 * 32 * 48 * 16
    assert cases["matmul/int8/64"]["primary"] == "throughput_tops"
    int4 = cases["matmul/int4/64"]
    assert int4["status"] == "unsupported"
    assert "unsupported on cpu" in int4["message"]
    assert not int4["stats"]

    suite = ElementTree.parse(tmp_path / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("skipped"), suite.get("failures"), suite.get("errors")) == ("6", "2", "0",
                                                                                                      "0")


def test_out_of_memory_is_reported_and_the_suite_goes_on(tmp_path):
    document = bench_json(tmp_path / "r.json", "memory", "--size", "1T,64K", "--op", "copy,triad", *FAST)
    cases = by_id(document)
    huge = cases["memory/copy/1.0TiB"]
    assert huge["status"] == "out_of_memory"
    assert "out of memory" in huge["message"]
    assert "free" in huge["message"]
    assert cases["memory/triad/1.0TiB"]["status"] == "out_of_memory"
    copy, triad = cases["memory/copy/64.0KiB"], cases["memory/triad/64.0KiB"]
    assert copy["status"] == triad["status"] == "ok"
    assert copy["values"]["bytes_per_call"] == 2 * 65536
    assert triad["values"]["bytes_per_call"] == 3 * 65536
    assert copy["values"]["xla_bytes_per_call"] == pytest.approx(2 * 65536, rel=0.1)
    assert copy["stats"]["bandwidth_gbps"]["median"] > 0


def test_a_real_allocation_failure_is_classified_as_out_of_memory():
    """The runtime's own error (not the pre-check) for a buffer no host has."""
    script = ("import jax.numpy as jnp\nfrom tpu_tools.bench.failures import classify\n"
              "try:\n    jnp.zeros((1 << 46,), jnp.float32).block_until_ready()\n"
              "except Exception as error:\n    print(classify(error, 'cpu')[0])\n")
    import sys

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=clean_env(JAX_PLATFORMS="cpu"))
    assert result.stdout.strip() == "out_of_memory", result.stderr


def test_transfer_every_direction_and_path_printed_as_json(tmp_path):
    result = bench("transfer", "--size", "4K,1M", *FAST, "--json", "-")
    assert result.returncode == 0, result.stderr
    cases = by_id(json.loads(result.stdout))
    assert list(cases) == [f"transfer/{direction}/{size}" for direction in ("h2d", "d2h", "h2d-pinned", "d2h-pinned")
                           for size in ("4.0KiB", "1.0MiB")]
    for case in cases.values():
        assert case["status"] == "ok"
        assert case["stats"]["bandwidth_gbps"]["median"] > 0
        assert isinstance(case["values"]["host_memory_aliased"], bool)
        assert case["stats"]["bandwidth_gbps"]["count"] >= 10  # enough samples for a spread, every size
    assert cases["transfer/h2d/1.0MiB"]["values"]["bytes_per_call"] == 1 << 20
    assert "pageable" in cases["transfer/d2h/1.0MiB"]["values"]["path"]
    assert "pinned_host memory space" in cases["transfer/d2h-pinned/1.0MiB"]["values"]["path"]
    only = bench("transfer", "--size", "4K", "--direction", "d2h-pinned", *FAST, "--json", "-")
    only = by_id(json.loads(only.stdout))
    assert list(only) == ["transfer/d2h-pinned/4.0KiB"]


def test_dispatch_with_options_given_before_the_benchmark_name(tmp_path):
    document = bench_json(tmp_path / "r.json", "--min-time", "0.05", "--warmup", "1", "dispatch")
    assert document["settings"]["min_time_s"] == 0.05
    assert document["settings"]["benchmarks"] == ["dispatch"]
    cases = by_id(document)
    compiled, eager = cases["dispatch/compiled"], cases["dispatch/eager"]
    assert compiled["primary"] == "latency_us"
    assert compiled["values"]["compile_ms"] > 0
    assert 0 < compiled["stats"]["latency_us"]["median"] < 100_000
    assert eager["stats"]["latency_us"]["count"] >= 3


def test_train_runs_data_parallel_with_mfu_cost_and_a_flop_cross_check(tmp_path):
    result = bench("train", "--host-devices", "2", *TOY_MODEL, "--price-per-hour", "3.6", *FAST,
                   "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["device"]["count"] == 2
    assert "--xla_force_host_platform_device_count=2" in document["environment"]["variables"]["XLA_FLAGS"]
    (case,) = document["results"]
    assert case["id"] == "train/custom/l1-d32-h2-f64-s16-v64-b2-float32"
    values, stats = case["values"], case["stats"]
    assert values["devices"] == 2
    assert values["global_batch"] == 4
    assert set(stats) == {"step_time_ms", "samples_per_s", "tokens_per_s"}
    assert stats["tokens_per_s"]["median"] == pytest.approx(16 * stats["samples_per_s"]["median"])
    assert values["cost_per_1m_samples"] == pytest.approx(3.6 / 3600 * 1e6 / stats["samples_per_s"]["median"])
    assert values["mfu_percent"] is None
    assert values["compile_ms"] > 0
    assert values["model_flops_per_step"] > 0
    assert values["xla_flops_per_step"] > 0
    # a toy model's norms, softmax and optimizer outweigh its matmuls: the cross-check says so
    assert any("XLA's cost analysis counts" in w for w in case["warnings"])
    assert "warning: train/custom" in result.stdout
    assert "per 1M samples" in result.stdout


def test_infer_over_batch_sizes(tmp_path):
    document = bench_json(tmp_path / "r.json", "infer", *TOY_MODEL, "--batch-sizes", "3,1", *FAST)
    cases = by_id(document)
    assert [c["values"]["batch_size"] for c in cases.values()] == [1, 3]
    for case in cases.values():
        assert case["status"] == "ok"
        assert case["primary"] == "samples_per_s"
        latency = case["stats"]["latency_ms"]
        assert latency["median"] <= latency["p99"]
        assert case["values"]["compile_ms"] > 0


def test_compile_cold_then_warm_from_the_persistent_cache(tmp_path):
    cache = tmp_path / "cache"
    document = bench_json(tmp_path / "r.json", "compile", *TOY_MODEL, "--cache-dir", str(cache), *FAST,
                          *CHEAP_COMPILES)
    (case,) = document["results"]
    assert case["status"] == "ok", case["message"]
    assert case["values"]["cache_hit_verified"] is True
    assert case["values"]["cache_entries_written"] >= 1
    assert case["stats"]["cold_compile_ms"]["count"] == 1
    assert case["stats"]["warm_compile_ms"]["median"] > 0
    assert case["values"]["cold_backend_compile_ms"] > case["values"]["warm_backend_compile_ms"]
    assert list(cache.iterdir()) == []  # the tool removed its cache directory again


@pytest.mark.parametrize(("args", "fragment"), [
    (["nosuch"], "No such command"),
    (["train", "--preset", "huge"], "'huge' is not one of"),
    (["infer", "--preset", "huge"], "'huge' is not one of"),
    (["matmul", "--dtype", "f64"], "unknown dtype 'f64'"),
    (["matmul", "--precision", "tf32"], "unknown precision 'tf32': choose from default, high, highest"),
    (["matmul", "--size", "0"], "must be at least 1"),
    (["matmul", "--size", "-4"], "must be at least 1"),
    (["matmul", "--size", "big"], "not a matrix size"),
    (["matmul", "--size", "99999999999"], "absurdly large"),
    (["memory", "--size", "0"], "at least 1 byte"),
    (["memory", "--size", "lots"], "is not a size"),
    (["memory", "--size", "99999T"], "absurdly large"),
    (["memory", "--op", "copy,swap"], "unknown operation 'swap'"),
    (["transfer", "--size", "-1K"], "is not a size"),
    (["transfer", "--direction", "sideways"], "unknown direction"),
    (["train", "--d-model", "0"], "must be greater than 0"),
    (["train", "--d-model", "99999999"], "absurdly large"),
    (["train", "--heads", "3"], "must be a multiple of"),
    (["infer", "--batch-sizes", "0"], "at least 1"),
    (["infer", "--max-batch", "99999999"], "absurdly large"),
    (["--min-time", "0"], "must be greater than 0"),
    (["--tolerance", "lots"], "not a percentage"),
    (["--price-per-hour", "2", "matmul"], "does not apply to `tpu-bench matmul`"),
    (["--json", "/nonexistent/dir/r.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    assert_one_line_error(bench(*args), 2, fragment)


def test_a_missing_baseline_is_refused_before_anything_runs(tmp_path):
    result = bench("--baseline", str(tmp_path / "none.json"))
    message = assert_one_line_error(result, 2, "does not exist")
    assert message.startswith("tpu-bench: error: baseline file")
    assert result.stdout == ""  # no benchmark ran: not one line of a table


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("baseline") / "base.json"
    result = bench("dispatch", "--mode", "compiled", "--min-time", "0.1", "--warmup", "1", "--json", str(path))
    assert result.returncode == 0, result.stderr
    return path


def _forged(baseline: Path, folder: Path, name: str, speedup: float = 1.0, **device: str) -> Path:
    document = json.loads(baseline.read_text())
    for case in document["results"]:
        for summary in case["stats"].values():
            for key in ("median", "p25", "p75", "p90", "p99", "min", "max", "mean"):
                summary[key] /= speedup
    document["device"].update(device)
    path = folder / name
    path.write_text(json.dumps(document))
    return path


def test_a_run_within_tolerance_passes_and_records_the_comparison(baseline, tmp_path):
    document_path = tmp_path / "r.json"
    # Against a baseline 1000 times slower than this host's own: this test is about a passing run being
    # recorded, not about the host. Dispatch latency measured while the suite keeps both cores busy was more
    # than 6 times the module's baseline once in a whole-suite run (4 times slower and 60% failed then).
    slower = _forged(baseline, tmp_path, "slower.json", speedup=0.001)
    result = bench("dispatch", "--mode", "compiled", "--min-time", "0.1", "--warmup", "1",
                   "--baseline", str(slower), "--tolerance", "60%", "--json", str(document_path))
    assert result.returncode == 0, result.stderr
    assert "compared with the baseline (tolerance 60%)" in result.stdout
    assert "no regression" in result.stdout
    comparison = json.loads(document_path.read_text())["comparison"]
    assert comparison["regression_count"] == 0
    assert comparison["tolerance_percent"] == 60
    assert comparison["changes"][0]["case_id"] == "dispatch/compiled"


def test_a_regression_beyond_tolerance_exits_3_with_junit_failures(baseline, tmp_path):
    fast = _forged(baseline, tmp_path, "fast.json", speedup=20.0)
    result = bench("dispatch", "--mode", "compiled", "--min-time", "0.1", "--warmup", "1", "--baseline", str(fast),
                   "--junit", str(tmp_path / "j.xml"))
    message = assert_one_line_error(result, 3, "regressed beyond 5%")
    assert "dispatch/compiled latency_us" in message
    assert "regression" in result.stdout
    suite = ElementTree.parse(tmp_path / "j.xml").getroot()
    assert suite.get("failures") == "1"
    assert suite.find("testcase/failure").get("type") == "regression"


def test_a_baseline_from_another_device_kind_is_refused_unless_allowed(baseline, tmp_path):
    # 20 times slower figures than this host's: the comparison itself must pass, whatever the load here
    other = _forged(baseline, tmp_path, "tpu.json", speedup=0.05, kind="TPU v5 lite", platform="tpu")
    assert_one_line_error(bench("dispatch", "--mode", "compiled", *FAST, "--baseline", str(other)), 2,
                          "'TPU v5 lite' (tpu)", "not comparable")
    result = bench("dispatch", "--mode", "compiled", *FAST, "--baseline", str(other), "--allow-mismatch",
                   "--tolerance", "90%")
    assert result.returncode == 0, result.stderr
    assert "warning: the baseline was measured on 'TPU v5 lite'" in result.stdout


def test_compare_two_files(baseline, tmp_path):
    same = run_tool("tpu-bench", "compare", str(baseline), str(baseline))
    assert same.returncode == 0, same.stderr
    assert "dispatch/compiled" in same.stdout
    assert "+0.0%" in same.stdout
    document = json.loads(baseline.read_text())
    document["environment"]["versions"]["jax"] = "0.0.1"
    older = tmp_path / "older.json"
    older.write_text(json.dumps(document))
    fast = _forged(baseline, tmp_path, "fast.json", speedup=20.0)
    worse = run_tool("tpu-bench", "compare", str(fast), str(baseline), "--json", str(tmp_path / "c.json"))
    assert_one_line_error(worse, 3, "regressed")
    assert json.loads((tmp_path / "c.json").read_text())["regression_count"] == 2  # latency and back to back
    warned = run_tool("tpu-bench", "compare", str(older), str(baseline))
    assert warned.returncode == 0
    assert "warning: jax version differs: baseline '0.0.1'" in warned.stdout


@pytest.mark.parametrize("content", [None, "not json {", json.dumps({"schema": "tpu-tools/ls/v1", "devices": []})])
def test_compare_refuses_files_that_are_not_results(baseline, tmp_path, content):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    expected = {None: "does not exist", "not json {": "is not JSON"}.get(content, "not a tpu-bench result")
    assert_one_line_error(run_tool("tpu-bench", "compare", str(path), str(baseline)), 2, expected)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*tool_command("tpu-bench"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env())


@pytest.mark.budget(20)  # the suite's compile benchmark (a cold and a warm compile in child processes) first
def test_ctrl_c_mid_suite_writes_partial_results_and_exits_130(tmp_path):
    # the compile case runs first (in child processes), then the in-process cases 30 s each: Ctrl-C in the first
    # stderr on a terminal, where tpu-bench draws its progress bar: it names the case in flight
    with StderrOnTerminal([*tool_command("tpu-bench"), "--cache-dir", str(tmp_path / "cache"), "--min-time", "30",
                           *CHEAP_COMPILES, "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml")],
                          clean_env(TERM="xterm", COLUMNS="120")) as run:
        run.wait_for("dispatch compiled")
        out, err = run.finish(signal.SIGINT)
    process = run.process
    assert process.returncode == 130, err
    assert "interrupted: partial results written to" in err
    assert "Traceback" not in err
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["interrupted"] is True
    assert any("interrupted" in n for n in document["notes"])
    statuses = [r["status"] for r in document["results"]]
    assert statuses[0] == "ok"  # compile finished before the interruption
    finished = statuses.count("ok")
    assert statuses[:finished] == ["ok"] * finished
    assert set(statuses[finished:]) <= {"interrupted", "not_run"}
    assert statuses[-1] == "not_run"
    assert statuses.count("interrupted") <= 1
    assert len(statuses) > 10  # what did not run is listed too
    assert ElementTree.parse(tmp_path / "j.xml").getroot().get("skipped") == str(len(statuses) - finished)
    assert "not run" in out


def test_ctrl_c_during_the_compile_child_leaves_no_process_or_cache_behind(tmp_path):
    import psutil

    cache = tmp_path / "cache"
    process = _start("compile", *TOY_MODEL, "--cache-dir", str(cache), "--json", str(tmp_path / "r.json"))

    def compile_child_running() -> bool:  # past its exec: a forked child still bears the parent's command line
        for child in psutil.Process(process.pid).children(recursive=True):
            try:
                if "tpu_tools.pjrt.child" in " ".join(child.cmdline()):
                    return True
            except psutil.Error:  # a child that ended (a zombie has no command line) or that went away
                continue
        return False

    try:
        _wait_for(compile_child_running, 120, "the compile child to start")
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert list(cache.iterdir()) == []
    (case,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert case["status"] == "interrupted"
    stray = [p.pid for p in psutil.process_iter(["cmdline"]) if str(cache) in " ".join(p.info["cmdline"] or [])]
    assert stray == []


@pytest.mark.parametrize(("width", "height"), [(80, 24), (160, 40)])
def test_terminal_shows_a_progress_bar_then_a_rich_table(tmp_path, width, height):
    require_program("tmux")
    session = "bench"
    server = unique_name("bench")
    script = tmp_path / "run.sh"
    # each case samples twice --min-time (per call, then back to back): the bar shows for 3 s at least
    script.write_text(f"{' '.join(tool_command('tpu-bench'))} dispatch --min-time 0.75 --warmup 1; "
                      "echo EXIT=$?; sleep 60\n")
    subprocess.run([*tmux_command(server), "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height),
                    "bash", str(script)], check=True, env=clean_env())
    try:
        def pane() -> str:
            return subprocess.run([*tmux_command(server), "capture-pane", "-p", "-t", session],
                                  capture_output=True, text=True).stdout

        _wait_for(lambda: "dispatch compiled" in pane(), 60, "the progress bar")
        assert "/2" in pane()  # cases done of cases planned
        _wait_for(lambda: "EXIT=" in pane(), 60, "the end of the run")
        screen = pane()
        assert "EXIT=0" in screen
        assert "BENCHMARK" in screen
        assert "━" not in screen  # the bar went away
        assert "compiled" in screen
        assert "eager" in screen
        assert " us" in screen
        assert max(len(line) for line in screen.splitlines()) <= width
    finally:
        kill_tmux_server(server)


def test_a_platform_that_is_not_installed_is_one_line_and_exit_1():
    assert_one_line_error(bench("--platform", "tpu"), 1, "tpu platform is not available")


def test_matmul_precision_is_a_case_of_its_own_and_says_what_ran(tmp_path):
    document = bench_json(tmp_path / "r.json", "matmul", "--size", "32", "--dtype", "f32,bf16", "--precision",
                          "default,highest", *FAST)
    cases = by_id(document)
    assert list(cases) == ["matmul/f32/32", "matmul/bf16/32", "matmul/f32/32/highest", "matmul/bf16/32/highest"]
    assert all(case["status"] == "ok" for case in cases.values())
    assert cases["matmul/f32/32/highest"]["values"]["precision"] == "highest"
    assert cases["matmul/f32/32/highest"]["values"]["arithmetic"] == "fp32"  # the CPU computes f32 in f32
    assert cases["matmul/bf16/32"]["values"]["arithmetic"] == "bf16"
    assert cases["matmul/f32/32"]["params"]["precision"] == "default"


def test_the_checked_in_gpu_baseline_is_a_result_the_gate_reads():
    """benchmarks/baselines/h100-sxm-quick.json: a real H100 run, kept readable as the result schema moves on."""
    baseline = REPO / "benchmarks" / "baselines" / "h100-sxm-quick.json"
    result = bench("compare", str(baseline), str(baseline))
    assert result.returncode == 0, result.stderr
    document = json.loads(baseline.read_text())
    assert document["device"]["kind"] == "NVIDIA H100 80GB HBM3"
    assert document["device"]["chip"] == "NVIDIA H100 SXM"
    assert not document["interrupted"]
    cases = {c["id"]: c for c in document["results"]}
    assert cases["matmul/bf16/8192"]["status"] == "ok"
    assert cases["matmul/f32/8192"]["values"]["arithmetic"] == "tf32"
    assert "pinned_host" in cases["transfer/d2h-pinned/256.0MiB"]["values"]["path"]
    gpu = cases["matmul/bf16/8192"]["values"]["interference"]["gpu"]  # NVML's reading at the end of the case
    assert gpu["sm_clock_max_mhz"] == 1980
    assert gpu["power_limit_watts"] == 700
