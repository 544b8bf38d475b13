"""ICI link health and throttle scores: parsed from the SDK's formats into records, read by the agent in the
job (only what the metrics service does not serve, each failed metric once, a switch to turn it off), and a
job with the real libtpu loaded beside a service whose answers abort libtpu's own client: the job lives."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import libtpu_sdk
import pytest
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import as_report, run_tool
from hypothesis import given
from hypothesis import strategies as st

from tpu_tools.metrics.tpuhealth import MAX_LINKS, health_from_sdk, parse_link_health, parse_throttle

TESTS = Path(__file__).resolve().parent
FAKE_LIBTPU = TESTS / "fake_libtpu"


# --- the SDK's formats, and everything else reported ----------------------------------------------------------

def test_link_health_and_throttle_in_the_sdks_documented_formats():
    problems: list[str] = []
    links = parse_link_health(["tray1.chip3.ici0.int: 0", "tray1.chip3.ici1.int: 10", " tray2.chip0.ici5.ext:7 "],
                              problems)
    throttle = parse_throttle(["0-0", "1-1", "2-0", "3-10"], problems)
    assert problems == []
    assert [(link.location, link.score, link.state) for link in links] == [
        ("tray1.chip3.ici0.int", 0, "healthy"), ("tray1.chip3.ici1.int", 10, "unusable"),
        ("tray2.chip0.ici5.ext", 7, "persistent problem")]
    assert (links[1].tray, links[1].chip, links[1].port, links[1].kind) == (1, 3, 1, "int")
    assert [(t.device, t.score, t.throttled_percent) for t in throttle] == [(0, 0, 0), (1, 1, 10), (2, 0, 0),
                                                                            (3, 10, 100)]


@pytest.mark.parametrize(("value", "fragment"), [
    ("tray1.chip3.ici0.int: nan", "is not an integer 0..10"),
    ("tray1.chip3.ici0.int: -1", "out of range"),
    ("tray1.chip3.ici0.int: 11", "out of range"),
    ("tray1.chip3.ici0.int: 2.5", "is not an integer"),
    ("tray1.chip3.ici0.int: ten", "is not an integer"),
    ("port7: 0", "unknown link name 'port7'"),
    ("tray1.chip3.ici0.int", "is not 'LOCATION: SCORE'"),
    (10.0, "is not 'LOCATION: SCORE'"),
    (None, "is not 'LOCATION: SCORE'"),
])
def test_a_link_value_outside_the_format_is_reported_never_shown(value, fragment):
    problems: list[str] = []
    assert parse_link_health([value, "tray1.chip0.ici0.int: 3"], problems)[0].score == 3
    assert len(problems) == 1, problems
    assert fragment in problems[0], problems


@pytest.mark.parametrize("value", ["1-nan", "1--1", "1-11", "-1-0", "a-1", "1", "1-1.0", ""])
def test_a_throttle_value_outside_the_format_is_reported(value):
    problems: list[str] = []
    assert parse_throttle([value], problems) == []
    assert len(problems) == 1


def test_repeats_and_a_million_links_are_reported():
    problems: list[str] = []
    links = parse_link_health(["tray1.chip0.ici0.int: 1", "tray1.chip0.ici0.int: 9"], problems)
    assert [link.score for link in links] == [1]
    assert "repeated" in problems[0]
    problems = []
    assert parse_link_health([f"tray1.chip{i}.ici0.int: 0" for i in range(10 ** 6)], problems) == []
    assert problems == [f"ici_link_health: {10 ** 6} links, more than any host has; none read"]
    problems = []
    parse_link_health([f"bad{i}" for i in range(MAX_LINKS)], problems)
    assert len(problems) == 21
    assert problems[-1] == f"{MAX_LINKS - 20} more unreadable values"


def test_health_from_the_agents_read_names_errors_and_dropped_values():
    health = health_from_sdk({"ici_link_health": {"values": ["tray1.chip0.ici0.int: 10"], "dropped": 5},
                              "tpu_throttle_score": {"error": "RuntimeError: boom"}})
    assert health is not None
    assert health.worst_link is not None
    assert health.worst_link.score == 10
    assert health.problems == ["ici_link_health: 5 more values than the agent reads were left out",
                               "tpu_throttle_score: RuntimeError: boom"]
    assert health_from_sdk({"tensorcore_util": {"values": [1.0]}}) is None
    assert health_from_sdk("garbage") is None


@given(st.lists(st.one_of(st.text(max_size=40), st.floats(allow_nan=True), st.integers(), st.none()), max_size=30))
def test_any_values_give_links_or_problems_never_an_exception(values):
    problems: list[str] = []
    links = parse_link_health(values, problems)
    throttle = parse_throttle(values, problems)
    assert all(0 <= link.score <= 10 for link in links)
    assert all(0 <= t.score <= 10 for t in throttle)
    assert len(links) + len(throttle) + len(problems) >= min(len(values), 1) or not values


# --- the agent reads only what the service does not serve, each failure once, and can be turned off -----------

JOB = textwrap.dedent("""
    import os, sys, time
    ready = sys.argv[1]
    import libtpu  # as a TPU job does (jax's TPU backend imports it)
    import jax
    jax.numpy.ones(4).block_until_ready()
    import tpu_tools.agent as agent
    agent.start(tag="health")
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(ready + ".stop"):
        time.sleep(0.05)
""")


def _job(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    script, ready = tmp_path / "job.py", tmp_path / "ready"
    script.write_text(JOB)
    process = subprocess.Popen([sys.executable, str(script), str(ready)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.STDOUT)
    wait_for(lambda: ready.exists() and ready.read_text() or process.poll() is not None, 60)
    assert process.poll() is None, "the job did not start"
    return process, ready


def test_the_agent_asks_the_sdk_only_for_in_job_metrics_and_a_failed_one_once(rundir, tmp_path):
    calls = tmp_path / "calls"
    env = agent_env(rundir, PYTHONPATH=str(FAKE_LIBTPU), FAKE_TPU_SDK_CALLS=str(calls), JAX_PLATFORMS="cpu")
    process, _ = _job(tmp_path, env)
    try:
        documents = [json.loads(run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir)).stdout)
                     for _ in range(2)]
        # The SDK is read at most once a second, whoever asks: readers that keep asking see it read again.
        wait_for(lambda: run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir)).returncode == 0
                 and calls.read_text().split().count("tensorcore_util") >= 2, 60)
        listed = run_tool("tpu-ls", "--metric", "ici_link_health", "--metric", "tpu_throttle_score", "--json",
                          env=agent_env(rundir))
        table = run_tool("tpu-ls", "--metric", "ici_link_health", env=agent_env(rundir))
    finally:
        process.kill()
        process.wait(10)
    asked = calls.read_text().split()
    assert sorted(set(asked)) == ["hbm_util", "ici_link_health", "tensorcore_util", "tpu_throttle_score"]
    # read again and again (at most once a second, whoever asks); the failed one: once
    assert asked.count("hbm_util") == 1
    assert asked.count("tensorcore_util") >= 2
    (agent,) = documents[-1]["processes"]["agents"]
    health = agent["tpu_sdk"]["health"]
    assert [(link["location"], link["score"]) for link in health["ici_links"]] == [
        ("tray1.chip0.ici0.int", 0), ("tray1.chip0.ici1.int", 10), ("tray1.chip1.ici0.int", 7)]
    assert [(t["device"], t["throttled_percent"]) for t in health["throttle"]] == [(0, 0), (1, 10), (2, 0), (3, 60)]
    assert health["problems"] == []
    links, throttle = json.loads(listed.stdout)["metrics"]  # tpu-ls: the job-held chips' links and devices
    assert [(r["pid"], r["location"], r["score"], r["state"]) for r in links["rows"]][1] == (
        process.pid, "tray1.chip0.ici1.int", 10, "unusable")
    assert [(r["device"], r["throttled_percent"]) for r in throttle["rows"]] == [(0, 0), (1, 10), (2, 0), (3, 60)]
    assert table.returncode == 0
    assert "tray1.chip0.ici1.int" in table.stdout
    assert "unusable" in table.stdout


def test_an_sdk_that_hangs_costs_the_monitors_only_freshness(rundir, tmp_path):
    hang = tmp_path / "hang"
    hang.touch()
    env = agent_env(rundir, PYTHONPATH=str(FAKE_LIBTPU), FAKE_TPU_SDK_HANG=str(hang), JAX_PLATFORMS="cpu")
    process, _ = _job(tmp_path, env)

    def agent_sdk() -> dict:
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
        (agent,) = json.loads(result.stdout)["processes"]["agents"]
        assert agent["error"] is None, agent  # answered within the monitor's deadline, the SDK hung or not
        return agent["tpu_sdk"]

    try:
        for _ in range(2):
            hung = agent_sdk()
            assert hung["status"].startswith("libtpu's SDK has not answered its first read yet"), hung
            assert not hung["metrics"]
            assert hung["tensorcore_utilization_percent"] is None
        hang.unlink()
        answered: list[dict] = []
        wait_for(lambda: answered.append(agent_sdk()) or answered[-1]["status"] == "ok", 60)
        assert answered[-1]["tensorcore_utilization_percent"] == [91.5, 88.0, 0.0, 47.25]
        assert answered[-1]["read_age_s"] >= 0
        assert process.poll() is None
    finally:
        process.kill()
        process.wait(10)


def test_the_switch_turns_sdk_reads_off(rundir, tmp_path):
    calls = tmp_path / "calls"
    env = agent_env(rundir, PYTHONPATH=str(FAKE_LIBTPU), FAKE_TPU_SDK_CALLS=str(calls), JAX_PLATFORMS="cpu",
                    TPU_TOOLS_AGENT_SDK="0")
    process, _ = _job(tmp_path, env)
    try:
        document = json.loads(run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir)).stdout)
    finally:
        process.kill()
        process.wait(10)
    (agent,) = document["processes"]["agents"]
    assert agent["tpu_sdk"]["status"] == "SDK reads turned off (TPU_TOOLS_AGENT_SDK=0)"
    assert not calls.exists()


# --- the real libtpu in a job, beside a service whose answers abort libtpu's own client ------------------------

DRIVER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    fixture, job, ready, monitor = sys.argv[1:5]
    server = subprocess.Popen([sys.executable, {sdk!r}, "serve", fixture], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "serving"
    process = subprocess.Popen([sys.executable, job, ready], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 90
    while not (os.path.exists(ready) and open(ready).read()) and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    def read():
        return subprocess.run([monitor, "--count", "1"], capture_output=True, text=True, timeout=120)

    def sdk_status(result):
        try:
            return json.loads(result.stdout)["processes"]["agents"][0]["tpu_sdk"]["status"]
        except (ValueError, LookupError, TypeError):
            return None

    deadline = time.time() + 60  # until the agent's first SDK read (in its reader thread) has finished
    while sdk_status(read()) != "ok" and time.time() < deadline:
        time.sleep(0.2)
    reads = [read() for _ in range(2)]
    print(json.dumps({{"job_alive": process.poll() is None, "job_exit": process.poll(),
                      "reads": [(r.returncode, r.stdout, r.stderr[-2000:]) for r in reads]}}))
    process.kill()
    server.stdin.close()
""")


def test_a_job_with_the_real_libtpu_lives_beside_a_service_that_aborts_the_sdk(rundir, tmp_path):
    """The odd-shapes service makes libtpu's client abort on hlo_execution_timing (test_libtpu_oracle shows it);
    the agent never asks the SDK for a served metric, so the job and its agent live through every read."""
    libtpu_sdk.require()
    import pickle

    from libtpu_server import HOSTILE_FIXTURES

    fixture = tmp_path / "fixture.pickle"
    fixture.write_bytes(pickle.dumps(HOSTILE_FIXTURES["odd-shapes"]()))
    (tmp_path / "job.py").write_text(JOB)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(sdk=str(TESTS / "libtpu_sdk.py")))
    monitor = str(Path(sys.executable).parent / "tpu-monitor")
    # In its own network namespace 8431 is the fixture's: tpu-tools reads it there, as libtpu's client does.
    env = {**agent_env(rundir), **libtpu_sdk.sdk_env(TPU_LOG_DIR=str(tmp_path),
                                                     TPU_TOOLS_LIBTPU_DEFAULT_ADDR="localhost:8431")}
    result = subprocess.run(libtpu_sdk.in_namespace([sys.executable, str(driver), str(fixture),
                                                     str(tmp_path / "job.py"), str(tmp_path / "ready"), monitor]),
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["job_alive"], outcome
    for code, stdout, stderr in outcome["reads"]:
        assert code == 0, stderr
        document = json.loads(stdout)
        (agent,) = document["processes"]["agents"]
        assert agent["error"] is None, agent
        assert agent["tpu_sdk"]["status"] == "ok", agent
        assert set(agent["tpu_sdk"]["metrics"]) | set(agent["tpu_sdk"]["unreadable"]) <= {
            "tensorcore_util", "hbm_util", "ici_link_health", "tpu_throttle_score"}
        (service,) = [s for s in document["libtpu"]["services"] if s["address"] == "localhost:8431"]
        assert service["error"] is None, service
        assert service["devices"], service  # tpu-tools read the same service


# --- tpu-dump show names what needs a look --------------------------------------------------------------------

def test_tpu_dump_show_names_unusable_links_throttled_devices_and_unreadable_values(tmp_path):
    from dump_fixtures import file_member, tar_gz

    snapshot = {"schema": "tpu-tools/agent/v1", "pid": 41, "tag": "train", "tpu_sdk": {"status": "ok", "metrics": {
        "ici_link_health": {"values": ["tray1.chip0.ici0.int: 0", "tray1.chip3.ici1.int: 10",
                                       "tray1.chip2.ici0.int: 3", "warp.drive: 1"]},
        "tpu_throttle_score": {"values": ["0-0", "1-7", "2-NaN"]}}}}
    agents = {"agents": [{"pid": 41, "tag": "train", "socket": "/run/x", "snapshot": snapshot, "error": None}]}
    path = tmp_path / "bundle.tar.gz"
    path.write_bytes(tar_gz([file_member("b/manifest.json", json.dumps({"schema": "tpu-tools/dump/v1"}).encode()),
                             file_member("b/accelerators/agents.json", json.dumps(agents).encode())]))
    document = json.loads(run_tool("tpu-dump", "show", "--json", str(path)).stdout)
    health = [w["message"] for w in document["warnings"] if w["kind"] == "tpu_health"]
    assert health == [
        "process 41 (train): ICI link tray1.chip3.ici1.int is at 10 of 10 (unusable)",
        "process 41 (train): ICI link tray1.chip2.ici0.int is at 3 of 10 (transient problem)",
        "process 41 (train): TPU device 1 is throttled by 70 %",
        "process 41 (train): health value not read: ici_link_health: unknown link name 'warp.drive'",
        "process 41 (train): health value not read: tpu_throttle_score device 2: score 'NaN' is not an integer 0..10"]
    text = run_tool("tpu-dump", "show", str(path))
    assert text.returncode == 0
    assert "tray1.chip3.ici1.int is at 10 of 10 (unusable)" in text.stdout


# --- tpu-top: a health column where an agent read it, a link at 10 stands out ----------------------------------

def test_tpu_top_shows_a_health_column_and_an_unusable_link_stands_out():
    from tpu_tools.metrics.tpuhealth import health_from_sdk
    from tpu_tools.top.frame import frame_text, render
    from tpu_tools.top.model import ViewState

    def agent(pid: int, tag: str, links: list[str], throttle: list[str]) -> dict:
        health = health_from_sdk({"ici_link_health": {"values": links}, "tpu_throttle_score": {"values": throttle}})
        return {"pid": pid, "tag": tag, "user": "ann", "command": "python train.py", "error": None,
                "tpu_sdk": {"status": "ok", "health": health.to_dict() if health else None}}

    report = {"processes": {"agents": [agent(11, "broken", ["tray1.chip0.ici0.int: 10"], ["0-0"]),
                                       agent(12, "slow", ["tray1.chip0.ici0.int: 0"], ["0-6"]),
                                       agent(13, "fine", ["tray1.chip0.ici0.int: 0"], ["0-0"])]}}
    # not interactive: no selected row painted over the styles
    lines = render(as_report(report), ViewState(), 120, 40, interactive=False)
    text = frame_text(lines)
    assert "HEALTH" in text
    row = {line.text.split()[0]: line for line in lines if "python train.py" in line.text}
    (unusable,) = [s for s in row["11"].segments if s.text.strip() == "ICI 10"]
    (throttled,) = [s for s in row["12"].segments if s.text.strip() == "thr60%"]
    (fine,) = [s for s in row["13"].segments if s.text.strip() == "ok"]
    assert unusable.style != fine.style
    assert throttled.style not in (unusable.style, fine.style)
    no_sdk = as_report({"processes": {"agents": [{**agent(14, "x", [], []), "tpu_sdk": {}}]}})
    assert "HEALTH" not in frame_text(render(no_sdk, ViewState(), 120, 40))
    job = frame_text(render(as_report(report), ViewState(job_key="11"), 120, 40))  # Enter: links, worst first
    assert "TPU health  1 ICI links, 1 devices" in job
    assert "ICI link tray1.chip0.ici0.int is at 10 of 10 (unusable)" in job
    assert "all healthy, none throttled" in frame_text(render(as_report(report), ViewState(job_key="13"), 120, 40))
