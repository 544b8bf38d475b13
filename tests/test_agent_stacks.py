"""Where a job's threads are: the agent's `stacks` answer, and faulthandler's for a job stuck holding its lock."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentjobs import make_rundir, remove_rundir, wait_for
from conftest import clean_env

from tpu_tools.agent.stacks import chosen_signal
from tpu_tools.metrics.agent_client import AgentQueryError, query_agents, query_stacks
from tpu_tools.metrics.records.agent import Stacks
from tpu_tools.metrics.stacks import StacksError, parse_fault_text, read_fault_stacks, where

JOB = textwrap.dedent("""
    import signal, sys, time
    import tpu_tools.agent as agent

    if sys.argv[2] == "own-handler":  # the job's own SIGUSR2 handler, there before the agent
        signal.signal(signal.SIGUSR2, lambda *_: open(sys.argv[1] + ".own", "w").write("ran"))
    agent.start(tag="stacks")

    def load_batch():
        open(sys.argv[1], "w").write("ready")
        time.sleep(120)  # waiting on I/O: the interpreter's lock is free, the agent answers

    def crunch():
        open(sys.argv[1], "w").write("ready")
        return sum(range(10 ** 13))  # one C call holding the interpreter's lock: the agent cannot answer

    crunch() if sys.argv[2] == "crunch" else load_batch()
""")


@pytest.fixture
def rundir() -> Iterator[Path]:
    path = make_rundir()
    yield path
    remove_rundir(path)


def start(tmp_path: Path, rundir: Path, mode: str, **env: str) -> tuple[subprocess.Popen, Path]:
    script, ready = tmp_path / "job.py", tmp_path / "ready"
    script.write_text(JOB)
    process = subprocess.Popen([sys.executable, str(script), str(ready), mode],
                               env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), **env), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    wait_for(lambda: ready.exists() and ready.read_text() == "ready" or process.poll() is not None, timeout=60)
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    return process, ready


def finish(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=30)


def test_the_agent_answers_with_every_threads_stack(tmp_path, rundir):
    process, _ = start(tmp_path, rundir, "load")
    try:
        answer = query_stacks(process.pid, 10.0, directory=rundir)
        assert answer.source == "agent"
        assert answer.where == "load_batch (job.py:11)"
        main = answer.stacks.threads[0]
        assert main.main
        assert main.name == "MainThread"
        assert [f.function for f in main.frames][-2:] == ["<module>", "load_batch"]
        assert not any(t.name.startswith("tpu-tools-") for t in answer.stacks.threads)  # not the agent's
    finally:
        finish(process)


def test_a_job_holding_its_lock_gives_its_stacks_through_faulthandler(tmp_path, rundir):
    process, _ = start(tmp_path, rundir, "crunch")
    try:
        snapshot = wait_for(lambda: next(iter(r.snapshot for r in query_agents(5.0, directory=rundir).results), None))
        assert snapshot.stacks_signal == signal.SIGUSR2
        answer = query_stacks(process.pid, 1.0, directory=rundir)
        assert answer.source == "faulthandler"
        assert answer.where == "crunch (job.py:15)"
        assert process.poll() is None  # the signal did not end it
    finally:
        finish(process)
    assert query_agents(5.0, directory=rundir).results == []
    assert not (rundir / f"agent-{process.pid}.stacks").exists()  # removed with its socket


def test_the_jobs_own_handler_still_runs(tmp_path, rundir):
    process, ready = start(tmp_path, rundir, "own-handler")
    try:
        stacks = read_fault_stacks(process.pid, signal.SIGUSR2, rundir / f"agent-{process.pid}.stacks", 10.0)
        assert where(stacks) == "load_batch (job.py:11)"
        wait_for(lambda: Path(f"{ready}.own").exists(), timeout=10)
    finally:
        finish(process)


def test_turned_off_no_signal_is_registered_nor_sent(tmp_path, rundir):
    process, _ = start(tmp_path, rundir, "crunch", TPU_TOOLS_STACKS_SIGNAL="0")
    try:
        snapshot = wait_for(lambda: next(iter(r.snapshot for r in query_agents(5.0, directory=rundir).results), None))
        assert snapshot.stacks_signal is None
        assert not (rundir / f"agent-{process.pid}.stacks").exists()
        with pytest.raises(AgentQueryError, match="publishes no signal for its stacks"):
            query_stacks(process.pid, 0.5, directory=rundir)
        assert process.poll() is None
    finally:
        finish(process)


@pytest.mark.parametrize(("value", "expected"), [
    ("", signal.SIGUSR2), ("SIGUSR1", signal.SIGUSR1), ("usr1", signal.SIGUSR1), ("12", 12), ("0", None),
    ("SIGKILL", None), ("9", None), ("nonsense", None), ("999", None),
])
def test_the_signal_is_chosen_by_name_or_number(monkeypatch, value, expected):
    monkeypatch.setenv("TPU_TOOLS_STACKS_SIGNAL", value)
    assert chosen_signal() == expected


def test_faulthandlers_text_reads_back_as_the_threads_it_names(tmp_path):
    def innermost() -> None:
        with open(tmp_path / "dump", "w") as out:
            faulthandler.dump_traceback(out, all_threads=True)

    innermost()
    stacks = parse_fault_text((tmp_path / "dump").read_text())
    assert stacks.threads[0].frames[-1].function == "innermost"
    assert where(Stacks(threads=[stacks.threads[0]])).startswith("innermost (test_agent_stacks.py:")


@pytest.mark.parametrize("kind", ["mode", "link"])
def test_a_stacks_file_not_privately_ours_is_not_read(tmp_path, kind):
    path = tmp_path / "agent-1.stacks"
    if kind == "link":
        (tmp_path / "other").write_text("")
        path.symlink_to(tmp_path / "other")
    else:
        path.write_text("")
        os.chmod(path, 0o644)
    with pytest.raises(StacksError, match="not using it|cannot be opened"):
        read_fault_stacks(os.getpid(), signal.SIGUSR2, path, 1.0)
