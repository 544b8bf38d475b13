"""`tpu-profile run` on a real PyTorch/XLA program (torch_xla 2.9, the CPU platform): torch_xla's profiler writes
the trace, torch_xla's CompileTime samples are the compiles, each credited to the line that called
torch_xla.sync. One profiled run is shared by the module (its import alone takes 18 s or more).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch_xla_env

# Two steps at batch 16, two at 24: three graphs (the first step has no gradients yet), all from one line.
PROGRAM = textwrap.dedent("""
    import json, sys, torch, torch_xla
    import torch_xla.debug.metrics as met
    device = torch_xla.device()
    model = torch.nn.Linear(8, 4).to(device)
    def step(batch):
        loss = model(torch.randn(batch, 8).to(device)).pow(2).mean()
        loss.backward()
        torch_xla.sync()
        return loss
    for index in range(4):
        step(16 if index < 2 else 24)
    json.dump({"compiles": met.counter_value("UncachedCompile"), "compile_ns": met.metric_data("CompileTime")[1]},
              open(sys.argv[1], "w"))
""")
SYNC_LINE = PROGRAM.lstrip("\n").splitlines().index("    torch_xla.sync()") + 1


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict[str, Any],
                                                           dict[str, Any], Path]:
    python = torch_xla_env.require()
    folder = tmp_path_factory.mktemp("profiled")
    (folder / "prog.py").write_text(PROGRAM.lstrip("\n"))
    done = subprocess.run([str(python), "-m", "tpu_tools", "profile", "run", "--out", str(folder / "out"), "--",
                           "prog.py", str(folder / "own.json")], cwd=folder, env=torch_xla_env.job_env(),
                          capture_output=True, text=True, timeout=300)
    summary = json.loads((folder / "out" / "summary.json").read_text()) if done.returncode == 0 else {}
    own = json.loads((folder / "own.json").read_text()) if done.returncode == 0 else {}
    return done, summary, own, folder / "out"


def test_the_compiles_are_torch_xlas_at_the_line_that_synced(run) -> None:
    done, summary, own, _ = run
    assert done.returncode == 0, done.stdout + done.stderr
    assert summary["compile_source"] == "torch_xla"
    [row] = summary["compiles"]
    assert row["function"] == f"step (prog.py:{SYNC_LINE})"
    assert row["compiles"] == own["compiles"] == 3
    assert row["compile_time_s"] == pytest.approx(own["compile_ns"] * 1e-9, rel=0.05)
    assert "Compilation (torch_xla's CompileTime" in done.stderr
    assert f"step (prog.py:{SYNC_LINE})" in done.stderr


def test_the_trace_is_torch_xlas_profiler_read_as_a_jax_trace(run) -> None:
    done, summary, _, out = run
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(out.glob("trace/plugins/profile/*/*.xplane.pb"))
    assert summary["trace"] is not None
    assert [d["device"] for d in summary["devices"]] == ["cpu:0"]
    assert summary["top_ops"]
    assert all(op["module"].startswith("SyncTensorsGraph") for op in summary["top_ops"])
    assert summary["window"]["opened"] is True
