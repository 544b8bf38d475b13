"""Is a "global" metric global? Real processes joined by jax.distributed on 127.0.0.1: one worker publishes
its own shard of the per-device losses before the all-reduce, and the agent and tpu-monitor flag it."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import numpy as np
import pytest
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import clean_env, run_tool

from tpu_tools.agent.metrics import MAX_METRICS, MetricStore
from tpu_tools.metrics.global_check import global_metric_findings
from tpu_tools.metrics.records.jobs import AgentEntry

WORKER = textwrap.dedent("""
    import os, sys, time
    coordinator, process_id, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    import jax, jax.numpy as jnp
    import numpy as np
    import tpu_tools.agent as agent

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=2, process_id=process_id, initialization_timeout=60)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    local = np.array([1.0 + process_id], np.float32)  # each worker's own loss: 1.0 and 2.0
    shard = jax.device_put(local, jax.local_devices()[0])
    per_device = jax.make_array_from_single_device_arrays((2,), sharded, [shard])
    mean = jax.jit(jnp.mean, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))(per_device)
    for _ in range(5):
        agent.step()
    if process_id == 1:
        agent.metric("loss", per_device.addressable_shards[0].data[0], scope="global")  # before the all-reduce
    else:
        agent.metric("loss", mean, scope="global")
    agent.metric("accuracy", mean * 0.5, scope="global")  # reduced on both workers: global indeed
    agent.metric("host_loss", float(local[0]), scope="local")
    open(ready, "w").write("ready")
    time.sleep(90)
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_worker_reading_its_own_shard_is_flagged(rundir, tmp_path):  # noqa: F811
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    coordinator = f"127.0.0.1:{free_port()}"
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), JAX_PLATFORMS="cpu")
    readies = [tmp_path / f"ready{i}" for i in range(2)]
    workers = [subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", "--tag", "dist", str(script), coordinator,
                                 str(i), str(readies[i])], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for i in range(2)]
    try:
        def ready() -> bool:
            for worker in workers:
                if worker.poll() is not None:
                    raise AssertionError(f"worker exited {worker.returncode}: {worker.stdout.read()}")
            return all(path.exists() for path in readies)

        wait_for(ready, timeout=120)

        def published() -> subprocess.CompletedProcess | None:
            # the agents publish what the job did last within a second (docs/agent.md)
            done = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
            agents = json.loads(done.stdout)["processes"]["agents"] if done.returncode == 0 else []
            return done if len(agents) == 2 and all(len(a["metrics"]) == 3 for a in agents) else None

        result = wait_for(published, timeout=30)
    finally:
        # Killed, not terminated: jax.distributed's preemption notifier takes SIGTERM as notice of a preemption to
        # pass on to the other workers, and the worker runs on (each waited out a 10-s timeout before).
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.wait(timeout=30)
            worker.stdout.close()
    assert result.returncode == 0, result.stderr
    group = json.loads(result.stdout)["processes"]
    agents = sorted(group["agents"], key=lambda a: a["process_index"])
    assert [a["process_count"] for a in agents] == [2, 2]
    kinds = [{m["name"]: (m["kind"], m["value"], m["step"]) for m in a["metrics"]} for a in agents]
    assert kinds[0]["loss"] == ("replicated", 1.5, 5)
    assert kinds[1]["loss"] == ("local", 1.0 + 1, 5)
    assert kinds[0]["accuracy"] == kinds[1]["accuracy"] == ("replicated", 0.75, 5)
    assert kinds[1]["host_loss"][0] == "host"
    findings = group["global_metric_findings"]
    assert {(f["name"], f["reason"].split(" ")[0]) for f in findings} == {("loss", "claims"), ("loss", "differs")}
    suspect = next(f for f in findings if f["reason"].startswith("claims"))
    assert suspect["workers"][0]["process_index"] == 1
    assert "lives on 1 of the job's 2 devices" in suspect["reason"]


def test_bad_metrics_are_bounded_and_reported_never_raised():
    store = MetricStore()
    assert not store.record("\x1b[2Jloss", 1.0, "global", 0)
    assert not store.record("loss", "high", None, 0)
    assert not store.record("loss", np.ones(3), None, 0)
    assert not store.record("loss", 1.0, "everywhere", 0)
    assert not store.record("loss", True, None, 0)
    assert store.record("loss", math.nan, None, 1)  # kept; its value is unknown
    for index in range(MAX_METRICS + 10):
        store.record(f"m{index}", index, "local", index)
    assert store.record("loss", 2.0, None, 2)  # a name already kept is updated beyond the bound
    snapshot = store.snapshot()
    assert len(snapshot["values"]) == MAX_METRICS  # the names beyond the bound are not kept
    assert snapshot["rejected"] == 5 + 11
    assert "\x1b" not in (snapshot["last_error"] or "")
    assert next(v for v in snapshot["values"] if v["name"] == "m0")["kind"] == "host"


@pytest.mark.parametrize(("values", "flagged"), [([1.0, 1.0], False), ([1.0, 1.5], True), ([3.0], False)])
def test_workers_of_a_job_are_compared_at_the_same_step(values, flagged):
    agents = [{"pid": 10 + i, "tag": "j", "process_count": len(values), "process_index": i,
               "metrics": [{"name": "loss", "value": v, "step": 7, "scope": "global", "kind": "host"}]}
              for i, v in enumerate(values)]
    agents.append({"pid": 99, "tag": "j", "process_count": len(values), "process_index": 0,
                   "metrics": [{"name": "loss", "value": 9.0, "step": 8, "scope": "global", "kind": "host"}]})
    assert bool(global_metric_findings([msgspec.convert(agent, AgentEntry) for agent in agents])) == flagged


def test_many_metric_names_stay_bounded_in_the_agent_snapshot(tmp_path, rundir):
    from tpu_tools.metrics.jobsummary import read_summaries

    script = Path(tmp_path / "many.py")
    # 100,000 names, 390 times the bound: each call is a traced call under coverage, so a million cost 8 s of CPU
    script.write_text("import tpu_tools.agent as agent\n"
                      "print(sum(agent.metric(f'm{i}', i) for i in range(10**5)))\n")
    # `rundir` is short: a socket path under a long test name would pass AF_UNIX's 108 bytes
    result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", str(script)], capture_output=True, text=True,
                            env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir)), timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == MAX_METRICS
    found, problems = read_summaries(rundir)
    assert len(found) == 1, (problems, result.stderr[-500:])
    [summary] = found  # the job's end summary keeps what the agent served
    assert summary["metrics"]["rejected"] == 10**5 - MAX_METRICS
    assert len(summary["metrics"]["values"]) == MAX_METRICS
    assert "more than 256 metric names" in summary["metrics"]["last_error"]


def _series(instance: str, series: str, value: float, **labels: str):
    from tpu_tools.metrics.fleet.client import Sample

    return Sample({"__name__": f"tpu_tools_{series}", "instance": instance, "job": "tpu-tools", **labels}, value)


def test_the_fleet_view_compares_a_global_metric_between_hosts_and_shows_goodput():
    from tpu_tools.metrics.fleet.records import build_groups

    series = []
    for host, loss, kind in (("w0", 2.5, "replicated"), ("w1", 2.5, "replicated"), ("w2", 2.9, "local")):
        labels = {"pid": "7", "tag": "train", "name": "loss", "scope": "global"}
        series += [_series(host, "process_metric", loss, kind=kind, **labels),
                   _series(host, "process_metric_step", 100, **labels),
                   _series(host, "process_goodput_ratio", 0.8, pid="7", tag="train", window="recent"),
                   _series(host, "process_goodput_seconds_total", 40.0, pid="7", tag="train", cause="productive")]
    groups = build_groups(series, [])
    [finding] = groups["processes"].global_metric_findings
    assert finding.name == "loss"
    assert finding.reason == "differs between 3 workers at step 100 (2.5 to 2.9)"
    assert {w.host: w.kind for w in finding.workers}["w2"] == "local"
    assert groups["fleet"].global_metric_findings == 1
    assert [h.goodput_percent for h in groups["fleet"].hosts] == [80.0, 80.0, 80.0]
    agent = groups["processes"].agents[0]
    assert agent.goodput.since_start.causes_s == {"productive": 40.0}
