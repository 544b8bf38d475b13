"""A torch_xla job under the agent: its figures are torch_xla's own, and reading them costs it nothing.

One real job (PyTorch/XLA 2.9 on the CPU platform) is shared by the module: 3 steps at batch 16, then batch 24
(one recompilation at the same line), `loss.item()` once after a sync (a CPU fallback), jax imported beside it
as torch_xla's SPMD helpers do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agentjobs import make_rundir, remove_rundir
from torch_xla_jobs import MLP_JOB, TorchXlaJob, seconds, start_mlp_job, started

from tpu_tools.metrics.agent_client import query_agent

STEPS = 30
SYNC_LINE = MLP_JOB.splitlines().index("    torch_xla.sync()") + 1


@pytest.fixture(scope="module")
def mlp() -> Iterator[tuple[TorchXlaJob, Any]]:
    rundir = make_rundir()
    job = start_mlp_job(rundir, steps=STEPS, MLP_JOB_IMPORTS_JAX="1")
    try:
        yield started(job), rundir
    finally:
        job.stop()
        remove_rundir(rundir)


def ask(mlp: tuple[TorchXlaJob, Any]) -> dict[str, Any]:
    job, rundir = mlp
    snapshot: dict[str, Any] = query_agent(job.pid, directory=rundir, timeout_s=10.0)
    assert snapshot.get("error") is None, snapshot
    return snapshot


def test_the_job_is_named_a_torch_xla_job_though_jax_is_loaded(mlp: tuple[TorchXlaJob, Any]) -> None:
    snapshot = ask(mlp)
    assert (snapshot["frontend"], snapshot["frontend_version"], snapshot["jax_version"]) == ("torch_xla", "2.9.0",
                                                                                             None)
    assert snapshot["runtime"]["platform"] == "cpu"
    assert snapshot["startup"] == []  # PJRT_DEVICE=CPU before the import, nothing set late


def test_compiles_are_torch_xlas_own_with_the_recompile_at_its_line(mlp: tuple[TorchXlaJob, Any]) -> None:
    job, _ = mlp
    own = job.figures()
    compiles = ask(mlp)["compiles"]
    assert own["counters"]["UncachedCompile"] == compiles["compile_count"] == 2
    assert compiles["recompile_count"] == 1
    assert compiles["backend_compile_time_s"] == pytest.approx(seconds(own["metrics"]["CompileTime"]), rel=0.05)
    assert compiles["in_memory_cache_hits"] == own["counters"]["CachedCompile"]
    [function] = compiles["functions"]
    assert function["name"].startswith("train_step (")
    assert function["name"].endswith(f"mlp.py:{SYNC_LINE})")
    assert function["compile_count"] == 2
    assert function["recompile_count"] == 1
    [recompile] = compiles["recent_recompiles"]
    assert recompile["function"] == function["name"]
    assert recompile["reason"] is None  # no --explain-recompiles


def test_executions_transfers_and_the_cpu_fallback_by_name(mlp: tuple[TorchXlaJob, Any]) -> None:
    job, _ = mlp
    own = job.figures()
    snapshot = ask(mlp)
    assert snapshot["executions"]["count"] == own["counters"]["ExecuteComputation"] >= STEPS
    assert snapshot["executions"]["time_s"] == pytest.approx(seconds(own["metrics"]["ExecuteTime"]))
    to_device, from_device = snapshot["transfers"]["to_device"], snapshot["transfers"]["from_device"]
    assert to_device["count"] == own["metrics"]["TransferToDeviceTime"][0] > 0
    assert to_device["bytes"] == int(own["metrics"]["OutboundData"][1])
    assert from_device["count"] == own["metrics"]["TransferFromDeviceTime"][0] > 0
    assert from_device["bytes"] == int(own["metrics"]["InboundData"][1])
    fallbacks = snapshot["cpu_fallbacks"]
    assert own["fallbacks"] == ["aten::_local_scalar_dense"]
    assert fallbacks["ops"] == [{"op": "aten::_local_scalar_dense",
                                 "count": own["counters"]["aten::_local_scalar_dense"]}]
    # the job's one loss.item(): the loss it reports every step through agent.metric adds none
    assert fallbacks["total"] == own["counters"]["aten::_local_scalar_dense"] == 1


def test_the_loss_is_taken_at_the_next_sync_without_a_compile(mlp: tuple[TorchXlaJob, Any]) -> None:
    snapshot = ask(mlp)
    [loss] = snapshot["metrics"]["values"]
    assert loss["name"] == "loss"
    assert loss["value"] > 0
    assert loss["kind"] == "replicated"
    # a value is taken at the job's next sync: the last step's waits for one that never comes (the job idles)
    assert loss["step"] == STEPS - 1
    assert snapshot["metrics"]["rejected"] == 0


def test_steps_are_the_syncs_and_compile_time_is_compile_in_goodput(mlp: tuple[TorchXlaJob, Any]) -> None:
    job, _ = mlp
    own = job.figures()
    snapshot = ask(mlp)
    assert snapshot["steps"]["count"] == STEPS == own["counters"]["MarkStep"]
    assert snapshot["steps"]["p50_step_time_s"] > 0
    causes = snapshot["goodput"]["since_start"]["causes_s"]
    # each compile is claimed as compile time; the first one within the start-up before the first step
    assert causes["compile"] == pytest.approx(seconds(own["metrics"]["CompileTime"]), rel=0.05)
    assert causes["startup"] > 0
    assert causes["productive"] > 0


def test_device_memory_is_unknown_on_cpu_never_zero(mlp: tuple[TorchXlaJob, Any]) -> None:
    snapshot = ask(mlp)
    [device] = snapshot["devices"]
    assert device["memory_used_bytes"] is None
    assert device["memory_limit_bytes"] is None
    assert "GetAllocatorStats is not supported" in snapshot["memory_error"]


def test_reading_the_agent_compiles_and_transfers_nothing(mlp: tuple[TorchXlaJob, Any]) -> None:
    job, _ = mlp
    before = job.figures()
    for _ in range(5):
        ask(mlp)
    after = job.figures()
    assert after["counters"] == before["counters"]
    assert after["metrics"] == before["metrics"]
