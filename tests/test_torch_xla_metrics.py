"""`tpu_tools.agent.metric(name, xla_tensor, scope="global")` in a torch_xla job: taken without a compile or a
CPU fallback of the agent's, and proven global (or not) from the tensor's own graph.

The real job runs SPMD over 4 CPU devices (`CPU_NUM_DEVICES=4`, one process: torch_xla 2.9's multi-process
collectives hang on the CPU platform, so the one-process-per-device case is checked on its graph text alone).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import torch_xla_env
from agentjobs import agent_env, make_rundir, remove_rundir
from conftest import run_tool

from tpu_tools.agent.xlametrics import graph_proof

SPMD_JOB = textwrap.dedent("""
    import numpy as np, torch, torch_xla
    import torch_xla.runtime as xr
    import torch_xla.debug.metrics as met
    import tpu_tools.agent as agent
    xr.use_spmd()
    import torch_xla.distributed.spmd as xs
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n, 1), ("data", "model"))
    device = torch_xla.device()
    w = torch.ones(8, 1).to(device)
    x = torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8).to(device)
    xs.mark_sharding(x, mesh, ("data", None))
    for step in range(3):
        loss = ((x @ w) ** 2).mean()  # over the whole batch: the partitioner reduces over every device
        # each device's own rows, summed apart (manual sharding), then the first device's sum: one shard's view
        manual = xs.enable_manual_sharding(x, ("data", None), mesh=mesh).global_tensor
        per_shard = xs.disable_manual_sharding(manual.sum(dim=(0, 1), keepdim=True), ("data", None),
                                               torch.Size([n, 1]), mesh=mesh).global_tensor
        shard_sum = per_shard[0, 0]
        agent.metric("loss", loss, scope="global")
        agent.metric("first_shard_sum", shard_sum, scope="global")
        torch_xla.sync()
    print("fallbacks", met.executed_fallback_ops())
""")


def test_spmd_metrics_are_taken_at_the_sync_and_a_shards_view_is_flagged() -> None:
    python = torch_xla_env.require()
    rundir = make_rundir()
    try:
        script = rundir / "spmd.py"
        script.write_text(SPMD_JOB)
        env = torch_xla_env.job_env(4, TPU_TOOLS_RUNTIME_DIR=str(rundir))
        ran = subprocess.run([str(python), "-m", "tpu_tools.agent", "--tag", "spmd", str(script)], env=env,
                             capture_output=True, text=True, timeout=600)
        result = run_tool("tpu-monitor", "--jobs-ended", env=agent_env(rundir))
    finally:
        remove_rundir(rundir)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "fallbacks []" in ran.stdout  # the agent read the metrics with no CPU fallback (no .item())
    [record] = json.loads(result.stdout)["jobs"]
    assert record["frontend"] == "torch_xla"
    assert record["jax_version"] is None  # jax came with mark_sharding
    assert record["compile_count"] == 1
    assert record["recompile_count"] == 0  # the metrics compiled nothing apart
    values = {metric["name"]: metric for metric in record["metrics"]["values"]}
    loss = values["loss"]
    rows = [[float(8 * r + c) for c in range(8)] for r in range(16)]  # x
    assert loss["value"] == sum(sum(row) ** 2 for row in rows) / 16
    assert (loss["kind"], loss["devices"], loss["job_devices"], loss["suspect"]) == ("replicated", 4, 4, None)
    assert loss["step"] == 2
    shard = values["first_shard_sum"]
    assert shard["value"] == sum(sum(row) for row in rows[:4])
    assert (shard["kind"], shard["devices"]) == ("local", 1)
    assert "no all-reduce over the job's 4 devices" in shard["suspect"]


ALL_REDUCED = """IR {
  %0 = f32[] xla::device_data(), xla_shape=f32[]
  %1 = f32[4]{0} xla::device_data(), xla_shape=f32[4]{0}
  %2 = f32[] aten::sum(%1), xla_shape=f32[]
  %3 = (f32[], f32[]) xla::cross_replica_sum(%2, %0), num_outputs=2, xla_shape=(f32[], f32[]), ROOT=0
}
"""
LOCAL = """IR {
  %0 = f32[4]{0} xla::device_data(), xla_shape=f32[4]{0}
  %1 = f32[] aten::sum(%0), xla_shape=f32[], ROOT=0
}
"""
RAN = """IR {
  %0 = f32[] xla::device_data(), xla_shape=f32[], ROOT=0
}
"""


def test_one_process_per_device_needs_an_all_reduce_over_every_replica_in_the_graph() -> None:
    assert graph_proof(ALL_REDUCED, spmd=False, job_devices=8) == ("replicated", 8, None)
    grouped = ALL_REDUCED.replace("num_outputs=2", "groups=((0,1),(2,3)), num_outputs=2")
    assert graph_proof(grouped, spmd=False, job_devices=4) == ("local", 1, None)
    assert graph_proof(LOCAL, spmd=False, job_devices=8) == ("local", 1, None)
    kind, _, why = graph_proof(RAN, spmd=False, job_devices=8)
    assert kind == "local"
    assert why is not None
    assert why.startswith("unproven")
    assert graph_proof(LOCAL, spmd=False, job_devices=1) == ("replicated", 1, None)  # nothing to reduce


def test_the_ir_read_here_is_torch_xlas_own(tmp_path: Path) -> None:
    """The all-reduce the proof looks for is what xm.all_reduce puts in the graph (XLA_ALWAYS_ALLREDUCE=1 makes
    a one-process job build it)."""
    python = torch_xla_env.require()
    probe = ("import torch, torch_xla, torch_xla.core.xla_model as xm\n"
             "from tpu_tools.agent.xlametrics import graph_proof\n"
             "x = torch.ones(4, device=torch_xla.device()).sum()\n"
             "reduced = xm.all_reduce(xm.REDUCE_SUM, x)\n"
             "print(graph_proof(torch_xla._XLAC._get_xla_tensors_text([reduced]), False, 8))\n"
             "print(graph_proof(torch_xla._XLAC._get_xla_tensors_text([x]), False, 8))\n")
    ran = subprocess.run([str(python), "-c", probe], env=torch_xla_env.job_env(XLA_ALWAYS_ALLREDUCE="1"),
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["('replicated', 8, None)", "('local', 1, None)"]
