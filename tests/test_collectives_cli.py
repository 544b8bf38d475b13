"""`tpu-collectives-test` end to end in one process: the real console script on the real CPU runtime."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from conftest import REPO, assert_one_line_error, clean_env, run_tool, tool_command
from isolation import kill_tmux_server, tmux_command, unique_name
from programs import require_program

TOP_KEYS = {"schema", "command", "time", "platform", "device_kind", "jax_version", "jaxlib_version",
            "process_count", "processes", "device_ids", "mesh", "ranks", "groups", "settings", "tests", "wrong",
            "avg_busbw_gbps", "slow_processes", "notes", "status", "error", "exit_code"}
SETTINGS_KEYS = {"dtype", "min_bytes", "max_bytes", "step_factor", "step_bytes", "iters", "warmup", "sample_ms",
                 "check",
                 "stats", "root", "shift", "timeout_s", "min_busbw_gbps", "slow_threshold_percent"}
TEST_KEYS = {"op", "redop", "root", "shift", "implementation", "ranks", "groups", "busbw_factor", "busbw_formula",
             "results", "avg_busbw_gbps", "wrong", "small_message_latency"}
RESULT_KEYS = {"requested_bytes", "size_bytes", "count", "dtype", "redop", "root", "time_us", "stats_us",
               "algbw_gbps", "busbw_gbps", "wrong", "checked_elements", "compile_ms", "processes", "error",
               "in_place", "calls_per_sample", "sample_ms", "blocking_call_us", "calibration_note"}
IN_PLACE_KEYS = {"time_us", "stats_us", "algbw_gbps", "busbw_gbps", "wrong", "checked_elements"}
PROCESS_TIME_KEYS = {"process_id", "host", "time_us", "stats_us", "wrong", "slow", "in_place_time_us",
                     "in_place_wrong"}
PROCESS_KEYS = {"process_id", "host", "pid", "device_ids"}
# size count type redop root | out-of-place: time [stats] algbw busbw #wrong | in-place: time algbw busbw #wrong
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\S+)\s+(\S+)\s+([\d.]+)\s+(?:[\d.]+\s+)*?([\d.]+)\s+([\d.]+)\s+(\S+)"
                 r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$")
SMALL = ["-b", "64", "-e", "256", "-f", "4", "-n", "2", "-w", "1"]


def collectives(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_tool("tpu-collectives-test", *args, timeout=timeout)


def rows(stdout: str) -> list[tuple[str, ...]]:
    data = [line for line in stdout.splitlines() if line and not line.startswith("#")]
    parsed = [ROW.match(line) for line in data]
    assert all(parsed), data
    return [m.groups() for m in parsed]  # type: ignore[union-attr]


@pytest.mark.budget(30)  # the default sweep, as a user runs it
def test_the_default_run_is_a_correct_table_on_8_cpu_devices():
    result = collectives("all-reduce")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# tpu-collectives-test all-reduce  jax ")
    assert "# devices 8 (cpu, ids 0-7)  processes 1 on 1 host" in result.stdout
    assert "# all-reduce (sum) [psum]: busbw = algbw * 2(n-1)/n = algbw * 1.750 (n = 8 ranks)" in result.stdout
    table = rows(result.stdout)
    assert [int(r[0]) for r in table] == [1024 << i for i in range(15)]  # 1 KiB to 16 MiB, factor 2
    assert all(r[2:5] == ("f32", "sum", "-") and r[8] == r[12] == "0" for r in table)  # #wrong, both columns
    assert all(int(r[0]) == int(r[1]) * 4 for r in table)
    assert all(float(r[7]) > 0 and float(r[11]) > 0 for r in table[5:])  # busbw, both columns
    assert re.search(r"^#\s+out-of-place\s+in-place$", result.stdout, re.M)
    assert re.fullmatch(r"# Latency all-reduce \(sum\) at 1\.0 KiB : [\d.]+ us out-of-place, [\d.]+ us in-place; "
                        r"[\d.]+ us for one call waited for", lines[-3])
    assert lines[-2] == "# Wrong values : 0 OK"
    assert re.fullmatch(r"# Avg bus bandwidth : \d+\.\d{3} GB/s", lines[-1])
    assert result.stderr == ""
    assert "\x1b[" not in result.stdout


def test_every_op_and_reduction_is_right_in_bf16():
    # One size: each size compiles every op twice (out-of-place, in-place); correctness does not need a sweep.
    result = collectives("all", "-o", "all", "-d", "bf16", "--root", "5", "--shift", "3", "-b", "256", "-e", "256",
                         "-n", "1", "-w", "0")
    assert result.returncode == 0, result.stderr
    sections = re.findall(r"^# (\S+(?: \(\w+\))?) \[(.+?)\]: busbw = algbw \* (\S+) =", result.stdout, re.M)
    assert [s[0] for s in sections] == ["all-reduce (sum)", "all-reduce (max)", "all-reduce (min)",
                                        "all-reduce (prod)", "all-reduce (avg)", "all-gather",
                                        "reduce-scatter (sum)", "all-to-all", "permute", "broadcast"]
    assert dict((s[0], s[2]) for s in sections)["all-gather"] == "(n-1)/n"
    assert ("broadcast", "masked all-reduce (root 5)", "1") in sections
    assert ("permute", "ppermute (shift 3)", "1") in sections
    table = rows(result.stdout)
    assert len(table) == 10
    assert all(r[8] == r[12] == "0" and r[2] == "bf16" for r in table)
    assert table[-1][4] == "5"  # broadcast's root column
    assert result.stdout.count(": wrong values 0 OK, avg busbw") == 10


def test_json_document_schema_is_pinned(tmp_path):
    path = tmp_path / "out.json"
    result = collectives("all-reduce", "-d", "u8", "--stats", "p50,p99", "--json", str(path), *SMALL)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^#\s+size\s+count\s+type\s+redop\s+root\s+time\s+p50\s+p99\s+algbw\s+busbw\s+#wrong"
                     r"\s+time\s+algbw\s+busbw\s+#wrong$", result.stdout, re.M)
    document = json.loads(path.read_text())
    assert set(document) == TOP_KEYS
    assert document["schema"] == "tpu-tools/collectives/v1"
    assert document["status"] == "ok"
    assert document["exit_code"] == 0
    assert document["error"] is None
    assert set(document["settings"]) == SETTINGS_KEYS
    assert document["settings"]["dtype"] == "u8"
    assert document["mesh"] == {"shape": [8], "axis_names": ["x"], "axis": "x"}
    assert (document["ranks"], document["groups"], document["process_count"]) == (8, 1, 1)
    assert [set(p) for p in document["processes"]] == [PROCESS_KEYS]
    (test,) = document["tests"]
    assert set(test) == TEST_KEYS
    assert test["busbw_factor"] == pytest.approx(1.75)
    assert test["small_message_latency"]["size_bytes"] == 64
    assert test["small_message_latency"]["in_place_us"] > 0
    assert [r["size_bytes"] for r in test["results"]] == [64, 256]
    for result_row in test["results"]:
        assert set(result_row) == RESULT_KEYS
        assert set(result_row["stats_us"]) == {"p50", "p99"}
        assert result_row["wrong"] == 0
        assert result_row["checked_elements"] == 8 * result_row["count"]
        assert result_row["busbw_gbps"] == pytest.approx(result_row["algbw_gbps"] * 1.75)
        assert result_row["algbw_gbps"] == pytest.approx(result_row["size_bytes"] / result_row["time_us"] / 1e3)
        assert [set(p) for p in result_row["processes"]] == [PROCESS_TIME_KEYS]
        assert result_row["compile_ms"] > 0
        in_place = result_row["in_place"]
        assert set(in_place) == IN_PLACE_KEYS
        assert set(in_place["stats_us"]) == {"p50", "p99"}
        assert in_place["wrong"] == 0
        assert in_place["checked_elements"] == 8 * result_row["count"]
        assert in_place["busbw_gbps"] == pytest.approx(in_place["algbw_gbps"] * 1.75)
        # Samples of k back-to-back calls, k calibrated for 5 ms (the default) or more.
        assert result_row["calls_per_sample"] >= 1
        assert result_row["calibration_note"] is None
        assert result_row["sample_ms"] > 0  # (its length against 5 ms depends on the machine's load: not tested)
        assert result_row["time_us"] == pytest.approx(result_row["sample_ms"] * 1e3 / result_row["calls_per_sample"])
        assert result_row["blocking_call_us"] > 0


@pytest.fixture(scope="module")
def permute_to_stdout_one_call_per_sample() -> subprocess.CompletedProcess:
    """One run for two tests whose options do not interact: JSON on stdout, and --sample-ms 0."""
    return collectives("permute", "--sample-ms", "0", "--json", "-", *SMALL)


@pytest.fixture(scope="module")
def unchecked_all_gather_of_1000_bytes() -> subprocess.CompletedProcess:
    """One run for two tests whose options do not interact: --check off, and a size that is rounded."""
    return collectives("all-gather", "--check", "off", "-b", "1000", "-e", "1000", "-n", "1", "-w", "0")


@pytest.fixture(scope="module")
def device_subset_run() -> subprocess.CompletedProcess:
    """A subset of the devices, with a --min-busbw gate that every size passes."""
    return collectives("reduce-scatter", "--devices", "0,2,4-5", "--min-busbw", "0.000001", *SMALL)


def test_json_to_stdout_replaces_the_table(permute_to_stdout_one_call_per_sample):
    result = permute_to_stdout_one_call_per_sample
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["tests"][0]["op"] == "permute"
    assert document["wrong"] == 0


def test_check_off_reports_not_applicable(unchecked_all_gather_of_1000_bytes):
    result = unchecked_all_gather_of_1000_bytes
    assert result.returncode == 0, result.stderr
    assert all(r[-1] == "N/A" for r in rows(result.stdout))
    assert "# Wrong values : N/A (--check off)" in result.stdout


def test_a_2d_mesh_runs_along_the_chosen_axis_and_a_device_subset(device_subset_run):
    result = collectives("all-reduce", "--mesh", "2x4", "--axis", "x", "--json", "-", *SMALL)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["mesh"] == {"shape": [2, 4], "axis_names": ["x", "y"], "axis": "x"}
    assert (document["ranks"], document["groups"], document["wrong"]) == (2, 4, 0)
    assert document["tests"][0]["busbw_factor"] == pytest.approx(1.0)  # 2(n-1)/n with n = 2
    result = device_subset_run
    assert result.returncode == 0, result.stderr
    assert "# devices 4 (cpu, ids 0,2,4-5)" in result.stdout
    assert "n = 4 ranks" in result.stdout
    assert all(r[-1] == "0" for r in rows(result.stdout))


def test_sizes_not_divisible_by_the_ranks_are_rounded_with_a_note(unchecked_all_gather_of_1000_bytes):
    result = unchecked_all_gather_of_1000_bytes
    assert result.returncode == 0, result.stderr
    assert [r[:2] for r in rows(result.stdout)] == [("992", "31")]
    assert ("note: all-gather: sizes must be a multiple of 8 ranks x 4 B (f32) = 32 B; rounded down as "
            "nccl-tests does (at least one element per rank): 1000 -> 992") in result.stderr


def test_min_busbw_is_a_gate_with_exit_3(tmp_path, device_subset_run):
    path = tmp_path / "gate.json"
    result = collectives("all-reduce", "--min-busbw", "1000000", "--json", str(path), *SMALL)
    message = assert_one_line_error(result, 3)
    assert "all-reduce (sum): average busbw" in message
    assert "below --min-busbw 1e+06 GB/s" in message
    assert "# Wrong values : 0 OK" in result.stdout
    document = json.loads(path.read_text())
    assert document["status"] == "below_min_busbw"
    assert document["exit_code"] == 3
    assert device_subset_run.returncode == 0  # a gate below every size's busbw passes


def test_a_size_that_fails_leaves_valid_json_with_the_rows_before_it(tmp_path):
    path = tmp_path / "fail.json"
    result = collectives("all-reduce", "-b", "64", "-e", "1T", "-f", str(1 << 34), "-n", "1", "-w", "0",
                         "--json", str(path))
    message = assert_one_line_error(result, 1)
    assert "all-reduce (sum) at 1.0 TiB failed: needs about" in message
    assert "host memory" in message
    assert "ERROR: needs about" in result.stdout
    document = json.loads(path.read_text())
    assert set(document) == TOP_KEYS
    assert document["status"] == "failed"
    assert document["exit_code"] == 1
    results = document["tests"][0]["results"]
    assert [r["size_bytes"] for r in results] == [64, 1 << 40]
    assert results[0]["error"] is None
    assert results[0]["wrong"] == 0
    assert results[1]["error"].startswith("needs about")
    assert results[1]["time_us"] is None


# Two checks of the SPMD programs themselves, in one process (one JAX start): each prints its lines under a tag.
SPMD_SCRIPT = """
import warnings
import numpy as np
from tpu_tools.collectives.data import Crafted, count_wrong
from tpu_tools.collectives.dtypes import DTYPES
from tpu_tools.collectives.mesh import build_mesh
from tpu_tools.collectives.ops import OPS, Case
from tpu_tools.collectives.spmd import build_collective, in_place_elements
from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax
jax = import_jax(RuntimePolicy(platform="cpu", host_devices=4))
plan = build_mesh(jax, None, None, None)

# The real permute (shift 1) checked against its own expectation and against a shift by 2's.
case = Case(OPS["permute"], None)
real, other = (Crafted(case, DTYPES["f32"], 4, 16, shift=s) for s in (1, 2))
collective = build_collective(jax, case, plan, shift=1)
x = jax.make_array_from_callback((4, 16), collective.sharding,
                                 lambda i: real.input(*plan.position(i)).reshape(1, 16))
out = collective.function(x)
right = sum(count_wrong(np.asarray(s.data), real.expected(*plan.position(s.index)), DTYPES["f32"])
            for s in out.addressable_shards)
wrong = sum(count_wrong(np.asarray(s.data), other.expected(*plan.position(s.index)), DTYPES["f32"])
            for s in out.addressable_shards)
print("bit-for-bit", right, wrong)

# Every op's in-place and out-of-place forms.
warnings.simplefilter("error")
for op in OPS.values():
    case = Case(op, op.redops[0] if op.redops else None)
    crafted = Crafted(case, DTYPES["i32"], 4, 8)
    collective = build_collective(jax, case, plan, is_integer=True)
    length = in_place_elements(case, 8, 4)
    make = lambda index: crafted.in_place_input(*plan.position(index)).reshape(1, length)
    buffer = jax.make_array_from_callback((4, length), collective.sharding, make)
    out = collective.in_place(buffer)
    wrong = sum(count_wrong(np.asarray(s.data), crafted.in_place_expected(*plan.position(s.index)), DTYPES["i32"])
                for s in out.addressable_shards)
    x = jax.make_array_from_callback((4, op.input_elements(8, 4)), collective.sharding,
                                     lambda index: crafted.input(*plan.position(index)).reshape(1, -1))
    previous = collective.function(x)
    y = collective.timed(x, previous)
    # The previous output is a parameter of the compiled program: the runtime waits for it.
    chained = "parameter(1)" in collective.timed.lower(x, previous).compile().as_text()
    print("in-place", op.name, buffer.is_deleted(), wrong, x.is_deleted(), y.shape[-1] == op.output_elements(8, 4),
          chained)
"""


@pytest.fixture(scope="module")
def spmd_checks() -> tuple[subprocess.CompletedProcess, dict[str, list[list[str]]]]:
    result = subprocess.run([sys.executable, "-c", SPMD_SCRIPT], capture_output=True, text=True, env=clean_env(),
                            timeout=120, cwd=REPO)
    tagged: dict[str, list[list[str]]] = {}
    for line in result.stdout.splitlines():
        tag, *fields = line.split()
        tagged.setdefault(tag, []).append(fields)
    return result, tagged


def test_wrong_results_are_counted_bit_for_bit_on_every_device(spmd_checks):
    # The real collective (ppermute by 1) checked against the expectation of a shift by 2: every
    # element of every device must count as wrong. Catches a checker that compares too loosely.
    result, tagged = spmd_checks
    assert result.returncode == 0, result.stderr
    assert tagged["bit-for-bit"] == [["0", str(4 * 16)]]


def test_in_place_calls_really_write_over_their_donated_input(spmd_checks):
    # Every op's in-place form is donated and its output aliases the input: the runtime deletes the
    # input and warns of no unusable donation; the out-of-place form leaves its input alone and takes
    # the previous output as a real argument, so calls issued back to back run one after the other.
    result, tagged = spmd_checks
    assert result.returncode == 0, result.stderr
    lines = tagged["in-place"]
    assert [line[0] for line in lines] == ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "permute",
                                           "broadcast"]
    assert all(line[1:] == ["True", "0", "False", "True", "True"] for line in lines), lines


def test_sample_ms_0_waits_for_every_call(permute_to_stdout_one_call_per_sample):
    result = permute_to_stdout_one_call_per_sample
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["sample_ms"] == 0
    assert all(r["calls_per_sample"] == 1 for r in document["tests"][0]["results"])


def test_a_sample_length_the_calibration_cannot_reach_is_said_not_looped_for(tmp_path):
    path = tmp_path / "short.json"
    # A 2 s sample with a calibration budget of 2 s (a quarter of --timeout, the most a sample may have): the
    # calibration only starts samples predicted to fit what is left of its budget, so it falls short and says
    # so, unless a sample overshoots its prediction past 2 s on a loaded machine (then it is simply reached).
    # The decision itself, on a clock, is in test_collectives_timing.py.
    result = collectives("all-reduce", "-b", "64", "-e", "64", "-n", "1", "-w", "0", "--sample-ms", "2000",
                         "--timeout", "8", "--json", str(path))
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(path.read_text())["tests"][0]["results"]
    said = re.search(r"note: all-reduce \(sum\) at 64 B: (\d+) calls per sample last [\d.]+ ms, short of the 2000 ms "
                     r"asked \((the calibration's time budget of 2 s would run out|at most 65536 calls per "
                     r"sample)\)", result.stderr)
    if said:  # timed at the k it reached (a timed sample may come out a little over or under the calibration's)
        assert row["calibration_note"]
        assert row["calls_per_sample"] == int(said.group(1))
    else:  # reached: no note anywhere. (A timed sample can be far shorter than the calibration's last one, which
        # a loaded machine stretched past 2 s: one run timed 276 ms. Its length says nothing here.)
        assert "note:" not in result.stderr
        assert row["calibration_note"] is None
    assert row["wrong"] == 0


@pytest.mark.parametrize(("args", "code", "fragment"), [
    (["reduce"], 2, "unknown op 'reduce'"),
    (["-d", "f33"], 2, "unknown dtype 'f33'"),
    (["-b", "2M", "-e", "1M"], 2, "--min-bytes (2.0 MiB) is larger than --max-bytes (1.0 MiB)"),
    (["-f", "1"], 2, "--step-factor must be greater than 1, got 1"),
    (["-f", "0.5"], 2, "--step-factor must be greater than 1, got 0.5"),
    (["-b", "1X"], 2, "'1X' is not a size"),
    (["--launch", "0"], 2, "--launch must be at least 1, got '0'"),
    (["reduce-scatter", "-o", "max"], 2, "reduce-scatter supports only --redop sum"),
    (["--stats", "p50,q3"], 2, "unknown statistic 'q3'"),
    (["--sample-ms", "-1"], 2, "--sample-ms must be at least 0, got '-1'"),
    (["--sample-ms", "nan"], 2, "--sample-ms must be a finite number, got 'nan'"),
    (["--sample-ms", "20000"], 2, "--sample-ms 20000 does not fit in --timeout 60 s"),
    (["--coordinator", "nowhere"], 2, "--coordinator 'nowhere': use HOST:PORT"),
    (["--num-processes", "2", "--process-id", "2"], 2, "--process-id 2 is out of range"),
    (["--json", "/nonexistent/dir/out.json"], 2, "cannot write --json /nonexistent/dir/out.json"),
    (["--launch", "2", "--platform", "tpu"], 2, "--launch runs local processes on the CPU platform"),
])
def test_bad_options_are_one_line_errors_before_any_work(args, code, fragment):
    result = collectives(*args, timeout=30)
    assert result.returncode == code, (result.returncode, result.stderr)
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "fragment"), [
    (["--devices", "0,9"], "--devices names device 9, which does not exist: this run has 8 cpu devices (0-7)"),
    (["--mesh", "3x3"], "--mesh 3x3 needs 9 devices but 8 are selected"),
    (["--mesh", "2x4", "--axis", "z"], "--axis 'z' is not an axis of the 2x4 mesh (its axes are x, y)"),
    (["broadcast", "--root", "8"], "--root 8 is not a rank: the collective runs over 8 ranks (0 to 7)"),
    (["permute", "--shift", "16"], "--shift 16 moves nothing on 8 ranks"),
])
def test_options_that_do_not_fit_the_devices_are_usage_errors(args, fragment):
    result = collectives(*args, *SMALL, timeout=60)
    message = assert_one_line_error(result, 2)
    assert fragment in message
    assert result.stdout == ""


def test_the_table_fits_a_120_column_terminal(tmp_path):
    require_program("tmux")
    session = "coll"
    server = unique_name("coll")
    command = " ".join([*tool_command("tpu-collectives-test"), *SMALL, "-e", "4K"]) + "; echo DONE:$?"
    env = clean_env()
    subprocess.run([*tmux_command(server), "new-session", "-d", "-s", session, "-x", "120", "-y", "30", "bash",
                    "--norc"], env=env, check=True, timeout=10)
    try:
        subprocess.run([*tmux_command(server), "send-keys", "-t", session, command, "Enter"], check=True, timeout=10)
        deadline = time.monotonic() + 90
        screen = ""
        while time.monotonic() < deadline and not re.search(r"DONE:\d", screen):
            time.sleep(0.5)
            screen = subprocess.run([*tmux_command(server), "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True, timeout=10).stdout
        assert "DONE:0" in screen, screen
        table = [line for line in screen.splitlines() if ROW.match(line)]
        assert [line.split()[0] for line in table] == ["64", "256", "1024", "4096"]
        assert all(len(line) <= 120 for line in table)
        assert "# Wrong values : 0 OK" in screen
    finally:
        kill_tmux_server(server)


def test_a_hung_runtime_is_an_error_within_the_timeout_and_json_stays_valid(hanging_plugin, tmp_path):
    path = tmp_path / "hang.json"
    env = clean_env(PYTHONPATH=str(hanging_plugin))
    # The hang guard is run_tool's timeout: a runtime that hung for good would end the test there.
    result = run_tool("tpu-collectives-test", "--timeout", "2", "--json", str(path), env=env, timeout=60)
    message = assert_one_line_error(result, 1)
    assert "in starting the runtime: the runtime hung (raise --timeout" in message
    document = json.loads(path.read_text())
    assert set(document) == TOP_KEYS
    assert document["status"] == "failed"
    assert "runtime hung" in document["error"]
