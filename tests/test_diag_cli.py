"""tpu-diag end to end: the real program on the CPU runtime; bad input; busy devices; signals; the last result."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import sysroot
from conftest import assert_one_line_error, clean_env, run_tool, tool_command
from terminal import StderrOnTerminal


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    rundir = tmp_path / "run"
    rundir.mkdir(mode=0o700, exist_ok=True)
    return clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), **extra)


def test_quick_level_passes_prints_json_and_keeps_the_last_result(tmp_path):
    env = _env(tmp_path)
    result = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "4", "--json", "--junit",
                      str(tmp_path / "diag.xml"), env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "tpu-tools/diag/v1"
    assert document["status"] == "pass"
    assert document["level"] == 1
    assert document["device_ids"] == [0, 1, 2, 3]
    assert {(c["test"], c["device"]) for c in document["checks"]} == {
        (t, d) for t in ("compile", "known-answer", "transfer") for d in range(4)}
    assert document["interrupted"] is False
    assert document["exit_code"] == 0
    kept = json.loads((tmp_path / "run" / "diag-last.json").read_text())
    assert kept["time"] == document["time"]
    assert kept["status"] == "pass"
    assert oct((tmp_path / "run" / "diag-last.json").stat().st_mode & 0o777) == "0o600"
    xml = (tmp_path / "diag.xml").read_text()
    assert 'testsuite name="tpu-diag"' in xml
    assert 'tests="12"' in xml
    assert 'errors="0"' in xml


def test_an_injected_gemm_fault_fails_the_run_naming_the_device(tmp_path):
    env = _env(tmp_path)
    # 3 devices: the fewest where the majority of its peers names the one that differs (each compiles every test)
    result = run_tool("tpu-diag", "-r", "2", "--platform", "cpu", "--host-devices", "3", "--inject", "gemm:2",
                      "--memory-fraction", "0.0001", "--format", "plain", env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    failing = [line for line in result.stdout.splitlines() if " FAIL " in line and not line.startswith("verdict")]
    assert failing, result.stdout
    assert all(line.startswith("gemm ") and "device 2" in line for line in failing), result.stdout
    assert "verdict: FAIL" in result.stdout
    assert "links exercised: 6" in result.stdout
    assert "dtypes: f32, bf16, f16, int8" in result.stdout
    assert "memory tested:" in result.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["-r", "5"], "the level must be 1, 2, 3 or 4"),
    (["-r", "0"], "the level must be 1, 2, 3 or 4"),
    (["-r", "\uff12"], "the level must be 1, 2, 3 or 4"),
    (["--duration", "10s"], "--duration sets how long -r 3 and -r 4 run"),
    (["-r", "3", "--duration", "soon"], "--duration"),
    (["-r", "3", "--duration", "0"], "--duration"),
    (["--memory-fraction", "0"], "above 0 and at most 1"),
    (["--memory-fraction", "1.5"], "above 0 and at most 1"),
    (["--inject", "gemm"], "use KIND:DEVICE"),
    (["-r", "2", "--inject", "gemm:x"], "DEVICE must be a device id"),
    (["--inject", "kat:\uff11"], "DEVICE must be a device id"),
    (["-r", "2", "--inject", "gemm:0", "--inject", "gemm:1"], "one device per kind"),
    (["--coordinator", "[::1", "--num-processes", "2", "--process-id", "0"], "use HOST:PORT"),
    (["--coordinator", "ho st:80", "--num-processes", "2", "--process-id", "0"], "use HOST:PORT"),
    (["--coordinator", "::1:80", "--num-processes", "2", "--process-id", "0"], "use HOST:PORT"),
    (["--only", "gemm"], "no such test at -r 1"),
    (["-r", "2", "--skip", "gemmm"], "no such test"),
    (["--iterations", "0"], "--iterations"),
    (["--iterations", "\u0662"], "--iterations"),
    (["--reference", "/nonexistent/ref.json"], "does not exist"),
    (["-r", "2", "--inject", "gemm:0", "--save-reference", "ref.json"], "corrupted result"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, fragment):
    result = run_tool("tpu-diag", "--platform", "cpu", *args, env=_env(tmp_path))
    assert_one_line_error(result, 2, fragment)


def test_inject_naming_a_device_that_does_not_exist_is_a_usage_error(tmp_path):
    result = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "2", "--inject", "kat:7",
                      env=_env(tmp_path))
    message = assert_one_line_error(result, 2, "there is no device 7")
    assert message.startswith("tpu-diag: error:")


@pytest.mark.auto_platform  # a held TPU is detected when the platform is left to JAX
def test_a_busy_accelerator_is_refused_unless_forced(tmp_path):
    sysroot.v4_host(tmp_path / "root", holders={2001: [0]})
    env = _env(tmp_path, TPU_TOOLS_SYSROOT=str(tmp_path / "root"))
    result = run_tool("tpu-diag", env=env)
    assert_one_line_error(result, 1, "busy", "2001", "--force")


def test_a_hung_runtime_gets_a_verdict(tmp_path, hanging_plugin):
    env = _env(tmp_path, PYTHONPATH=str(hanging_plugin))
    result = run_tool("tpu-diag", "--timeout", "3", "--json", env=env, timeout=120)
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["status"] == "fail"
    assert "did not answer within 3 s" in document["error"]
    assert "tpu-diag: error:" in result.stderr
    assert "Traceback" not in result.stderr


def worker_of(pid: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in status and b"tpu_tools.diag.worker" in cmdline:
            return int(entry.name)
    return None


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_keeps_the_results_so_far_marked_interrupted(tmp_path, signum, code):
    env = _env(tmp_path)
    process = subprocess.Popen([*tool_command("tpu-diag"), "-r", "3", "--duration", "10m", "--platform", "cpu",
                                "--host-devices", "2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while worker_of(process.pid) is None and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, stderr
    document = json.loads(stdout)
    assert document["interrupted"] is True
    assert isinstance(document["checks"], list)
    assert document["exit_code"] == code
    assert document["status"] == "interrupted"
    # kept as partial when a check ended before the signal; else the record is left as it was (none here)
    kept = tmp_path / "run" / "diag-last.json"
    assert kept.exists() == bool(document["checks"])
    if document["checks"]:
        assert json.loads(kept.read_text())["status"] == "interrupted"
    assert ("terminated" if signum == signal.SIGTERM else "interrupted") in stderr
    assert worker_of(process.pid) is None


def test_tpu_tools_diag_is_the_same_command():
    from tpu_tools.cli.diag import diag_command
    from tpu_tools.cli.main import COMMANDS

    module, _, name = COMMANDS["diag"].partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is diag_command


# Two launched processes, each starting a runtime and compiling every test of a diag run: 9-11 s alone on a
# 2-core machine, 16 s on a 16-core one running 16 test workers (its load average lagging behind).
@pytest.mark.budget(30)
def test_launched_processes_compare_every_device_of_every_process(tmp_path):
    env = _env(tmp_path)
    result = run_tool("tpu-diag", "--launch", "2", "--host-devices", "2", "-r", "2", "--memory-fraction", "0.0001",
                      "--inject", "gemm:2049", "--json", env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["process_count"] == 2
    assert document["device_ids"] == [0, 1, 2048, 2049]
    failed = {(c["test"], c["device"]) for c in document["checks"] if c["status"] == "fail"}
    assert failed == {(f"gemm {t}{exact}", 2049) for t in ("f32", "bf16", "f16", "int8") for exact in ("", " exact")}
    assert {c["process_id"] for c in document["checks"] if c["test"] == "compile"} == {0, 1}
    assert "2048->2049" in document["coverage"]["links"]
    bad = run_tool("tpu-diag", "--launch", "2", "--host-devices", "2", "-r", "2", "--inject", "gemm:3", env=env)
    assert_one_line_error(bad, 2, "there is no device 3", "0-1,2048-2049")


def test_a_terminal_gets_a_progress_bar_on_stderr_and_a_pipe_does_not(tmp_path):
    env = _env(tmp_path, COLUMNS="100")
    with StderrOnTerminal([*tool_command("tpu-diag"), "--platform", "cpu", "--host-devices", "2", "--format",
                           "plain"], env) as run:
        stdout, text = run.finish(timeout=180)
    assert run.process.returncode == 0
    assert "known-answer on device" in text or "transfer on device" in text, text[-2000:]
    assert "\x1b" not in stdout
    assert "verdict: PASS" in stdout


@pytest.mark.auto_platform
def test_a_gpu_with_a_job_is_refused_by_what_nvml_lists(tmp_path, fake_nvml_dir):
    from fakenvml import nvml_env

    root = tmp_path / "root"
    sysroot.nvidia_host(root, holders={4573: [1]})  # a reader of NVML holds a device node: not a job
    env = nvml_env(fake_nvml_dir, root, FAKE_NVML_PROCS="0:425:1073741824",
                   TPU_TOOLS_RUNTIME_DIR=str(tmp_path / "run"))
    result = run_tool("tpu-diag", env=env)
    message = assert_one_line_error(result, 1, "busy", "425", "--force")
    assert "4573" not in message


def test_a_lone_device_with_an_injected_gemm_fault_fails_naming_it(tmp_path):
    result = run_tool("tpu-diag", "-r", "2", "--platform", "cpu", "--host-devices", "1", "--inject", "gemm:0",
                      "--memory-fraction", "0.0001", "--json", env=_env(tmp_path), timeout=300)
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    failed = {(c["test"], c["device"]) for c in document["checks"] if c["status"] == "fail"}
    assert failed == {(f"gemm {t} exact", 0) for t in ("f32", "bf16", "f16", "int8")}
    # without a peer the digest is not judged: a skip, never a pass
    assert {c["status"] for c in document["checks"] if c["test"] in ("gemm f32", "gemm int8")} == {"skip"}


def test_a_saved_reference_catches_a_fault_on_one_device_and_another_key_is_not_comparable(tmp_path):
    env = _env(tmp_path)
    reference = tmp_path / "reference.json"
    saved = run_tool("tpu-diag", "-r", "2", "--platform", "cpu", "--host-devices", "1", "--only", "gemm f32,gemm int8",
                     "--skip", "gemm f32 exact,gemm int8 exact", "--save-reference", str(reference), env=env)
    assert saved.returncode == 0, saved.stderr
    entries = json.loads(reference.read_text())["entries"]
    assert [e["key"]["test"] for e in entries] == ["gemm f32", "gemm int8"]
    assert {"platform", "device_kind", "jax", "jaxlib", "runtime", "xla_flags", "shape", "dtype", "seed"} <= set(
        entries[0]["key"])
    caught = run_tool("tpu-diag", "-r", "2", "--platform", "cpu", "--host-devices", "1", "--only", "gemm f32",
                      "--skip", "gemm f32 exact", "--inject", "gemm:0", "--reference", str(reference), "--json",
                      env=env)
    assert caught.returncode == 1, caught.stderr
    checks = {c["test"]: c for c in json.loads(caught.stdout)["checks"]}
    assert checks["gemm f32 reference"]["status"] == "fail"
    assert checks["gemm f32 reference"]["device"] == 0
    assert "differs from the reference" in checks["gemm f32 reference"]["why"]
    other = run_tool("tpu-diag", "-r", "2", "--platform", "cpu", "--host-devices", "1", "--only", "gemm int8",
                     "--skip", "gemm int8 exact", "--reference", str(reference), "--json",
                     env={**env, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    assert other.returncode == 3, other.stderr
    check = {c["test"]: c for c in json.loads(other.stdout)["checks"]}["gemm int8 reference"]
    assert check["status"] == "warn"
    assert check["why"].startswith("not comparable: xla_flags")


def test_every_injection_given_is_applied(tmp_path):
    result = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "2", "--inject", "kat:0", "--inject",
                      "transfer:1", "--json", env=_env(tmp_path), timeout=300)
    assert result.returncode == 1, result.stderr
    failed = {(c["test"], c["device"]) for c in json.loads(result.stdout)["checks"] if c["status"] == "fail"}
    assert failed == {("known-answer", 0), ("transfer", 1)}


def test_iterations_repeat_the_selected_tests(tmp_path):
    result = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "1", "--only", "compile,known-answer",
                      "--iterations", "3", "--format", "plain", env=_env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line.split()[0:2] for line in result.stdout.splitlines() if " PASS " in line and "verdict" not in line]
    assert rows == [["compile", "#1"], ["known-answer", "#1"], ["compile", "#2"], ["known-answer", "#2"],
                    ["compile", "#3"], ["known-answer", "#3"]]


def test_launched_processes_repeat_their_exchanges_without_mixing_the_repeats(tmp_path):
    result = run_tool("tpu-diag", "--launch", "2", "--host-devices", "1", "-r", "2", "--only",
                      "gemm f32,collective ring +1", "--skip", "gemm f32 exact", "--iterations", "2", "--json",
                      env=_env(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr
    checks = json.loads(result.stdout)["checks"]
    assert [(c["iteration"], c["test"], c["device"]) for c in checks] == [
        (i, test, device) for i in (0, 1) for test, device in (("gemm f32", 0), ("gemm f32", 2048),
                                                               ("collective ring +1", None))]
