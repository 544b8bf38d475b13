"""Several real processes joined by jax.distributed on 127.0.0.1, gloo between them; faults included."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import time

import psutil
import pytest
from conftest import assert_one_line_error, clean_env, run_tool, tool_command

SMALL = ["-b", "64", "-e", "1K", "-f", "4", "-n", "3", "-w", "1"]


def collectives(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_tool("tpu-collectives-test", *args, timeout=timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_launch_runs_a_multi_controller_job_and_times_every_process(tmp_path):
    path = tmp_path / "run.json"
    result = collectives("all-reduce", "--launch", "2", "--host-devices", "2", "--slow-threshold", "0",
                         "--json", str(path), "--timeout", "30", *SMALL)
    assert result.returncode == 0, result.stderr
    assert "# devices 4 (cpu, ids 0-1,2048-2049)  processes 2 on 1 host" in result.stdout
    assert "busbw = algbw * 2(n-1)/n = algbw * 1.500 (n = 4 ranks)" in result.stdout
    data = [line for line in result.stdout.splitlines() if line and not line.startswith("#")]
    assert [line.split()[0] for line in data] == ["64", "256", "1024"]
    assert all(line.split()[-1] == "0" for line in data)
    assert "[Gloo]" not in result.stdout  # the native library's chatter stays off the table
    document = json.loads(path.read_text())
    assert document["process_count"] == 2
    pids = [p["pid"] for p in document["processes"]]
    assert len(set(pids)) == 2
    assert os.getpid() not in pids
    assert [p["device_ids"] for p in document["processes"]] == [[0, 1], [2048, 2049]]
    for row in document["tests"][0]["results"]:
        assert [p["process_id"] for p in row["processes"]] == [0, 1]
        assert row["wrong"] == 0
        assert row["checked_elements"] == 4 * row["count"]
        assert row["time_us"] == max(p["time_us"] for p in row["processes"])
        # Every process issued the k calls process 0 calibrated, in both columns, and checked both.
        assert row["calls_per_sample"] >= 1
        assert row["in_place"]["wrong"] == 0
        assert row["in_place"]["checked_elements"] == 4 * row["count"]
        assert row["in_place"]["time_us"] == max(p["in_place_time_us"] for p in row["processes"])
    # Threshold 0: whoever is over the median is flagged, by process id, host and pid.
    slow = document["slow_processes"]
    assert slow
    assert {s["pid"] for s in slow} <= set(pids)
    table = re.findall(r"^#\s+(\d)\s+(\S+)\s+(\d+)\s+(\S+)\s+([+-][\d.]+%)", result.stdout, re.M)
    assert [(t[0], int(t[2])) for t in table] == [("0", pids[0]), ("1", pids[1])]
    assert "SLOW" in result.stdout
    assert "# Slow processes : process " in result.stdout


def _read_until(stream, pattern: str, timeout: float) -> str:
    """Lines of a child's stdout until one matches (bounded wait)."""
    seen = ""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(max(0.0, deadline - time.monotonic())):
                line = stream.readline()
                if not line:
                    break
                seen += line
                if re.search(pattern, line):
                    return seen
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s: {seen!r}")


def _launch_and_kill(victim: int, timeout_s: float, hang_guard_s: float) -> tuple[subprocess.CompletedProcess, int]:
    """Launch three processes, SIGKILL process `victim` once all are in the sweep; the launcher's result and the
    victim's pid. A launcher still running `hang_guard_s` after the kill fails the test (TimeoutExpired)."""
    command = [*tool_command("tpu-collectives-test"), "all-reduce", "--launch", "3", "--host-devices", "1",
               "-b", "4", "-e", "4000", "-i", "4", "-n", "20", "-w", "1", "--timeout", str(timeout_s)]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        try:
            out = _read_until(launcher.stdout, r"^\s+\d+\s+\d+\s+f32", timeout=180)  # every process is in the sweep
        except AssertionError as error:
            launcher.kill()
            raise AssertionError(f"{error}; stderr: {launcher.communicate()[1][-2000:]}") from None
        children = sorted(psutil.Process(launcher.pid).children(), key=lambda c: c.create_time())
        assert len(children) == 3
        pid = children[victim].pid
        os.kill(pid, signal.SIGKILL)
        rest, err = launcher.communicate(timeout=hang_guard_s)
        return subprocess.CompletedProcess(command, launcher.returncode, out + rest, err), pid
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.budget(40)  # three processes start, then the survivors wait out the timeout
def test_a_killed_process_makes_the_others_exit_within_the_timeout_naming_it():
    # --timeout also bounds each process's start (importing JAX, joining), seconds on a loaded machine
    result, pid = _launch_and_kill(victim=2, timeout_s=10, hang_guard_s=120)
    message = assert_one_line_error(result, 1)
    assert f"process 2 (pid {pid}) was killed by SIGKILL" in message
    # What the survivors found by themselves (what a multi-host run prints without the launcher): stuck in the
    # collective, they see its heartbeat stop; killed after a size's collective, while they gather its results,
    # they see its results missing.
    survivors = (rf"no progress for \d+ s \(--timeout 10\) in all-reduce \(sum\) at \d+ B: process 2 "
                 rf"\(host \S+, pid {pid}\) stopped responding",
                 rf"process 2 \(host \S+, pid {pid}\) did not report within 10 s")
    assert re.search(rf"({'|'.join(survivors)}) \(died or hung\)", message), message
    assert not [p for p in psutil.pids() if p == pid]


@pytest.mark.budget(40)  # three processes start
def test_when_process_0_dies_the_others_are_ended_at_once():
    # At once, not after the timeout: a timeout of 600 s that was waited out would outlast the hang guard.
    result, pid = _launch_and_kill(victim=0, timeout_s=600, hang_guard_s=120)
    message = assert_one_line_error(result, 1)
    assert message.startswith(f"tpu-collectives-test: error: process 0 (pid {pid}) was killed by SIGKILL; ")
    assert "process 1 (pid " in message
    assert "ended by the JAX runtime" in message


def test_processes_started_by_hand_agree_on_the_verdict():
    port = free_port()
    base = [*tool_command("tpu-collectives-test"), "all-gather", "--coordinator", f"127.0.0.1:{port}",
            "--num-processes", "2", "--host-devices", "1", "--timeout", "30", "--min-busbw", "1000000", *SMALL]
    processes = [subprocess.Popen([*base, "--process-id", str(i)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=clean_env()) for i in (1, 0)]
    try:
        (out1, err1), (out0, err0) = (p.communicate(timeout=120) for p in processes)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert [p.returncode for p in processes] == [3, 3]  # process 0's gate verdict, on every process
    assert "# devices 2 (cpu, ids 0,2048)  processes 2 on 1 host" in out0
    assert "below --min-busbw" in err0
    assert out1 == ""
    assert "Traceback" not in err0 + err1


# --timeout also bounds importing JAX and starting the runtime, which took over 8 s in a whole-suite run on a
# machine loaded 8 times over: a shorter one ends the run there, with another message. Waiting costs no CPU.
@pytest.mark.budget(60)
def test_a_coordinator_that_does_not_answer_is_an_error_within_the_timeout(refused_address):
    port = int(refused_address.rpartition(":")[2])  # bound by the test, never listening
    result = collectives("--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1",
                         "--timeout", "20", timeout=120)  # the hang guard
    message = assert_one_line_error(result, 1)
    assert f"the coordinator 127.0.0.1:{port} did not answer within 20 s" in message


@pytest.mark.budget(60)  # the same: --timeout bounds the runtime's start too
def test_process_0_alone_reports_that_the_others_never_joined():
    port = free_port()  # process 0 binds it itself, as the coordinator
    result = collectives("--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0",
                         "--timeout", "20", timeout=120)  # the hang guard
    message = assert_one_line_error(result, 1)
    assert "not every process joined within" in message
    assert f"expected 2 at 127.0.0.1:{port}" in message


@pytest.mark.parametrize("launch", [False, True])
def test_a_port_already_in_use_is_refused(launch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        extra = ["--launch", "2"] if launch else ["--num-processes", "2", "--process-id", "0"]
        result = collectives("--coordinator", f"127.0.0.1:{port}", *extra, "--timeout", "5", timeout=30)
    message = assert_one_line_error(result, 1)
    assert f"cannot serve the coordinator on 127.0.0.1:{port}: Address already in use" in message
