"""tpu-diag's record of the node's health cannot lie: an injected run is not the node's health, an interrupted
run is never a pass and clears no failure it did not re-run, output paths are refused before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from agentjobs import wait_for
from conftest import assert_one_line_error, clean_env, run_tool, tool_command
from test_diag_cli import worker_of

from tpu_tools.diag.junit import junit_xml
from tpu_tools.diag.records import Check, DiagReport


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    rundir = tmp_path / "run"
    rundir.mkdir(mode=0o700, exist_ok=True)
    return clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), **extra)


def _exported(rundir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """What tpu-monitor's diag group exports now, by series name (the per-check series left out)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tpu_tools.metrics.groups.base import CollectContext, CollectOptions
    from tpu_tools.metrics.groups.diag import DiagGroup

    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(rundir))
    group = DiagGroup(CollectOptions())
    data = group.collect(CollectContext(CollectOptions(), {"diag": group}))

    class Families:
        def collect(self):
            return group.prometheus(data)

    registry = CollectorRegistry()
    registry.register(Families())
    values = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("tpu_tools_diag_") and "{" not in line:
            name, value = line.split()
            values[name] = float(value)
    return values


def _document(time_text: str, checks: list[Check], interrupted: bool = False) -> dict:
    report = DiagReport(level=2, time=time_text, host="vm", platform="tpu", device_kind="TPU v4", device_ids=[0, 1],
                        checks=checks, interrupted=interrupted)
    return report.to_dict()


def test_an_injected_run_leaves_the_exported_health_as_it_was(tmp_path, monkeypatch):
    env = _env(tmp_path)
    healthy = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "2", env=env, timeout=300)
    assert healthy.returncode == 0, healthy.stderr
    before = _exported(tmp_path / "run", monkeypatch)
    assert before["tpu_tools_diag_failed"] == 0
    injected = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "2", "--inject", "kat:0", "--json",
                        env=env, timeout=300)
    assert injected.returncode == 1
    assert json.loads(injected.stdout)["status"] == "fail"
    after = _exported(tmp_path / "run", monkeypatch)
    assert after["tpu_tools_diag_failed"] == 0
    assert after["tpu_tools_diag_last_run_timestamp_seconds"] == before["tpu_tools_diag_last_run_timestamp_seconds"]
    assert "injected fault is not this host's health" in injected.stderr


def test_a_run_interrupted_before_its_first_check_leaves_the_record_as_it_was(tmp_path, hanging_plugin):
    from tpu_tools.metrics.diagstate import write_last

    env = _env(tmp_path, PYTHONPATH=str(hanging_plugin))
    failed = _document(time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                       [Check("gemm f32", "fail", "digest differs", device=1)])
    path = write_last(failed, tmp_path / "run")
    kept = path.read_bytes()
    # the runtime hangs as it starts: no check can end before the signal
    process = subprocess.Popen([*tool_command("tpu-diag"), "--timeout", "600", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: worker_of(process.pid) or process.poll() is not None, timeout=120)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr
    document = json.loads(stdout)
    assert document["status"] == "interrupted"
    assert document["checks"] == []
    assert "interrupted before any check ended" in stderr
    assert path.read_bytes() == kept


def test_a_partial_run_keeps_the_failures_it_did_not_rerun_and_does_not_make_the_record_younger():
    from tpu_tools.metrics.diagstate import recorded_document

    complete = _document("2026-11-20T10:00:00+00:00", [Check("compile", "pass", device=1),
                                                       Check("gemm f32", "fail", "digest differs", device=1)])
    complete["last_complete_time"] = complete["time"]
    partial = _document("2026-11-27T10:00:00+00:00", [Check("compile", "pass", device=1)], interrupted=True)
    kept, note = recorded_document(partial, complete)
    assert kept is not None
    assert note
    assert "1 failure(s)" in note
    assert kept["status"] == "interrupted"
    assert kept["last_complete_time"] == "2026-11-20T10:00:00+00:00"
    carried = [c for c in kept["checks"] if c["status"] == "fail"]
    assert [(c["test"], c["device"], c["found_at"]) for c in carried] == [
        ("gemm f32", 1, "2026-11-20T10:00:00+00:00")]
    rerun = _document("2026-11-27T10:00:00+00:00", [Check("gemm f32", "pass", device=1)], interrupted=True)
    kept, _ = recorded_document(rerun, complete)
    assert kept is not None
    assert [c["status"] for c in kept["checks"]] == ["pass"]  # it re-ran it: its word stands
    nothing, why = recorded_document(_document("2026-11-27T10:00:00+00:00", [], interrupted=True), complete)
    assert nothing is None
    assert why
    assert "before any check" in why


def test_a_kept_partial_record_still_exports_the_failure_and_the_age_of_the_complete_run(tmp_path, monkeypatch):
    from tpu_tools.metrics.diagstate import record_run, write_last

    rundir = tmp_path / "run"
    day_ago = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 86400 - 600))
    complete = _document(day_ago, [Check("gemm f32", "fail", "digest differs", device=1)])
    write_last({**complete, "last_complete_time": day_ago}, rundir)
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    record_run(_document(now, [Check("compile", "pass", device=0)], interrupted=True), rundir)
    exported = _exported(rundir, monkeypatch)
    assert exported["tpu_tools_diag_failed"] == 1
    assert exported["tpu_tools_diag_age_seconds"] > 86400  # TpuToolsDiagStale still sees a day-old check


def test_the_junit_of_an_interrupted_run_carries_an_error():
    report = DiagReport(level=1, time="2026-11-27T10:00:00+00:00", host="vm",
                        checks=[Check("compile", "pass", "ok", device=0)], interrupted=True)
    assert report.status == "interrupted"
    assert report.to_dict()["status"] == "interrupted"
    xml = junit_xml(report)
    assert 'errors="1"' in xml
    assert "was interrupted after 1 check(s)" in xml


@pytest.mark.parametrize("target", ["folder", "fifo", "/dev/full", "missing", ""])
def test_an_output_path_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, target):
    paths = {"folder": str(tmp_path), "fifo": str(tmp_path / "pipe"), "missing": str(tmp_path / "none" / "d.xml")}
    if target == "fifo":
        os.mkfifo(tmp_path / "pipe")
    path = paths.get(target, target)
    env = _env(tmp_path)
    result = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "2", "--junit", path, env=env, timeout=300)
    assert_one_line_error(result, 2, "--junit")
    assert result.stdout == ""  # no report: nothing ran
    assert not (tmp_path / "run" / "diag-last.json").exists()


def test_a_reader_on_the_junit_fifo_gets_the_whole_document(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    reader = subprocess.Popen(["cat", str(tmp_path / "pipe")], stdout=subprocess.PIPE)
    try:
        result = run_tool("tpu-diag", "--platform", "cpu", "--host-devices", "1", "--only", "compile", "--junit",
                          str(tmp_path / "pipe"), env=_env(tmp_path), timeout=300)
        xml, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
    assert result.returncode == 0, result.stderr
    assert xml.decode().rstrip().endswith("</testsuite>")
    assert 'tests="1"' in xml.decode()


def _launch_until_the_long_memory_estimate(tmp_path: Path) -> subprocess.Popen:
    """`tpu-diag --launch 2` at -r 4, once process 0 said its estimate: its compile and long memory checks
    ended, the sustained load (a gather from process 1 at every iteration) begins."""
    process = subprocess.Popen([*tool_command("tpu-diag"), "--launch", "2", "--host-devices", "1", "-r", "4",
                                "--only", "compile,memory long address,sustained", "--memory-fraction", "0.0001",
                                "--duration", "10m", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_env(tmp_path))
    assert process.stderr is not None
    line = ""
    deadline = time.monotonic() + 240
    while "-r 4 long memory" not in line and time.monotonic() < deadline and process.poll() is None:
        line = process.stderr.readline()  # the estimate comes after the compile checks ended
    assert "-r 4 long memory" in line, line
    return process


def _assert_partial_report(process: subprocess.Popen, stdout: str, stderr: str, tmp_path: Path) -> None:
    assert process.returncode == 143, stderr
    document = json.loads(stdout)
    assert document["interrupted"] is True
    assert document["status"] == "interrupted"
    assert ("compile", 0) in {(c["test"], c["device"]) for c in document["checks"]}
    kept = json.loads((tmp_path / "run" / "diag-last.json").read_text())
    assert kept["status"] == "interrupted"
    assert kept["checks"]


def test_launched_processes_report_their_partial_results_on_sigterm(tmp_path):
    process = _launch_until_the_long_memory_estimate(tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    _assert_partial_report(process, stdout, stderr, tmp_path)


def _launched(launcher: int, process_id: int) -> int | None:
    """The pid of the launched process `process_id` of the launcher `launcher` (started by its main thread)."""
    try:
        pids = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return None
    for pid in pids:
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--process-id" in arguments and arguments[arguments.index(b"--process-id") + 1] == str(process_id).encode():
            return int(pid)
    return None


def _status(pid: int, field: str) -> str:
    """A field of /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _sigterm_bit(pid: int, field: str) -> bool:
    """Whether SIGTERM is in a signal set of /proc/PID/status (SigCgt: handled; ShdPnd: pending)."""
    return bool(int(_status(pid, field), 16) >> (signal.SIGTERM - 1) & 1)


class CpuIdle:
    """Whether a process used (almost) no CPU over the last second: it waits, its threads computing nothing."""

    def __init__(self, pid: int):
        self.pid = pid
        self.samples: list[tuple[float, int]] = []

    def __call__(self) -> bool:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        now = time.monotonic()
        self.samples.append((now, int(fields[11]) + int(fields[12])))  # utime + stime, in clock ticks
        earlier = [(at, ticks) for at, ticks in self.samples if now - at >= 1.0]
        # a computing process uses a core's share even on a loaded machine; one that waits, a tick or two
        return bool(earlier) and self.samples[-1][1] - earlier[-1][1] <= os.sysconf("SC_CLK_TCK") // 20


def test_process_0_reports_on_sigterm_while_it_waits_for_a_peer_that_never_answers(tmp_path):
    # A peer held back (as a loaded machine may hold it) leaves process 0 waiting for its digests in the
    # key-value store, in native code; the signal must still reach process 0's report, not the launcher's kill.
    process = _launch_until_the_long_memory_estimate(tmp_path)
    peer = None
    try:
        peer = wait_for(lambda: _launched(process.pid, 1), timeout=60)
        first = wait_for(lambda: _launched(process.pid, 0), timeout=60)
        os.kill(peer, signal.SIGSTOP)
        wait_for(CpuIdle(first), timeout=120)  # process 0 waits for process 1
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if peer is not None:
            try:
                os.kill(peer, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            process.kill()
    _assert_partial_report(process, stdout, stderr, tmp_path)


def test_a_launched_run_stopped_while_process_0_starts_says_so_in_one_line(tmp_path):
    process = subprocess.Popen([*tool_command("tpu-diag"), "--launch", "2", "--host-devices", "1", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    first = None
    try:
        first = wait_for(lambda: _launched(process.pid, 0), timeout=120, interval=0.01)
        # Held where it is, in Python's start-up, before the CLI's handler; stopped before the signal comes (a
        # process with the stop still pending would be ended by the signal at once, as a running one is).
        os.kill(first, signal.SIGSTOP)
        wait_for(lambda: _status(first, "State").startswith("T"), timeout=60, interval=0.01)
        if _sigterm_bit(first, "SigCgt"):
            pytest.skip("process 0 was past its start-up when it was first seen")
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: _sigterm_bit(first, "ShdPnd"), timeout=60)  # the launcher passed the signal on
        os.kill(first, signal.SIGCONT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        if first is not None:
            try:
                os.kill(first, signal.SIGKILL)  # ended already, unless the test failed with it held
            except ProcessLookupError:
                pass
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    message = assert_one_line_error(result, 143, "terminated (SIGTERM) before process 0 reported", "still starting",
                                    "no check ran")
    document = json.loads(stdout)
    assert document["error"] == message.split(": error: ", 1)[1]
    assert document["exit_code"] == 143
    assert not (tmp_path / "run" / "diag-last.json").exists()
