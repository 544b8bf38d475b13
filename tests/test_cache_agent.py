"""A job's compilation cache as the agent sees it: real JAX caches on the CPU platform, real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from agentjobs import agent_env, make_rundir, remove_rundir
from cachejobs import AGENT_CACHE_JOB, run_cache_job
from conftest import clean_env, run_tool

from tpu_tools.metrics.cacheshare import cache_metrics, shared_cache_dirs, take_fleet_sample
from tpu_tools.metrics.fleet.client import Sample
from tpu_tools.metrics.fleet.records import build_groups
from tpu_tools.metrics.records.jobs import AgentEntry, ProcessesGroup
from tpu_tools.metrics.records.report import waiting_report
from tpu_tools.top.cacheview import cache_section, shared_cache_lines


def _step_misses(snapshot: dict) -> list[dict]:
    return [m for m in snapshot["recent_misses"] if m["module"] == "jit_step"]


@pytest.mark.budget(20)  # three runs of a JAX job, one after another
def test_hits_misses_writes_a_shape_change_and_an_xla_flag_explained(tmp_path: Path) -> None:
    # Three runs of the job on one directory (not copies of it: the directory's path reaches the compile options
    # in the key, so a copy at another path would miss).
    cache = tmp_path / "cache"
    first = run_cache_job(tmp_path, cache, "3", name="first")
    assert first["dir_in_use"] == str(cache)
    assert first["hits"] == 0
    assert first["misses"] >= 1
    assert first["entries_written"] >= 1
    assert first["key_records_written"] >= 1
    assert first["lookups"] == first["hits"] + first["misses"]
    assert "no entry of this module" in _step_misses(first)[0]["explanation"]
    again = run_cache_job(tmp_path, cache, "3,5", name="again")
    assert again["hits"] >= 1  # size 3 is served from the cache
    miss = _step_misses(again)[-1]  # size 5 is not: only the program differs from the nearest entry
    assert miss["differing"] == ["computation"], miss
    assert "the program itself" in miss["explanation"]
    assert again["set_too_late"] == []
    # A miss caused by an XLA flag names the flag: the nearest entry is size 3 without it (size 5's entry
    # differs in the program too).
    flagged = run_cache_job(tmp_path, cache, "3", name="flagged",
                            env=clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_cpu_enable_fast_math=true"))
    miss = _step_misses(flagged)[-1]
    assert "XLA flags" in miss["differing"], miss
    assert "computation" not in miss["differing"], miss
    assert "now also --xla_cpu_enable_fast_math=true" in miss["explanation"]


def test_settings_changed_after_the_first_compile_are_set_too_late(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    snapshot = run_cache_job(tmp_path, cache, "3", late="6")
    late = {s["setting"]: s for s in snapshot["set_too_late"]}
    assert set(late) == {"XLA_FLAGS", "jax_compilation_cache_dir"}
    assert all("set too late: no effect" in s["message"] for s in late.values())
    assert late["jax_compilation_cache_dir"]["in_effect"] == str(cache)
    assert snapshot["dir_in_use"] == str(cache)
    assert not Path(f"{cache}-elsewhere").exists()  # the late directory was never used
    # the late XLA_FLAGS still changed the key of the later compile: a miss the flag explains
    assert any("XLA flags" in m["differing"] for m in _step_misses(snapshot))


def _start_agent_job(workdir: Path, rundir: Path, cache: Path, size: int, tag: str) -> tuple[subprocess.Popen, Path]:
    script = workdir / "agent_cache_job.py"
    script.write_text(AGENT_CACHE_JOB)
    ready = workdir / f"ready-{tag}"
    command = [sys.executable, "-m", "tpu_tools.agent", "--tag", tag, str(script), str(cache), str(ready),
               str(workdir / "stop"), str(size)]
    process = subprocess.Popen(command, env=agent_env(rundir, JAX_PLATFORMS="cpu"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    return process, ready


def test_two_jobs_writing_one_directory_are_flagged_with_their_figures(tmp_path: Path) -> None:
    rundir = make_rundir()
    cache = tmp_path / "shared"
    jobs = []
    try:
        jobs = [_start_agent_job(tmp_path, rundir, cache, size, tag) for size, tag in ((3, "one"), (4, "two"))]
        deadline = time.monotonic() + 180
        while not all(ready.exists() and ready.read_text() for _, ready in jobs):
            assert all(p.poll() is None for p, _ in jobs), [p.stderr.read() for p, _ in jobs if p.stderr]
            assert time.monotonic() < deadline, "the jobs did not compile in time"
            time.sleep(0.1)
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir), timeout=120)
        assert result.returncode == 0, result.stderr
        processes = json.loads(result.stdout.splitlines()[0])["processes"]
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        doctor = run_tool("tpu-profile", "cache", "doctor", str(elsewhere), "--json", env=agent_env(rundir))
        differing = [f for f in json.loads(doctor.stdout)["findings"] if f["code"] == "job_differs"]
        top = run_tool("tpu-top", "--once", env=agent_env(rundir, COLUMNS="250", LINES="60"), timeout=120)
    finally:
        (tmp_path / "stop").write_text("")
        for process, _ in jobs:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr:
                process.stderr.close()
        remove_rundir(rundir)
    agents = {a["tag"]: a for a in processes["agents"]}
    pids = sorted(p.pid for p, _ in jobs)
    for agent in agents.values():
        cache_figures = agent["compilation_cache"]
        assert cache_figures["dir_in_use"] == str(cache)
        assert cache_figures["entries_written"] >= 1
    shared = processes["shared_cache_dirs"]
    assert len(shared) == 1
    assert shared[0]["dir"] == str(cache)
    assert sorted(w["pid"] for w in shared[0]["writers"]) == pids
    assert all(str(pid) in shared[0]["message"] for pid in pids)
    # tpu-top flags the directory above its panels
    assert top.returncode == 0, top.stderr
    assert f"compilation cache {cache} is written by 2 processes" in top.stdout
    # doctor names the running jobs that use another directory than the one checked
    assert len(differing) == 2
    assert all(str(cache) in f["message"] for f in differing)
    # Prometheus: the figures per job, labelled by directory, and the shared directory's writer count
    families = {f.name: f for f in cache_metrics(msgspec.convert(processes, ProcessesGroup))}
    written = families["tpu_tools_process_compilation_cache_entries_written"].samples
    assert {s.labels["cache_dir"] for s in written} == {str(cache)}
    assert len(written) == 2
    assert families["tpu_tools_compilation_cache_writers"].samples[0].value == 2
    # tpu-top's job screen
    text = "\n".join(line.text for line in cache_section(msgspec.convert(agents["one"], AgentEntry), 100))
    assert str(cache) in text
    assert "entries written" in text
    assert "miss" in text
    # the key records beside the entries name both writers too
    inspected = run_tool("tpu-profile", "cache", "inspect", str(cache), "--json")
    assert inspected.returncode == 0, inspected.stderr
    writers = json.loads(inspected.stdout)["writers"]
    assert all(any(f":{pid} " in w for w in writers) for pid in pids), writers


def test_the_fleet_view_flags_one_directory_written_from_two_hosts() -> None:
    series = []
    for host, pid in (("node-1:9100", "10"), ("node-2:9100", "20")):
        labels = {"instance": host, "job": "tpu-tools", "pid": pid, "tag": "train", "cache_dir": "/mnt/shared/jax"}
        series += [Sample({"__name__": "tpu_tools_agent_up", **labels}, 1.0),
                   Sample({"__name__": "tpu_tools_process_compilation_cache_entries_written_total", **labels}, 4.0),
                   Sample({"__name__": "tpu_tools_process_compilation_cache_hits_total", **labels}, 2.0)]
    groups = build_groups(series, [])
    (found,) = groups["processes"].shared_cache_dirs
    assert found.hosts == ["node-1:9100", "node-2:9100"]
    assert "on 2 hosts" in found.message
    (line,) = shared_cache_lines(msgspec.structs.replace(waiting_report(), processes=groups["processes"]), 300)
    assert "node-1:9100:10 (train)" in line.text
    assert "node-2:9100:20 (train)" in line.text
    agents = []
    for host, pid in (("node-1", 10), ("node-2", 20)):
        agent = {"pid": pid, "tag": "train", "host": host}
        labels = {"pid": str(pid), "tag": "train", "cache_dir": "/mnt/shared/jax"}
        assert take_fleet_sample(agent, "compilation_cache_entries_written_total", labels, 3.0)
        assert take_fleet_sample(agent, "compilation_cache_hits_total", labels, 1.0)
        agents.append(agent)
    assert not take_fleet_sample({}, "steps_total", {}, 1.0)
    (found,) = shared_cache_dirs([msgspec.convert(agent, AgentEntry) for agent in agents])
    assert found.hosts == ["node-1", "node-2"]
    assert "on 2 hosts" in found.message
    assert "node-1:10" in found.message
    assert "node-2:20" in found.message
    # a directory one process writes and others only read is the safe pattern: not flagged
    agents[1]["compilation_cache"]["entries_written"] = 0
    assert shared_cache_dirs([msgspec.convert(agent, AgentEntry) for agent in agents]) == []
