"""The job-end record says what happened to the hardware during the job: NVML's stand-in for a GPU job, libtpu's
SDK stand-in for a TPU job, unknown (None) on the CPU platform."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentjobs import agent_env, make_rundir, remove_rundir, wait_for
from conftest import run_tool
from fakenvml import nvml_env

FAKE_LIBTPU = Path(__file__).resolve().parent / "fake_libtpu"

JOB = textwrap.dedent("""
    import os, sys, time
    ready = sys.argv[1]
    if sys.argv[2] == "tpu":
        import libtpu  # as a TPU job does (jax's TPU backend imports it)
    import tpu_tools.agent as agent
    agent.start(tag="hardware")
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(ready + ".stop"):
        time.sleep(0.02)
        agent.step()
""")


@pytest.fixture
def rundir() -> Iterator[Path]:
    path = make_rundir()
    yield path
    remove_rundir(path)


def run_job(tmp_path: Path, rundir: Path, kind: str, env: dict[str, str], before_stop=None) -> tuple[dict, float]:
    """Start the job, let it run until `before_stop` (if any) returns, stop it; (its job-end record, its wall time)."""
    script, ready = tmp_path / "job.py", tmp_path / "ready"
    script.write_text(JOB)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, str(script), str(ready), kind], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: ready.exists() and ready.read_text() or process.poll() is not None, 60)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        running = time.monotonic()
        wait_for(lambda: time.monotonic() - running > 3.0, 10, interval=0.05)  # a job that lasts a while
        if before_stop is not None:
            wait_for(before_stop, 30, interval=0.2)
        Path(f"{ready}.stop").touch()
        assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    wall = time.monotonic() - started
    listed = run_tool("tpu-monitor", "--jobs-ended", env=agent_env(rundir))
    assert listed.returncode == 0, listed.stderr
    [record] = [job for job in json.loads(listed.stdout)["jobs"] if job["pid"] == process.pid]
    return record["hardware"], wall


def test_a_gpu_job_records_xids_throttling_energy_and_its_peak_memory(tmp_path, rundir, fake_nvml_dir):
    env = nvml_env(fake_nvml_dir, TPU_TOOLS_RUNTIME_DIR=str(rundir), FAKE_NVML_PROCS="0:0:1073741824",
                   FAKE_NVML_XID="0:79,1:13", FAKE_NVML_ENERGY_MW="250000")
    hardware, wall = run_job(tmp_path, rundir, "gpu", env)
    assert hardware["source"] == "nvml"
    assert hardware["error"] is None
    assert hardware["xid_events"] == {"79": 1}  # GPU 1's event is another GPU's: the job holds GPU 0 only
    # 250 W over the job's life (sampled every second; at the interpreter's exit the last sample stands)
    assert 250 * 1.0 <= hardware["energy_joules"] <= 250 * wall
    assert set(hardware["throttled_s"]) == {"sw_power_cap"}
    assert 1.0 <= hardware["throttled_s"]["sw_power_cap"] <= wall
    assert hardware["device_memory_peak_bytes"] == 1 << 30  # what the job's process held
    assert hardware["ici_link_changes"] is None


def test_a_tpu_job_records_throttling_and_ici_link_health_changes(tmp_path, rundir):
    changed = tmp_path / "links"
    env = agent_env(rundir, PYTHONPATH=str(FAKE_LIBTPU), FAKE_TPU_ICI_LINK_HEALTH_FILE=str(changed),
                    TPU_TOOLS_NVML="0")

    def change_seen() -> bool:
        if not changed.exists():
            changed.write_text("tray1.chip0.ici0.int: 8;tray1.chip0.ici1.int: 10;tray1.chip1.ici0.int: 7")
        report = json.loads(run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir)).stdout)
        links = [link for agent in report["processes"]["agents"]
                 for link in ((agent.get("tpu_sdk") or {}).get("health") or {}).get("ici_links") or []]
        return any(link["location"] == "tray1.chip0.ici0.int" and link["score"] == 8 for link in links)

    hardware, wall = run_job(tmp_path, rundir, "tpu", env, before_stop=change_seen)
    assert hardware["source"] == "libtpu_sdk"
    assert hardware["energy_joules"] is None
    assert [(c["link"], c["from"], c["to"], c["state"]) for c in hardware["ici_link_changes"]] == [
        ("tray1.chip0.ici0.int", 0, 8, "persistent problem")]
    throttled = hardware["throttled_s"]  # scores 0, 1, 0, 6: 0 %, 10 %, 0 %, 60 % of the job's time
    assert throttled["tpu:0"] == throttled["tpu:2"] == 0.0
    assert 0 < throttled["tpu:1"] < throttled["tpu:3"] <= 0.6 * wall


def test_a_cpu_job_knows_none_of_it(tmp_path, rundir):
    hardware, _ = run_job(tmp_path, rundir, "cpu", agent_env(rundir, TPU_TOOLS_NVML="0"))
    assert hardware == {"source": None, "xid_events": None, "throttled_s": None, "energy_joules": None,
                        "ici_link_changes": None, "device_memory_peak_bytes": None, "error": None}


EXITING_JOB = textwrap.dedent("""
    import sys
    import libtpu  # a TPU job
    import tpu_tools.agent as agent
    import tpu_tools.agent.tpusdk as sdk
    sdk.MIN_READ_INTERVAL_S = 0.0  # every full snapshot asks the SDK anew: so does the last one, at the exit
    agent.start(tag="exiting")
    for _ in range(50):
        agent.step()
    print(agent.current().pid, flush=True)
""")  # and the interpreter exits: the agent stops in its atexit handler


def test_a_job_that_exits_leaves_its_record_though_no_sdk_read_can_start_then(tmp_path, rundir):
    script = tmp_path / "job.py"
    script.write_text(EXITING_JOB)
    env = agent_env(rundir, PYTHONPATH=str(FAKE_LIBTPU), TPU_TOOLS_NVML="0")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "no job summary written" not in result.stderr  # starting a thread at the exit raises: not into the record
    listed = run_tool("tpu-monitor", "--jobs-ended", env=agent_env(rundir))
    [record] = [job for job in json.loads(listed.stdout)["jobs"] if job["pid"] == int(result.stdout.split()[0])]
    assert record["hardware"]["source"] == "libtpu_sdk"
