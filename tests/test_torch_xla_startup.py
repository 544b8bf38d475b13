"""The startup contract of a torch_xla job, checked: PJRT_DEVICE left to its default, XLA_FLAGS changed after
the import, xr.use_spmd() after a tensor, the persistent cache set after the first compile. Each is a finding
with its fix in tpu-monitor, tpu-top's job screen and `tpu-dump show`; a job that keeps the contract has none
(tests/test_torch_xla_agent.py)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch_xla_env
from agentjobs import Job, agent_env, make_rundir, published_after, remove_rundir, wait_for
from conftest import as_report, run_tool

from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.keys import handle_key
from tpu_tools.top.model import ViewState

BROKEN = textwrap.dedent("""
    import os, sys, time
    ready, lifetime = sys.argv[1], float(sys.argv[2])
    import torch, torch_xla
    import torch_xla.runtime as xr
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # read at the import: too late
    x = torch.ones(4, device=torch_xla.device())
    xr.use_spmd()  # a tensor exists already
    (x * 2).sum()
    torch_xla.sync()
    os.environ["XLA_PERSISTENT_CACHE_PATH"] = os.path.join(os.path.dirname(ready), "cache")  # after a compile
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + lifetime
    while time.time() < deadline and not os.path.exists(ready + ".exit"):
        time.sleep(0.05)
""")
CHECKS = {"pjrt_device_defaulted", "flags_set_late", "spmd_after_tensors", "cache_set_late"}


@pytest.fixture(scope="module")
def broken() -> Iterator[tuple[dict[str, Any], Path]]:
    """tpu-monitor's report of the job, and the runtime directory (the job still runs)."""
    python = torch_xla_env.require()
    rundir = make_rundir()
    workdir = Path(tempfile.mkdtemp(prefix="txs", dir="/tmp"))
    (workdir / "job.py").write_text(BROKEN)
    env = torch_xla_env.job_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), PJRT_DEVICE=None, XLA_FLAGS=None)
    process = subprocess.Popen([str(python), "-m", "tpu_tools.agent", "--tag", "late", str(workdir / "job.py"),
                                str(workdir / "ready"), "600"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    job = Job(process, workdir / "ready", workdir)
    try:
        job.wait_ready(300)
        ready_at = time.time()  # the job broke every rule before it wrote its ready file
        wait_for(lambda: published_after(rundir, ready_at, 1), timeout=120, interval=0.2)

        def published_since_ready() -> dict[str, Any] | None:
            result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
            agents = report["processes"]["agents"]
            return report if agents and all(a["startup"] is not None for a in agents) else None

        yield wait_for(published_since_ready, timeout=120, interval=0.5), rundir
    finally:
        job.stop()
        remove_rundir(rundir)


def test_the_monitor_names_each_broken_rule_with_its_fix(broken: tuple[dict[str, Any], Path]) -> None:
    report, _ = broken
    [agent] = report["processes"]["agents"]
    findings = {finding["check"]: finding for finding in agent["startup"]}
    assert set(findings) == CHECKS
    assert findings["pjrt_device_defaulted"]["message"].endswith("it defaulted to CPU")
    assert "now '--xla_force_host_platform_device_count=2'" in findings["flags_set_late"]["message"]
    assert findings["spmd_after_tensors"]["fix"].startswith("call xr.use_spmd() before any tensor exists")
    assert "after the first compile" in findings["cache_set_late"]["message"]


def test_tpu_top_shows_them_on_the_job_screen(broken: tuple[dict[str, Any], Path]) -> None:
    report, _ = broken
    state = ViewState()
    handle_key(state, "enter", state.visible_rows(as_report(report)))
    screen = frame_text(render(as_report(report), state, 160, 80))
    assert "Startup contract  4 broken" in screen
    assert "! PJRT_DEVICE was not set when torch_xla was imported" in screen
    assert "fix: set PJRT_DEVICE" in screen


def test_tpu_dump_show_lists_them(broken: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    _, rundir = broken
    bundle = tmp_path / "bundle.tar.gz"
    dumped = run_tool("tpu-dump", "--only", "accelerators.agents", "-o", str(bundle), env=agent_env(rundir))
    assert dumped.returncode == 0, dumped.stderr
    shown = run_tool("tpu-dump", "show", str(bundle), env=agent_env(rundir))
    assert shown.returncode == 0, shown.stderr
    assert "xr.use_spmd() was called after" in shown.stdout
    assert "PJRT_DEVICE was not set" in shown.stdout
