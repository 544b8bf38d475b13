"""MFU of a PyTorch/XLA job. torch_xla 2.9 exposes no cost analysis of the graphs it compiles (nothing in
`torch_xla._XLAC` nor in `torch_xla.debug.metrics` gives FLOPs), so a torch_xla job's MFU comes from the work
it gives with `tpu_tools.agent.step(flops=)`, over the peak (given here: the CPU platform has no device table).
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import torch_xla_env

FLOPS = 2 * 16 * 8 * 4 * 3  # the job's own count for one step (a matmul forward and two backward), as a user gives it
PEAK = 1e9
STEPS = 6
JOB = textwrap.dedent(f"""
    import json, sys, torch, torch_xla
    import tpu_tools.agent as agent
    X = torch_xla._XLAC
    print("cost analysis:", [n for n in dir(X) if "cost" in n.lower() or "flop" in n.lower()], flush=True)
    device = torch_xla.device()
    model = torch.nn.Linear(8, 4).to(device)
    for _ in range({STEPS}):
        model(torch.randn(16, 8).to(device)).pow(2).mean().backward()
        torch_xla.sync()
        agent.step(flops={FLOPS})
    json.dump(agent.goodput(), open(sys.argv[1], "w"))
""")


@pytest.mark.budget(60)  # one torch_xla job: `import torch, torch_xla` alone takes 18 s or more here
def test_a_torch_xla_jobs_mfu_comes_from_the_flops_it_gives(tmp_path) -> None:
    python = torch_xla_env.require()
    (tmp_path / "job.py").write_text(JOB)
    done = subprocess.run([str(python), "-m", "tpu_tools.agent", str(tmp_path / "job.py"), str(tmp_path / "out.json")],
                          env=torch_xla_env.job_env(TPU_TOOLS_PEAK_FLOPS=str(PEAK),
                                                    TPU_TOOLS_RUNTIME_DIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cost analysis: []" in done.stdout  # none to read: the step's figure is the only source
    figures = json.loads((tmp_path / "out.json").read_text())
    since = figures["since_start"]
    assert since["flops"] == STEPS * FLOPS
    assert (figures["peak_flops_per_s"], figures["peak_source"]) == (PEAK, "given")
    assert since["mfu_percent"] == pytest.approx(100 * since["flops"] / since["wall_s"] / PEAK)
    assert since["mfu_percent"] > 0
