"""A job's goodput across restarts, end to end: a real JAX training loop, checkpointing with the agent's API, is
killed (SIGKILL) and restarted from its last checkpoint twice; `tpu-monitor --job` reports what the job lost and
how long it took to recover, against the truth the job and the test recorded."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentjobs import make_rundir, remove_rundir, wait_for
from conftest import as_report, clean_env, run_tool
from test_doc_examples import all_examples, same_shape
from test_dump_cli import _members

from tpu_tools.top.drawing import seconds_text
from tpu_tools.top.frame import frame_text
from tpu_tools.top.jobview import job_lines
from tpu_tools.top.model import ViewState

SCRIPT = Path(__file__).with_name("joblife_job.py")
JOB = "train-life"
EVERY, TOTAL, STEP_S = 5, 40, 0.1
DOC_EXAMPLE = f"tpu-monitor --job {JOB} | jq -c '.goodput, .disruptions[]'"


def truth_lines(path: Path) -> list[dict]:
    """The truth so far; a line being written (no newline yet) is not read."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def within(reported: float, truth: float) -> bool:
    """The done-when's tolerance: 2 %, or 0.5 s."""
    return abs(reported - truth) <= max(0.02 * abs(truth), 0.5)


@pytest.mark.budget(150)  # three JAX processes started one after the other, two of them killed
def test_a_job_killed_twice_reports_lost_progress_and_recovery(tmp_path: Path) -> None:
    rundir = make_rundir()
    ckpt, truth, jobs = tmp_path / "ckpt", tmp_path / "truth.jsonl", tmp_path / "jobs"
    ckpt.mkdir()
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), TPU_TOOLS_JOB_DIR=str(jobs), TPU_TOOLS_JOB_HEARTBEAT_S="0.05",
                    JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "tpu_tools.agent", "--job", JOB, str(SCRIPT), str(ckpt), str(truth), str(EVERY),
               str(TOTAL), str(STEP_S)]
    pids, kills = [], []
    try:
        for attempt in range(3):
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       stdin=subprocess.DEVNULL)
            pids.append(process.pid)
            if attempt == 2:
                output, _ = process.communicate(timeout=300)
                assert process.returncode == 0, output
                break

            def past_its_checkpoint(pid: int = process.pid, running: subprocess.Popen = process) -> bool:
                assert running.poll() is None, running.communicate()[0]
                mine = [line for line in truth_lines(truth) if line["pid"] == pid]
                saved = [line["step"] for line in mine if line["event"] == "checkpoint"]
                steps = [line["step"] for line in mine if line["event"] == "step"]
                return bool(saved) and steps[-1] >= saved[-1] + 3  # some progress the next process repeats

            wait_for(past_its_checkpoint, timeout=240)
            kills.append(time.time())
            process.kill()
            process.wait(timeout=30)
            process.stdout.close()  # type: ignore[union-attr]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    try:
        check_the_figures(truth, env, pids, kills)
        check_what_the_exporter_serves(env)
    finally:
        remove_rundir(rundir)


def check_the_figures(truth: Path, env: dict[str, str], pids: list[int], kills: list[float]) -> None:
    lines = truth_lines(truth)
    result = run_tool("tpu-monitor", "--job", JOB, env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "tpu-tools/job/v1"
    assert document["job"] == JOB
    assert document["processes"] == 3
    assert document["state"] == "ended"
    assert document["last_step"] == TOTAL
    (host,) = document["hosts"]
    assert [p["pid"] for p in host["processes"]] == pids
    assert [p["state"] for p in host["processes"]] == ["died", "died", "ended"]
    assert len(document["disruptions"]) == 2

    truths: list[dict] = []
    for index, (killed, successor, killed_at) in enumerate(zip(pids, pids[1:], kills)):
        mine = [line for line in lines if line["pid"] == killed]
        resumed = next(line["step"] for line in lines if line["pid"] == successor and line["event"] == "start")
        last = max((line for line in mine if line["event"] == "step"), key=lambda line: line["step"])
        saved_at = next(line["t"] for line in mine if line["event"] == "checkpoint" and line["step"] == resumed)
        first_step_at = next(line["t"] for line in lines if line["pid"] == successor and line["event"] == "step")
        truth_lost_steps, truth_lost_s = last["step"] - resumed, last["t"] - saved_at
        truth_recovery_s = first_step_at - killed_at
        step_s = statistics.median(b["t"] - a["t"] for a, b in zip(mine, mine[1:])
                                   if a["event"] == b["event"] == "step")

        truths.append({"lost_progress_steps": truth_lost_steps, "lost_progress_s": truth_lost_s,
                       "recovery_s": truth_recovery_s})
        disruption = document["disruptions"][index]
        process = host["processes"][index]
        for reported in (disruption, process):
            assert within(reported["lost_progress_s"], truth_lost_s), (reported, truth_lost_s)
            assert within(reported["recovery_s"], truth_recovery_s), (reported, truth_recovery_s)
            # a step the log did not see yet is at most the tolerance's worth of steps
            missed_s = abs(reported["lost_progress_steps"] - truth_lost_steps) * step_s
            assert missed_s <= max(0.02 * truth_lost_s, 0.5), (reported, truth_lost_steps)
        assert truth_lost_steps >= 3
        assert host["processes"][index + 1]["restored_step"] == resumed

    goodput = document["goodput"]
    assert goodput["disruptions"] == 2
    assert goodput["lost_progress_s"] == pytest.approx(sum(d["lost_progress_s"] for d in document["disruptions"]))
    assert goodput["recovery_s"] == pytest.approx(sum(d["recovery_s"] for d in document["disruptions"]))
    assert goodput["causes_s"]["lost_progress"] == pytest.approx(goodput["lost_progress_s"])
    assert 0 < goodput["goodput_percent"] < 100
    print(json.dumps({"truth": truths, "reported": document["disruptions"]}))
    # the example of docs/goodput.md has the shape of this run
    (shown,) = [lines for doc, command, lines in all_examples() if command == DOC_EXAMPLE]
    actual = [json.dumps(value) for value in (document["goodput"], *document["disruptions"])]
    assert same_shape(shown, actual), (shown, actual)


LIGHT = """
import sys, time, tpu_tools.agent as agent
agent.start(job=sys.argv[1])
agent.checkpoint_restored(40)
while True:
    agent.step(); time.sleep(0.05)
"""


def check_what_the_exporter_serves(env: dict[str, str]) -> None:
    """A fourth process of the job runs beside the exporter: the job's figures over its life are served."""
    document = json.loads(run_tool("tpu-monitor", "--job", JOB, env=env).stdout)["goodput"]
    process = subprocess.Popen([sys.executable, "-c", LIGHT, JOB], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = subprocess.run([sys.executable, str(SCRIPT.with_name("exposition_once.py")), "--until",
                                 r"^tpu_tools_job_recovery_seconds\{"], env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        served = {line.split(" ")[0]: float(line.split(" ")[1]) for line in result.stdout.splitlines()
                  if line.startswith(("tpu_tools_job_", "tpu_tools_process_job_info"))}
        label = f'{{job_id="{JOB}"}}'
        assert served[f"tpu_tools_job_disruptions{label}"] == 2
        assert served[f"tpu_tools_job_lost_progress_steps{label}"] == document["lost_progress_steps"]
        assert served[f"tpu_tools_job_lost_progress_seconds{label}"] == pytest.approx(document["lost_progress_s"])
        assert served[f"tpu_tools_job_recovery_seconds{label}"] == pytest.approx(document["recovery_s"])
        assert 0 < served[f"tpu_tools_job_goodput_ratio{label}"] < 1
        (info,) = [name for name in served if name.startswith("tpu_tools_process_job_info")]
        assert f'pid="{process.pid}"' in info
        assert f'job_id="{JOB}"' in info
        report = json.loads(run_tool("tpu-monitor", "--count", "1", env=env).stdout)
        (job,) = report["processes"]["jobs"]
        assert (job["job"], job["state"], job["processes"]) == (JOB, "running", 4)
        # tpu-top's job screen of the fourth process: its job, and the job's life
        screen = frame_text(job_lines(as_report(report), ViewState(job_key=str(process.pid)), None, 160, None))
        assert f"JOB {JOB} (given)" in screen
        assert "last checkpoint -" in screen
        lost = seconds_text(document["lost_progress_s"])
        assert f"2 disruptions  lost {lost} ({document['lost_progress_steps']} steps)" in screen, screen
        # and tpu-dump keeps it beside the agents
        bundle = Path(env["TPU_TOOLS_JOB_DIR"]).parent / "bundle.tar.gz"
        dumped = run_tool("tpu-dump", "--only", "accelerators", "-o", str(bundle), env=env)
        assert dumped.returncode == 0, dumped.stderr
        (kept,) = json.loads(_members(bundle)["accelerators/jobs.json"])["jobs"]
        assert kept["job"] == JOB
        assert kept["goodput"]["disruptions"] == 2
    finally:
        process.kill()
        process.wait()
