"""Real torch_xla jobs under the agent (`python -m tpu_tools.agent`), on the CPU platform.

`import torch, torch_xla` takes 18 s or more here, so a module starts a job once and its tests share it. The
job writes torch_xla's own figures on request (a file the test creates), so a test compares the agent's
figures with torch_xla's and checks that asking the agent changed none of torch_xla's counters.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import torch_xla_env
from agentjobs import Job, wait_for

# A small MLP: 3 steps at batch 16, then batch 24 (one recompilation at the same line), a `loss.item()`
# after the sync (a CPU fallback, aten::_local_scalar_dense, and no compile), the loss reported to the agent.
# Then it waits (or, with `keep_stepping`, goes on with steps at batch 24): on each `ask-N` file it writes
# torch_xla's counters and metrics to `figures-N.json`; on an `exit` file it ends normally (the job-end record).
MLP_JOB = textwrap.dedent("""
    import json, os, sys, time
    workdir, steps, lifetime, keep_stepping = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
    import torch, torch_xla
    import torch_xla.debug.metrics as met
    import tpu_tools.agent as agent
    if os.environ.get("MLP_JOB_IMPORTS_JAX") == "1":
        import jax  # as torch_xla's SPMD helpers do (xs.mark_sharding): jax loaded, nothing compiled by it

    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(batch):
        x, y = torch.randn(batch, 8).to(device), torch.randn(batch, 1).to(device)
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        return loss

    for index in range(steps):
        loss = train_step(16 if index < 3 else 24)
        if index == 4:
            print("loss", loss.item(), flush=True)
        agent.metric("loss", loss)
        time.sleep(0.01)

    def figures():
        return {"counters": {name: met.counter_value(name) for name in met.counter_names()},
                "metrics": {name: list(met.metric_data(name)[:2]) for name in met.metric_names()},
                "fallbacks": list(met.executed_fallback_ops())}

    open(os.path.join(workdir, "ready"), "w").write(str(os.getpid()))
    deadline, answered = time.time() + lifetime, 0
    while time.time() < deadline and not os.path.exists(os.path.join(workdir, "exit")):
        if keep_stepping:
            loss = train_step(24)
            agent.metric("loss", loss)
        ask = os.path.join(workdir, f"ask-{answered}")
        if os.path.exists(ask):
            partial = os.path.join(workdir, f".figures-{answered}")
            with open(partial, "w") as out:
                json.dump(figures(), out)
            os.replace(partial, os.path.join(workdir, f"figures-{answered}.json"))
            answered += 1
        time.sleep(0.02)
""")


class TorchXlaJob(Job):
    """A torch_xla job; `figures()` asks it for torch_xla's own counters and metrics."""

    asked = 0

    def figures(self, timeout: float = 60.0) -> dict[str, Any]:
        index = self.asked
        self.asked += 1
        (self.workdir / f"ask-{index}").write_text("")
        answer = self.workdir / f"figures-{index}.json"
        wait_for(answer.exists, timeout=timeout, interval=0.05)
        figures: dict[str, Any] = json.loads(answer.read_text())
        return figures

    def end(self, timeout: float = 120.0) -> int:
        """Ask the job to end normally (it leaves its job-end record); its exit status."""
        (self.workdir / "exit").write_text("")
        return self.process.wait(timeout=timeout)


def start_mlp_job(rundir: Path, *, steps: int = 30, lifetime_s: float = 600.0, options: tuple[str, ...] = (),
                  keep_stepping: bool = False, devices: int = 1, **env: str | None) -> TorchXlaJob:
    python = torch_xla_env.require()
    workdir = Path(tempfile.mkdtemp(prefix="txj", dir="/tmp"))
    script = workdir / "mlp.py"
    script.write_text(MLP_JOB)
    command = [str(python), "-m", "tpu_tools.agent", *options, str(script), str(workdir), str(steps),
               str(lifetime_s), "1" if keep_stepping else "0"]
    process = subprocess.Popen(command, env=torch_xla_env.job_env(devices, TPU_TOOLS_RUNTIME_DIR=str(rundir), **env),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    return TorchXlaJob(process, workdir / "ready", workdir)


def started(job: TorchXlaJob, timeout: float = 300.0) -> TorchXlaJob:
    """The job once ready; its import alone takes 18 s or more on a busy host."""
    job.wait_ready(timeout)
    return job


def seconds(metric: list[float]) -> float:
    """A torch_xla metric's accumulator (nanoseconds), in seconds."""
    return float(metric[1]) * 1e-9

