"""The startup contract's last checks on real torch_xla jobs: PJRT_DEVICE saying one device while the runtime
runs on another, and a persistent cache that several jobs write (the shared-cache view, `tpu-profile cache
doctor`) beside one a job only reads (XLA_PERSISTENT_CACHE_READ_ONLY).

Three jobs share the module, all with XLA_PERSISTENT_CACHE_PATH naming one directory: "switched" is imported
with PJRT_DEVICE=TPU and sets it to CPU before its runtime starts (torch_xla reads it then: it runs on the CPU),
"writer" keeps the contract, "reader" keeps it too and only reads the cache. "writer" starts once "switched"
has written the graph's entry.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch_xla_env
from agentjobs import Job, agent_env, make_rundir, published_after, remove_rundir, wait_for
from conftest import run_tool

from tpu_tools.profile.cachedoctor import diagnose

JOB = textwrap.dedent("""
    import os, sys, time
    ready, lifetime = sys.argv[1], float(sys.argv[2])
    import torch, torch_xla
    if os.environ.get("SWITCH_TO_CPU") == "1":
        os.environ["PJRT_DEVICE"] = "CPU"  # after the import, before the runtime starts: the runtime follows it
    x = torch.ones(4, device=torch_xla.device())
    (x * 2).sum()
    torch_xla.sync()
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + lifetime
    while time.time() < deadline and not os.path.exists(ready + ".exit"):
        time.sleep(0.05)
""")
JOBS = {"switched": {"PJRT_DEVICE": "TPU", "SWITCH_TO_CPU": "1"}, "writer": {},
        "reader": {"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}}


@pytest.fixture(scope="module")
def jobs() -> Iterator[tuple[dict[str, Any], dict[str, int], Path, Path]]:
    """tpu-monitor's report of the three jobs (still running), their pids, the runtime and cache directories."""
    python = torch_xla_env.require()
    rundir = make_rundir()
    workdir = Path(tempfile.mkdtemp(prefix="txc", dir="/tmp"))
    cache = workdir / "cache"
    (workdir / "job.py").write_text(JOB)
    started: dict[str, Job] = {}
    try:
        for tag, env in JOBS.items():
            if tag == "writer":  # after switched wrote the graph's entry: writer finds it, cannot read it back
                started["switched"].wait_ready(300)  # on the CPU platform, and writes it anew (no miss)
            process = subprocess.Popen(
                [str(python), "-m", "tpu_tools.agent", "--tag", tag, str(workdir / "job.py"),
                 str(workdir / f"ready-{tag}"), "600"],
                env=torch_xla_env.job_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), XLA_PERSISTENT_CACHE_PATH=str(cache),
                                          **env),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
            started[tag] = Job(process, workdir / f"ready-{tag}", workdir)
        for job in started.values():
            job.wait_ready(300)
        ready_at = time.time()  # each job synced, and its cache was written, before it wrote its ready file
        wait_for(lambda: published_after(rundir, ready_at, len(JOBS)), timeout=120, interval=0.2)

        def published_since_ready() -> dict[str, Any] | None:
            result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
            agents = report["processes"]["agents"]
            settled = len(agents) == len(JOBS) and all(
                a["startup"] is not None and a["compilation_cache"] is not None for a in agents)
            return report if settled else None

        report = wait_for(published_since_ready, timeout=120, interval=0.5)
        yield report, {t: j.process.pid for t, j in started.items()}, rundir, cache
    finally:
        for job in started.values():
            job.stop()
        remove_rundir(rundir)


def _agents(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    agents = {agent["tag"]: agent for agent in report["processes"]["agents"]}
    assert all(agent["error"] is None for agent in agents.values()), agents
    return agents


def test_pjrt_device_saying_tpu_while_the_runtime_runs_on_the_cpu_is_a_finding(jobs) -> None:
    agents = _agents(jobs[0])
    [finding] = agents["switched"]["startup"]
    assert finding["check"] == "pjrt_device_mismatch"
    assert finding["message"] == "PJRT_DEVICE says TPU but the runtime runs on CPU"
    assert finding["fix"].startswith("set PJRT_DEVICE to the device")
    assert agents["writer"]["startup"] == []
    assert agents["reader"]["startup"] == []  # quiet where it agrees


def test_the_shared_cache_view_names_the_two_writers_never_the_reader(jobs) -> None:
    report, pids, _, cache = jobs
    agents = _agents(report)
    assert agents["reader"]["compilation_cache"]["entries_written"] == 0
    assert agents["writer"]["compilation_cache"]["entries_written"] > 0
    [shared] = report["processes"]["shared_cache_dirs"]
    assert shared["dir"] == str(cache)
    assert sorted(w["pid"] for w in shared["writers"]) == sorted([pids["switched"], pids["writer"]])


def test_doctor_flags_the_writers_and_the_read_only_setting(jobs) -> None:
    _, pids, rundir, cache = jobs
    result = run_tool("tpu-profile", "cache", "doctor", str(cache), "--json",
                      env=agent_env(rundir, XLA_PERSISTENT_CACHE_PATH=str(cache), XLA_PERSISTENT_CACHE_READ_ONLY="1"))
    assert result.returncode in (0, 1), result.stderr
    findings = {f["code"]: f for f in json.loads(result.stdout)["findings"]}
    assert {"torch_xla_shared_writers", "torch_xla_read_only"} <= set(findings)
    message = findings["torch_xla_shared_writers"]["message"]
    assert message.startswith(f"2 running jobs write into {cache}")
    assert str(pids["switched"]) in message
    assert str(pids["writer"]) in message
    assert str(pids["reader"]) not in message


def test_doctor_is_quiet_on_one_writer_and_its_readers(jobs) -> None:
    cache = jobs[3]
    report = diagnose(cache, env={"XLA_PERSISTENT_CACHE_PATH": str(cache)},
                      job_dirs={"1 (warm)": str(cache), "2 (read)": str(cache), "3 (read)": str(cache)},
                      writers=frozenset({"1 (warm)"}))
    assert not [f for f in report.findings if f.code.startswith("torch_xla")]
