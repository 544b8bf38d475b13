"""The job log: a job's identity, many writers, a torn line, compaction, the figures read from it, and
tpu-monitor --job's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from agentjobs import make_rundir, remove_rundir, wait_for
from conftest import assert_one_line_error, clean_env, run_tool

from tpu_tools.metrics.joblife import job_life
from tpu_tools.metrics.joblog import MAX_LOG_BYTES, JobEvent, append, decode, job_identity, log_path, read_log


def test_the_identity_given_wins_then_kubernetes_then_slurm(tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    labels.write_text('batch.kubernetes.io/job-name="train"\nbatch.kubernetes.io/controller-uid="3f1c2a9e-77"\n')
    env = {"SLURM_JOB_ID": "881", "TPU_WORKER_ID": "3"}
    assert job_identity(env, tmp_path / "none") == job_identity(env, tmp_path / "none")
    slurm = job_identity(env, tmp_path / "none")
    assert slurm is not None
    assert (slurm.job, slurm.source, slurm.worker) == ("slurm-881", "slurm", "3")
    job = job_identity(env, labels)
    assert job is not None
    assert (job.job, job.source) == ("train-3f1c2a9e", "kubernetes-job")
    jobset = job_identity({**env, "JOBSET_NAME": "llm"}, labels)
    assert jobset is not None
    assert (jobset.job, jobset.source) == ("llm", "kubernetes-jobset")
    given = job_identity({**env, "TPU_TOOLS_JOB": "mine"}, labels)
    assert given is not None
    assert (given.job, given.source) == ("mine", "given")
    assert job_identity({**env, "TPU_TOOLS_JOB": "mine"}, labels, given="flag").job == "flag"  # type: ignore[union-attr]
    assert job_identity({"TPU_TOOLS_JOB": "bad\x1b[2J"}, tmp_path / "none") is None  # not printable: not a name
    assert job_identity({}, tmp_path / "none") is None


def test_a_name_that_is_not_a_safe_file_name_gets_one_of_its_own(tmp_path: Path) -> None:
    assert log_path("train-1", tmp_path) == tmp_path / "train-1.log"
    odd = {log_path(name, tmp_path) for name in ("a/b", "a_b", "a b", "../x", ".hidden")}
    assert len(odd) == 5
    assert all(path.parent == tmp_path for path in odd)


def event(kind: str, t: float, process: str = "h/1/0", **fields) -> JobEvent:
    return JobEvent(kind, t, process, "h", int(process.split("/")[1]), **fields)  # type: ignore[arg-type]


def test_a_torn_last_line_is_skipped_and_a_malformed_one_counted() -> None:
    good = json.dumps({"event": "start", "time_unix_s": 1.0, "process": "h/1/0", "host": "h", "pid": 1})
    read = decode(f'{good}\n{{"event": "nonsense"}}\n{good}\n{good[:20]}'.encode())
    assert len(read.events) == 2
    assert read.malformed == 1


WRITER = ("import sys; from tpu_tools.metrics.joblog import JobEvent, append; from pathlib import Path\n"
          "for i in range(int(sys.argv[3])):\n"
          "    append(Path(sys.argv[1]), JobEvent('alive', float(i), 'h/%s/0' % sys.argv[2], 'h', int(sys.argv[2]),"
          " step=i, causes_s={'productive': 1.0, 'x' * 60: 2.0}))\n")


def write_together(path: Path, lines: int) -> None:
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(pid), str(lines)], env=clean_env())
               for pid in range(1, 5)]
    assert [writer.wait(timeout=240) for writer in writers] == [0, 0, 0, 0]


@pytest.mark.budget(30)  # four processes appending 300 lines each, under one lock
def test_many_writers_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    write_together(path, 300)
    read = read_log(path)
    assert read.malformed == 0
    assert len(read.events) == 1200
    for pid in range(1, 5):  # each writer's lines whole and in its order
        assert [e.step for e in read.events if e.pid == pid] == list(range(300))


@pytest.mark.budget(60)  # four processes appending 1.6 MB together: compacted while they write
def test_many_writers_through_compactions_lose_no_newest_line(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    write_together(path, 2500)
    read = read_log(path)
    # compacted
    assert read.malformed == 0
    assert path.stat().st_size <= MAX_LOG_BYTES
    assert len(read.events) < 4 * 2500
    assert not [name for name in os.listdir(tmp_path) if name != "job.log"]  # no compaction left a file behind
    for pid in range(1, 5):  # what a writer appended after a compaction replaced the file is in the new one
        steps = [e.step for e in read.events if e.pid == pid]
        assert steps[-1] == 2499
        assert steps == sorted(steps)


def test_the_log_is_compacted_and_keeps_what_the_figures_need(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    append(path, event("start", 1.0, started_unix_s=1.0))
    append(path, event("checkpoint", 2.0, step=10))
    line = len(json.dumps({"event": "alive", "time_unix_s": 3.0, "process": "h/1/0", "host": "h", "pid": 1,
                           "step": 11, "step_unix_s": 3.0}))
    for index in range(MAX_LOG_BYTES // line + 200):
        append(path, event("alive", 3.0 + index, step=11 + index, step_unix_s=3.0 + index))
    assert path.stat().st_size <= MAX_LOG_BYTES
    events = read_log(path).events
    kinds = [e.event for e in events]
    assert kinds[:2] == ["start", "checkpoint"]
    assert kinds.count("checkpoint") == 1
    assert events[-1].step == 11 + MAX_LOG_BYTES // line + 199  # the newest line is kept, none lost after it


def test_the_figures_of_two_hosts_restarted_once() -> None:
    events = []
    for place, died_at, first_at in (("0", 20.0, 31.0), ("1", 21.0, 33.0)):
        old, new = f"h{place}/1/0", f"h{place}/2/0"
        events += [JobEvent("start", 0.0, old, f"h{place}", 1, place, started_unix_s=0.0),
                   JobEvent("first_step", 5.0, old, f"h{place}", 1, place, step=1, step_unix_s=5.0),
                   JobEvent("checkpoint", 10.0, old, f"h{place}", 1, place, step=50),
                   JobEvent("alive", died_at, old, f"h{place}", 1, place, step=60 + int(place) * 5,
                            step_unix_s=died_at),
                   JobEvent("start", 25.0, new, f"h{place}b", 2, place, started_unix_s=25.0),
                   JobEvent("restore", 28.0, new, f"h{place}b", 2, place, step=50),
                   JobEvent("first_step", first_at, new, f"h{place}b", 2, place, step=51, step_unix_s=first_at),
                   JobEvent("end", 40.0, new, f"h{place}b", 2, place, step=70, step_unix_s=40.0)]
    life = job_life(events, lambda process: False)
    assert [p.place for p in life.places] == ["0", "1"]
    assert [[p.state for p in place.processes] for place in life.places] == [["died", "ended"]] * 2
    first, second = (place.processes[0] for place in life.places)
    assert (first.lost_steps, first.lost_s, first.recovery_s) == (10, 10.0, 11.0)
    assert (second.lost_steps, second.lost_s, second.recovery_s) == (15, 11.0, 12.0)
    (disruption,) = life.disruptions
    # the job: the most any host lost, from the first death to the last host stepping again
    assert (disruption.lost_steps, disruption.lost_s, disruption.recovery_s) == (15, 11.0, 13.0)
    assert life.places[0].figures.causes_s["down"] == 5.0
    assert life.last_step == 70


def test_tpu_monitor_job_errors_are_one_line(tmp_path: Path) -> None:
    env = clean_env(TPU_TOOLS_JOB_DIR=str(tmp_path / "missing"))
    assert_one_line_error(run_tool("tpu-monitor", "--job", "x", env=env), 1, "no job log directory")
    (tmp_path / "jobs").mkdir()
    append(log_path("known", tmp_path / "jobs"), event("start", 1.0))
    env = clean_env(TPU_TOOLS_JOB_DIR=str(tmp_path / "jobs"))
    assert_one_line_error(run_tool("tpu-monitor", "--job", "other", env=env), 2, "no job 'other'", "known")
    assert_one_line_error(run_tool("tpu-monitor", "--job", "a\x1b[2Jb", env=env), 2, "is not a job name")
    os.mkdir(log_path("dir", tmp_path / "jobs"))
    assert_one_line_error(run_tool("tpu-monitor", "--job", "dir", env=env), 1, "cannot read the log of job")
    result = run_tool("tpu-monitor", "--job", "known", env=env)
    assert result.returncode == 0
    assert json.loads(result.stdout)["processes"] == 1


def test_the_launcher_refuses_a_job_that_is_not_a_name() -> None:
    result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", "--job", "", "x.py"], capture_output=True,
                            text=True, env=clean_env())
    assert result.returncode == 2
    assert "--job must be printable text" in result.stderr


JOB = """
import json, sys, tpu_tools.agent as agent
agent.start()
agent.step(); agent.step()
bad = [agent.checkpoint_saved(-1), agent.checkpoint_saved(1.5), agent.checkpoint_saved(True)]
print(json.dumps({"bad": bad, "saved": agent.checkpoint_saved(2), "job": agent.current() is not None}))
"""


def test_a_job_log_that_cannot_be_written_never_reaches_the_job(tmp_path: Path) -> None:
    rundir = make_rundir()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    try:
        env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), TPU_TOOLS_JOB="j", TPU_TOOLS_JOB_DIR=str(blocked / "jobs"))
        result = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"bad": [False, False, False], "saved": True, "job": True}
        assert result.stderr == ""
    finally:
        remove_rundir(rundir)


def test_the_snapshot_names_the_job_and_its_log(tmp_path: Path) -> None:
    rundir = make_rundir()
    script = tmp_path / "job.py"
    script.write_text("import time, tpu_tools.agent as agent\nagent.checkpoint_restored(7)\n"
                      "for i in range(3000):\n    agent.step(); time.sleep(0.02)\n")
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), TPU_TOOLS_JOB_DIR=str(tmp_path / "jobs"))
    process = subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", "--job", "named", str(script)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def job_seen():
            result = run_tool("tpu-monitor", "--count", "1", env=env)
            agents = json.loads(result.stdout)["processes"]["agents"] if result.returncode == 0 else []
            jobs = [a.get("job") for a in agents if a.get("pid") == process.pid]
            return jobs[0] if jobs and jobs[0] and jobs[0]["step"] else None

        job = wait_for(job_seen, timeout=60)
        assert (job["id"], job["source"], job["log"]) == ("named", "given", str(tmp_path / "jobs" / "named.log"))
        # counted on from the state restored
        assert job["step"] > 7
        assert job["log_error"] is None
    finally:
        process.kill()
        process.wait()
        remove_rundir(rundir)


def test_the_fleet_takes_each_jobs_worst_host() -> None:
    from tpu_tools.metrics.fleet.client import Sample
    from tpu_tools.metrics.fleet.records import build_groups

    def sample(name: str, host: str, value: float) -> Sample:
        return Sample({"__name__": f"tpu_tools_job_{name}", "instance": host, "job": "tpu-tools",
                       "job_id": "llm"}, value)

    series = [sample("goodput_ratio", "h1", 0.9), sample("goodput_ratio", "h2", 0.8),
              sample("lost_progress_seconds", "h1", 3.0), sample("lost_progress_seconds", "h2", 5.0),
              sample("recovery_seconds", "h2", 40.0), sample("disruptions", "h1", 2.0)]
    (job,) = msgspec.to_builtins(build_groups(series, [])["processes"].jobs)
    assert job["job"] == "llm"
    assert job["hosts"] == ["h1", "h2"]
    assert job["goodput"] == {"goodput_percent": 80.0, "disruptions": 2, "lost_progress_steps": None,
                              "lost_progress_s": 5.0, "recovery_s": 40.0}  # the worst host's; no steps were served


def test_a_hostile_log_is_read_as_far_as_it_is_a_log(tmp_path: Path) -> None:
    directory = tmp_path / "jobs"
    directory.mkdir()
    env = clean_env(TPU_TOOLS_JOB_DIR=str(directory))
    path = log_path("odd", directory)
    good = {"event": "start", "time_unix_s": 1.0, "process": "h/1/0", "host": "h", "pid": 1, "started_unix_s": 1.0}
    bad = [{**good, "step": -1}, {**good, "pid": 0}, {**good, "event": "rm -rf"}, {**good, "time_unix_s": "x"},
           {**good, "process": "p" * 5000}]
    text = "\n".join([json.dumps(good), *map(json.dumps, bad), "NaN", "\x1b[2J", "{" * 100000]) + "\n"
    path.write_text(text + "a" * (5 << 20))  # and a torn tail longer than what is read
    result = run_tool("tpu-monitor", "--job", "odd", env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["processes"] == 1
    assert document["malformed_lines"] == 8
    assert document["truncated"] is True
    link = log_path("link", directory)
    link.symlink_to(path)
    assert_one_line_error(run_tool("tpu-monitor", "--job", "link", env=env), 1, "cannot read the log of job 'link'")
    fifo = log_path("fifo", directory)
    os.mkfifo(fifo)
    assert_one_line_error(run_tool("tpu-monitor", "--job", "fifo", env=env, timeout=60), 1,
                          "cannot read the log of job 'fifo'")


def test_a_process_that_stopped_writing_is_silent_not_dead() -> None:
    events = [JobEvent("start", 0.0, "far/1/0", "far", 1, "0", started_unix_s=0.0, heartbeat_s=1.0),
              JobEvent("alive", 30.0, "far/1/0", "far", 1, "0", step=5, step_unix_s=30.0)]
    assert job_life(events, lambda process: False, now=80.0).state == "running"  # within a minute
    life = job_life(events, lambda process: False, now=91.0)
    assert life.state == "silent"
    assert life.figures.disruptions == 0
    slow = [JobEvent("start", 0.0, "far/1/0", "far", 1, "0", started_unix_s=0.0, heartbeat_s=30.0), events[1]]
    assert job_life(slow, lambda process: False, now=200.0).state == "running"  # ten of its heartbeats: 300 s
    assert job_life(events, lambda process: True, now=91.0).state == "died"  # gone from this host: dead


WORKER = """
import os, sys, time, tpu_tools.agent as agent
agent.start()
resumed = int(sys.argv[1])
if resumed:
    agent.checkpoint_restored(resumed)
step = resumed
while True:
    time.sleep(0.02)
    step += 1
    agent.step()
    if step % 10 == 0:
        agent.checkpoint_saved(step)
        with open(sys.argv[2], "a") as truth:
            truth.write(f"{step}\\n")
"""


@pytest.mark.budget(60)  # four agent processes, two of them killed
def test_two_workers_share_one_log_and_the_job_counts_their_disruption_once(tmp_path: Path) -> None:
    rundir = make_rundir()
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), TPU_TOOLS_JOB_DIR=str(tmp_path / "jobs"),
                    TPU_TOOLS_JOB="pair", TPU_TOOLS_JOB_HEARTBEAT_S="0.05")
    running: list[subprocess.Popen] = []

    def start(worker: int, resumed: int) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", WORKER, str(resumed), str(tmp_path / f"saved-{worker}")],
                                   env={**env, "TPU_WORKER_ID": str(worker)}, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        running.append(process)
        return process

    def saved(worker: int) -> list[int]:
        path = tmp_path / f"saved-{worker}"
        return [int(line) for line in path.read_text().split()] if path.exists() else []

    try:
        first = [start(0, 0), start(1, 0)]
        wait_for(lambda: all(saved(w) for w in (0, 1)), timeout=60)
        for process in first:
            process.kill()
            process.wait()
        second = [start(w, max(saved(w))) for w in (0, 1)]

        def both_stepping() -> dict | None:
            result = run_tool("tpu-monitor", "--job", "pair", env=env)
            document = json.loads(result.stdout) if result.returncode == 0 else None
            recovered = document and document["disruptions"] and document["disruptions"][0]["recovered_unix_s"]
            return document if recovered else None

        document = wait_for(both_stepping, timeout=60)
        assert [host["host"] for host in document["hosts"]] == ["0", "1"]
        (disruption,) = document["disruptions"]
        deaths = [host["processes"][0]["died_unix_s"] for host in document["hosts"]]
        firsts = [host["processes"][1]["first_step_unix_s"] for host in document["hosts"]]
        assert disruption["died_unix_s"] == min(deaths)
        assert disruption["recovered_unix_s"] == max(firsts)
        assert disruption["lost_progress_steps"] == max(h["goodput"]["lost_progress_steps"] for h in document["hosts"])
        assert document["goodput"]["disruptions"] == 1
        assert document["state"] == "running"
        assert [p.pid for p in second] == [host["processes"][1]["pid"] for host in document["hosts"]]
        assert read_log(log_path("pair", tmp_path / "jobs")).malformed == 0
    finally:
        for process in running:
            process.kill()
            process.wait()
        remove_rundir(rundir)
