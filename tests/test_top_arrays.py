"""tpu-top's job screen: `m` reads a job's largest arrays and allocation sites once, in the background."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgspec
from agentjobs import agent_env, running_job, wait_for
from conftest import as_report, tool_command
from programs import require_program
from test_top import Tmux

from tpu_tools.metrics.records.agent import AgentSnapshot, Arrays
from tpu_tools.top.arrays_view import ArraysBoard, ArraysRead, arrays_lines
from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.jobview import job_lines
from tpu_tools.top.keys import handle_key
from tpu_tools.top.model import ViewState, rows_from_report


def _agent_report(pid: int, tag: str) -> dict:
    return {"schema": "tpu-tools/monitor/v1",
            "processes": {"agents": [{"pid": pid, "tag": tag, "command": "python job.py", "devices": []}]}}


def test_m_reads_a_real_jobs_arrays_in_the_background_with_their_source_lines(monkeypatch):
    with running_job(tag="arrays", host_devices=4) as (job, rundir):
        monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(rundir))
        report = _agent_report(job.pid, "arrays")
        state = ViewState(job_key=str(job.pid))
        rows = rows_from_report(as_report(report))
        before = frame_text(job_lines(as_report(report), state, None, 140, None))
        assert "Memory by allocation" not in before  # nothing asked yet: the footer offers `m`
        handle_key(state, "m", rows)  # returns at once: the read runs on its own thread
        read = wait_for(lambda: (r := state.arrays.read(str(job.pid))) is not None and not r.pending and r, 30)
    assert read.error is None, read.error
    frame = frame_text(job_lines(as_report(report), state, None, 160, None))
    assert "Memory by allocation  read at " in frame
    assert "arrays looked at" in frame
    big = next(line for line in frame.splitlines() if "(1024, 1024)" in line)
    # the 1024 x 1024 f32 array on 4 devices, the line of the job's script that put it there
    assert "4.0 MiB" in big or "4 MiB" in big or "4.19 MB" in big, big
    assert "float32" in big
    assert "job.py:" in big
    assert "Allocation sites" in frame
    assert any("job.py:" in line for line in
                                               frame.split("Allocation sites")[1].splitlines())
    framed = render(as_report(report), state, 100, 30)
    assert len(framed) == 30
    assert all(len(line.text) <= 100 for line in framed)
    assert "m arrays" in framed[-1].text


def test_a_job_that_cannot_answer_or_has_no_agent_says_so_on_one_line(monkeypatch):
    with running_job(tag="light", light=True, launcher=False) as (job, rundir):
        monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(rundir))
        state = ViewState(job_key=str(job.pid))
        report = _agent_report(job.pid, "light")
        handle_key(state, "m", rows_from_report(as_report(report)))
        wait_for(lambda: not state.arrays.read(str(job.pid)).pending, 20)  # type: ignore[union-attr]
        section = frame_text(job_lines(as_report(report), state, None, 120, None)).split("Memory by allocation")[1]
        section = section.split("Compiles by function")[0]
    assert "has not started a JAX backend" in section
    assert len(section.strip().splitlines()) == 2
    holder = {"schema": "tpu-tools/monitor/v1", "processes": {"holders": [{"pid": os.getpid(), "command": "x"}]}}
    state = ViewState(job_key=str(os.getpid()))
    handle_key(state, "m", rows_from_report(as_report(holder)))
    assert state.current_message() is not None
    assert "has no tpu-tools agent" in state.current_message()[0]
    assert state.arrays.read(str(os.getpid())) is None  # nothing was asked
    silent = {"schema": "tpu-tools/monitor/v1",
              "processes": {"agents": [{"pid": 4242, "error": "no complete answer within 1 s"}]}}
    state = ViewState(job_key="4242")
    handle_key(state, "m", rows_from_report(as_report(silent)))
    assert state.current_message() == ("the agent of 4242 does not answer: no complete answer within 1 s", True)
    assert state.arrays.read("4242") is None


def test_no_agent_registered_is_an_error_line_not_a_raise(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(tmp_path))
    board = ArraysBoard()
    assert board.ask("1", os.getpid())
    read = wait_for(lambda: (r := board.read("1")) is not None and not r.pending and r, 10)
    assert "no agent is registered" in (read.error or "")


def test_the_keys_never_wait_for_a_slow_agent():
    release = threading.Event()
    answer = AgentSnapshot(schema="tpu-tools/agent/v1", pid=7, arrays_report=Arrays(arrays=[]))
    board = ArraysBoard(ask=lambda pid: (release.wait(20), answer)[1])
    # type: ignore[union-attr]
    assert board.ask("7", 7)
    assert board.read("7").pending
    assert not board.ask("7", 7)  # a second press while it runs starts nothing more
    lines = frame_text(arrays_lines(board.read("7"), 100))
    assert "asking the agent of 7" in lines
    release.set()
    wait_for(lambda: not board.read("7").pending, 10)  # type: ignore[union-attr]
    assert "no live arrays" in frame_text(arrays_lines(board.read("7"), 100))


def test_rendering_fits_any_width_and_bounds_the_rows():
    report = {"arrays": [{"shape": f"({n}, 1024)", "dtype": "bfloat16", "sharding": "NamedSharding('data', None)",
                          "source": f"/home/u/project/model.py:{n} (init_params)", "bytes": n << 20, "count": 1}
                         for n in range(40, 0, -1)],
              "arrays_looked_at": 40, "truncated": True, "elapsed_s": 0.031,
              "sites": [{"source": "/home/u/project/model.py:12 (init_params)", "bytes": 1 << 30, "count": 40}],
              "sites_error": None}
    read = ArraysRead(1, 1.0e9, 1.0e9 + 0.5, msgspec.convert(report, Arrays))
    for width in (40, 80, 200):
        lines = arrays_lines(read, width)
        text = frame_text(lines)
        assert all(len(line.text) <= width for line in (line.cut(width) for line in lines))
        assert "30 more groups" in text
        assert "stopped at its bound" in text
    wide = frame_text(arrays_lines(read, 200))
    assert "model.py:40 (init_params)" in wide
    assert "/home/u/project" not in wide  # the file, not its directory
    assert "model.py:12 (init_params)" in wide.split("Allocation sites")[1]
    failed = frame_text(arrays_lines(ArraysRead(1, 1.0e9, 1.0e9, None, "timed out after 10 s"), 80))
    assert "timed out after 10 s" in failed
    no_traceback = dict(report, arrays=[{**report["arrays"][0], "source": ""}], truncated=False)
    assert "(no traceback)" in frame_text(arrays_lines(ArraysRead(1, 1.0e9, 1.0e9, msgspec.convert(no_traceback,
                                                                                                   Arrays)), 200))


def _row_of(screen: str, text: str) -> str:
    return next((line for line in screen.splitlines() if text in line), "")


def test_m_in_a_terminal_shows_the_arrays_and_the_keys_keep_working():
    require_program("tmux")
    with running_job(tag="arrjob", host_devices=2) as (job, rundir):
        env = agent_env(rundir, TERM="xterm-256color")
        env["PATH"] = str(Path(tool_command("tpu-top")[0]).parent) + os.pathsep + env.get("PATH", "")
        tmux = Tmux(200, 60, env)
        try:
            tmux.keys("tpu-top --interval 0.3", "Enter")
            tmux.wait_for(lambda s: f"{job.pid}" in s and "arrjob" in s)
            tmux.keys("Enter")
            tmux.wait_for(lambda s: "Compiles by function" in s
                          and s.splitlines()[-1].startswith(" Esc back  m arrays"))
            tmux.keys("m")
            # A capture can land while tmux is still painting the frame: the row is whole once its last column
            # (where the array was made) is drawn, and the frame once its last section (the sites) is.
            screen = tmux.wait_for(lambda s: "Memory by allocation  read at " in s and "Allocation sites" in s
                                   and "job.py:" in _row_of(s, "(512, 1024)"), 30)
            big = _row_of(screen, "(512, 1024)")
            assert "float32" in big
            assert "NamedSharding" in big
            assert screen.splitlines()[-1].startswith(" Esc back  m arrays")
            tmux.keys("Escape")
            tmux.wait_for(lambda s: " Processes" in s and "Memory by allocation" not in s)
            tmux.keys("q")
        finally:
            tmux.kill()
