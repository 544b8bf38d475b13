"""Where a hang is: a two-process jax.distributed job, one worker loading data while the other waits in a
collective. tpu-top, its job screen, tpu-monitor and the fleet view over Prometheus name the stalled job, the
worker that differs and the function it is in."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentjobs import agent_env, make_rundir, remove_rundir, wait_for
from conftest import as_report, clean_env, run_tool, tool_command
from promstack import PROMETHEUS, PrometheusServer, free_port

from tpu_tools.metrics.records.jobs import AgentEntry, EntrySteps, StallStack
from tpu_tools.metrics.stall import STALL_FLOOR_S, stall_findings, stalled_for
from tpu_tools.top.frame import frame_text
from tpu_tools.top.jobview import job_lines
from tpu_tools.top.model import ViewState

STALL_AT = 20

WORKER = textwrap.dedent(f"""
    import sys, time
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    import tpu_tools.agent as agent

    agent.start(tag="dist")
    me = int(sys.argv[2])

    def load_batch(step):
        if me == 1 and step == {STALL_AT}:
            open(sys.argv[3], "w").write("stalled")
            time.sleep(600)  # the data never comes
        return jnp.full(4, float(step))

    def train(step):
        batch = load_batch(step)
        return multihost_utils.process_allgather(batch)  # every worker waits here for the others

    for step in range(10 ** 6):
        train(step)
        agent.step()
        time.sleep(0.02)
""")


@pytest.fixture(scope="module")
def stalled_job() -> Iterator[tuple[Path, list[subprocess.Popen]]]:
    rundir, workdir = make_rundir(), Path(make_rundir())
    script, ready = workdir / "job.py", workdir / "stalled"
    script.write_text(WORKER)
    address = f"127.0.0.1:{free_port()}"
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), JAX_PLATFORMS="cpu")
    workers = [subprocess.Popen([sys.executable, str(script), address, str(index), str(ready)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for index in (0, 1)]
    try:
        wait_for(lambda: ready.exists() or any(w.poll() is not None for w in workers), timeout=120)
        assert all(w.poll() is None for w in workers), [w.stderr.read() for w in workers if w.stderr]
        yield rundir, workers
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(timeout=30)
        remove_rundir(rundir)
        remove_rundir(workdir)


def monitor_report(rundir: Path) -> dict:
    result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def both_stalled(rundir: Path) -> dict | None:
    report = monitor_report(rundir)
    agents = report["processes"]["agents"]
    return report if len(agents) == 2 and all(a.get("stack", {}).get("where") for a in agents) else None


def test_the_worker_loading_data_is_named_with_its_function(stalled_job):
    rundir, workers = stalled_job
    report = wait_for(lambda: both_stalled(rundir), timeout=60, interval=0.5)
    agents = {a["pid"]: a for a in report["processes"]["agents"]}
    loader, waiter = agents[workers[1].pid], agents[workers[0].pid]
    assert loader["stalled_s"] > STALL_FLOOR_S
    assert waiter["stalled_s"] > STALL_FLOOR_S
    assert loader["stack"]["where"] == "load_batch (job.py:16)"
    assert not loader["stack"]["in_library"]
    assert waiter["stack"]["where"] == "train (job.py:21)"
    assert waiter["stack"]["in_library"]
    [finding] = report["processes"]["stall_findings"]
    assert finding["tag"] == "dist"
    assert finding["others_where"] == ["train (job.py:21)"]
    assert [(w["pid"], w["where"]) for w in finding["workers"]] == [(workers[1].pid, "load_batch (job.py:16)")]

    once = run_tool("tpu-top", "--once", env=agent_env(rundir, COLUMNS="200"))
    assert once.returncode == 0, once.stderr
    rows = [line for line in once.stdout.splitlines() if line.split()[:1] in ([str(workers[0].pid)],
                                                                                [str(workers[1].pid)])]
    assert len(rows) == 2, once.stdout
    assert all(" dist " in row and " STALL " in row for row in rows), once.stdout
    assert (f"stalled job dist: worker {workers[1].pid} differs, in load_batch (job.py:16); the others in "
            "train (job.py:21)") in once.stdout

    screen = frame_text(job_lines(as_report(report), ViewState(job_key=str(workers[1].pid)), None, 120, None))
    assert "STALLED: no step for " in screen
    assert "main thread in load_batch (job.py:16)  (from its agent)" in screen
    assert "load_batch  job.py:16" in screen
    assert "train  job.py:20" in screen


@pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus binary")
def test_the_fleet_view_names_the_worker_that_differs(stalled_job, tmp_path):
    rundir, workers = stalled_job
    wait_for(lambda: both_stalled(rundir), timeout=60, interval=0.5)
    port = free_port()
    exporter = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", f"127.0.0.1:{port}"],
                                env=agent_env(rundir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = PrometheusServer(tmp_path, {"tpu-tools": [f"127.0.0.1:{port}"]})
    try:
        server.start()
        server.wait_for("tpu_tools_process_stack_info", count=2)
        result = run_tool("tpu-monitor", "--from-prometheus", server.url, "--count", "1")
        assert result.returncode == 0, result.stderr
        fleet = json.loads(result.stdout.splitlines()[-1])
        [finding] = fleet["fleet"]["stall_findings"]
        [worker] = finding["workers"]
        assert (worker["pid"], worker["where"], finding["tag"]) == (workers[1].pid, "load_batch (job.py:16)", "dist")
        assert worker["host"] == f"127.0.0.1:{port}"
    finally:
        server.stop()
        exporter.terminate()
        exporter.wait(timeout=30)


def test_a_job_is_stalled_past_ten_median_steps_and_five_seconds():
    assert stalled_for(EntrySteps(count=50, p50_step_time_s=0.1, last_step_age_s=4.0)) is None  # under the floor
    assert stalled_for(EntrySteps(count=50, p50_step_time_s=0.1, last_step_age_s=6.0)) == 6.0
    assert stalled_for(EntrySteps(count=50, p50_step_time_s=2.0, last_step_age_s=19.0)) is None  # under 10 steps
    assert stalled_for(EntrySteps(count=1, p50_step_time_s=0.1, last_step_age_s=60.0)) is None  # no median yet
    assert stalled_for(None) is None


def test_seven_in_an_all_reduce_and_one_loading_data():
    def worker(pid: int, where: str, library: bool) -> AgentEntry:
        return AgentEntry(pid=pid, tag="big", host=f"h{pid}", stalled_s=60.0,
                          stack=StallStack(where=where, in_library=library))

    agents = [worker(pid, "train (job.py:21)", True) for pid in range(7)] + [worker(7, "load (job.py:9)", False)]
    [finding] = stall_findings(agents)
    assert [w.pid for w in finding.workers] == [7]
    assert finding.workers[0].host == "h7"
    assert stall_findings(agents[:7]) == []  # all in the same place: nobody differs
    tied = [worker(1, "a (job.py:1)", False), worker(2, "b (job.py:2)", False)]
    assert stall_findings(tied) == []  # two in their own code, each elsewhere: no way to tell
