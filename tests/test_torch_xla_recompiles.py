"""Why a torch_xla job compiled again (`--explain-recompiles`): torch_xla's description of each compile, what
differs from the graph compiled before at the same line, and the classic cause named."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import torch_xla_env
from agentjobs import agent_env, make_rundir, remove_rundir
from conftest import run_tool

from tpu_tools.instrument.torchxla import CompileBlock, DebugOutputParser, recompile_reasons

# A Python scalar that changes every step, traced in as a constant (`x ** s`), and a value read before the sync.
JOB = textwrap.dedent("""
    import torch, torch_xla
    x = torch.ones(4, device=torch_xla.device())
    torch_xla.sync(wait=True)  # x on the device: the graphs below differ only in their scalar
    for step in range(3):
        y = x ** (2.0 + step)
        torch_xla.sync()
    for step in range(2):
        z = (x ** (5.0 + step)).sum()
        print(z.item())
        torch_xla.sync()
""")
SCALAR_LINE = JOB.splitlines().index("    torch_xla.sync()") + 1
ITEM_LINE = JOB.splitlines().index("    print(z.item())") + 1

BLOCK = """
Compilation Analysis: ================================================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   user torch_xla.sync
Compilation Analysis: Graph Info:
Compilation Analysis:   Graph Hash: a0d0f84e2462521b673db5eb0ad2ebf0
Compilation Analysis:   Number of Graph Inputs: 9
Compilation Analysis:   Number of Graph Outputs: 13
Compilation Analysis: Python Frame Triggered Execution:
Compilation Analysis:   sync (/venv/site-packages/torch_xla/torch_xla.py:87)
Compilation Analysis:   step (/tmp/train.py:10)
Compilation Analysis:   <module> (/tmp/train.py:11)
Compilation Analysis: --------------------------------------------------------------------------------
Compilation Analysis: ================================================================================

Computation hash: 201454fb4623a4e2964d6af9ac329dfc

Post Compilation Analysis: ================================================================================
Post Compilation Analysis: Graph input size: 0.000001 GB
Post Compilation Analysis: Graph output size: 0.000002 GB
Post Compilation Analysis: Intermediate tensor size: 0.000002 GB
Post Compilation Analysis: --------------------------------------------------------------------------------
Post Compilation Analysis: ================================================================================
"""


def test_a_block_fed_in_pieces_is_read_whole() -> None:
    parser = DebugOutputParser()
    for start in range(0, len(BLOCK), 37):  # a file read while torch_xla still writes it
        parser.feed(BLOCK[start:start + 37])
    [block] = parser.blocks
    assert block == CompileBlock("user torch_xla.sync", "a0d0f84e2462521b673db5eb0ad2ebf0", 9, 13,
                                 ["sync (/venv/site-packages/torch_xla/torch_xla.py:87)", "step (/tmp/train.py:10)",
                                  "<module> (/tmp/train.py:11)"],
                                 {"input": 1e-06, "output": 2e-06, "intermediate": 2e-06})


def test_more_inputs_name_the_graph_that_grew() -> None:
    before = CompileBlock("user torch_xla.sync", "aa", 9, 13, ["step (/tmp/train.py:10)"], {"input": 1e-6})
    now = CompileBlock("user torch_xla.sync", "bb", 10, 13, ["step (/tmp/train.py:10)"], {"input": 1e-6})
    reasons = recompile_reasons(now, before, "step (/tmp/train.py:10)")
    assert reasons[0].startswith("classic cause: a tensor added to or dropped from the step's graph")
    assert "graph inputs: 9 before, now 10" in reasons


def test_the_job_end_record_names_a_changing_scalar_and_a_value_read_before_the_sync(tmp_path: Path) -> None:
    python = torch_xla_env.require()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    rundir = make_rundir()  # a short path: a Unix socket's is limited to 107 bytes
    try:
        env = torch_xla_env.job_env(TPU_TOOLS_RUNTIME_DIR=str(rundir))
        ran = subprocess.run([str(python), "-m", "tpu_tools.agent", "--explain-recompiles", str(script)], env=env,
                             capture_output=True, text=True, timeout=600)
        result = run_tool("tpu-monitor", "--jobs-ended", env=agent_env(rundir))
        left = sorted(path.name for path in rundir.rglob("torch-xla-compiles-*"))
    finally:
        remove_rundir(rundir)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "warning" not in ran.stderr, ran.stderr[-3000:]
    assert "Compilation Analysis" not in ran.stdout + ran.stderr  # torch_xla's description went to the agent's file
    assert left == []  # which the agent removed when the job ended
    [record] = json.loads(result.stdout)["jobs"]
    by_line: dict[int, list[str]] = {}
    for recompile in record["recent_recompiles"]:
        line = int(recompile["function"].rsplit(":", 1)[1].rstrip(")"))
        by_line.setdefault(line, []).append(recompile["reason"])
    assert {SCALAR_LINE, ITEM_LINE} <= set(by_line), record["recent_recompiles"]
    assert len(by_line[SCALAR_LINE]) == 2, by_line
    assert all(reason.startswith("classic cause: the same inputs but another graph: a Python scalar")
               for reason in by_line[SCALAR_LINE]), by_line
    [early] = by_line[ITEM_LINE]
    assert early.startswith("classic cause: a tensor value read before torch_xla.sync")
    assert "torch_xla: most likely user code trying to access tensor value before torch_xla.sync" in early
    assert record["recompile_count"] == sum(len(reasons) for reasons in by_line.values())
