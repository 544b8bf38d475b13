#!/usr/bin/env python3
"""What the agent costs a PyTorch/XLA training job while a monitor polls it 10 times a second.

The same measurement as `agent_overhead.py` (blocks of steps in ABBA order, with the agent and without, a
`tpu-monitor --period 0.1` polling throughout, the median step time of all agent steps over that of all
no-agent steps; target <= 1.01), on a torch_xla job: an MLP of the same size (forward, loss, backward, SGD) on
the CPU platform (`PJRT_DEVICE=CPU`), each step ended by `torch_xla.sync(wait=True)`. With the agent, its server
answers the monitor and the step boundary is the agent's wrapped `torch_xla.sync` (it looks for new compiles
around the real sync and marks the step); without it, the job calls torch_xla's own `sync` and no server runs.
`--with-metric` also reports the loss through `tpu_tools.agent.metric` every agent step (taken at the next
sync: one device-to-host copy of one number).

    python benchmarks/agent_overhead_torch_xla.py [--python PATH] [--processes 3] [--blocks 120] [--steps 10]
        [--no-monitor | --ping-only] [--with-metric]

--python: the interpreter with torch and torch_xla 2.9.0 (default: $TPU_TOOLS_TEST_TORCH_XLA_PYTHON, else the
environment tools/test.sh makes under ~/.cache/tpu-tools).
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from agent_overhead import HARNESS, PREAMBLE, main

TORCH_XLA_STEP = textwrap.dedent("""
    import os
    with_metric = os.environ.get("BENCH_WITH_METRIC") == "1"
    import torch, torch_xla
    import tpu_tools.agent as agent
    from tpu_tools.metrics import wire

    plain_sync = torch_xla.sync  # torch_xla's own, before the agent wraps it
    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024),
                                torch.nn.Tanh(), torch.nn.Linear(1024, 64)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512).to(device), torch.randn(256, 64).to(device)

    def train_step(sync):
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        sync(wait=True)
        return loss

    for _ in range(10):  # compile and warm up
        train_step(plain_sync)

    def one_step(on):
        # with the agent, its wrapped sync is the step boundary; without it, torch_xla's own
        loss = train_step(torch_xla.sync if on else plain_sync)
        if on and with_metric:
            agent.metric("loss", loss)
""")


def default_python() -> str:
    named = os.environ.get("TPU_TOOLS_TEST_TORCH_XLA_PYTHON")
    if named:
        return named
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(cache / "tpu-tools" / f"torch-xla-2.9.0-cp{sys.version_info.major}{sys.version_info.minor}" / "bin"
               / "python")


if __name__ == "__main__":
    with_metric = "--with-metric" in sys.argv
    if with_metric:
        sys.argv.remove("--with-metric")
    repo = str(Path(__file__).resolve().parent.parent)
    sys.exit(main(PREAMBLE + TORCH_XLA_STEP + HARNESS, __doc__.splitlines()[0], default_python(),
                  {"PJRT_DEVICE": "CPU", "PYTHONPATH": repo, "BENCH_WITH_METRIC": "1" if with_metric else "0"}))
