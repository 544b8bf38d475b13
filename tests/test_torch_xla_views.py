"""A torch_xla job that recompiles once, hits a CPU fallback and reports a loss, where people look: tpu-monitor's
JSON, Prometheus (checked by promtool), tpu-top's job screen and the record the job leaves when it ends.

One real job is shared by the module, started with `--explain-recompiles`: 3 steps at batch 16, then steps at
batch 24 for as long as the module runs (one recompilation, at the same line), `loss.item()` once after a sync.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentjobs import agent_env, make_rundir, remove_rundir
from conftest import as_report, run_tool
from sysroot import empty_host, v4_host
from test_exporter_exposition import check, exposition
from torch_xla_jobs import MLP_JOB, TorchXlaJob, seconds, start_mlp_job, started

from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.keys import handle_key
from tpu_tools.top.model import ViewState

SYNC_LINE = MLP_JOB.splitlines().index("    torch_xla.sync()") + 1
FALLBACK = "aten::_local_scalar_dense"


@pytest.fixture(scope="module")
def job() -> Iterator[tuple[TorchXlaJob, Path]]:
    rundir = make_rundir()
    launched = start_mlp_job(rundir, steps=8, keep_stepping=True, options=("--tag", "mlp", "--explain-recompiles"))
    try:
        yield started(launched), rundir
    finally:
        launched.stop()
        remove_rundir(rundir)


@pytest.fixture(scope="module")
def report(job: tuple[TorchXlaJob, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any],
                                                                                                 dict[str, Any]]:
    """One tpu-monitor report of the job, and torch_xla's own figures taken just before it (with the exporter's
    whole output under "exposition": all read before any test ends the job)."""
    launched, rundir = job
    own = launched.figures()
    result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
    assert result.returncode == 0, result.stderr
    root = tmp_path_factory.mktemp("host") / "root"
    empty_host(root)  # the job's figures alone, wherever the suite runs
    own["exposition"] = exposition(agent_env(rundir, TPU_TOOLS_SYSROOT=str(root)), "--until",
                                   "^tpu_tools_process_cpu_fallbacks_total")
    # a v4 host whose chips 0 and 1 the job holds, chip 2 a process with no agent (this one)
    host = tmp_path_factory.mktemp("v4") / "root"
    v4_host(host, holders={launched.process.pid: [0, 1], os.getpid(): [2]})
    ls_env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(host))
    ls_env.pop("JAX_PLATFORMS", None)  # the fixture host decides the platform, and nothing opens a device
    own["ls"] = [run_tool("tpu-ls", *options, env=ls_env) for options in (("--json",), ())]
    return json.loads(result.stdout), own


def the_agent(report: dict[str, Any]) -> dict[str, Any]:
    [agent] = report["processes"]["agents"]
    assert agent["error"] is None, agent["error"]
    return agent


def test_the_monitor_shows_the_frontend_compiles_the_recompile_cause_and_the_fallback(
        report: tuple[dict[str, Any], dict[str, Any]]) -> None:
    document, own = report
    agent = the_agent(document)
    assert agent["device_memory_used_bytes"] is None
    assert agent["live_array_bytes"] is None  # unknown on CPU
    assert (agent["frontend"], agent["frontend_version"]) == ("torch_xla", "2.9.0")
    compiles = agent["compiles"]
    assert compiles["compile_count"] == own["counters"]["UncachedCompile"] == 2
    assert compiles["recompile_count"] == 1
    assert compiles["backend_compile_time_s"] == pytest.approx(seconds(own["metrics"]["CompileTime"]), rel=0.05)
    [recompile] = compiles["recent_recompiles"]
    assert recompile["function"].endswith(f"mlp.py:{SYNC_LINE})")
    assert "torch_xla: user torch_xla.sync" in recompile["reason"]
    assert "classic cause: a dynamic shape" in recompile["reason"]
    assert [entry["op"] for entry in agent["cpu_fallbacks"]["ops"]] == [FALLBACK]
    assert agent["steps"]["steps_per_second"] > 0
    causes = agent["goodput"]["since_start"]["causes_s"]
    assert causes["compile"] == pytest.approx(seconds(own["metrics"]["CompileTime"]), rel=0.05)
    [loss] = agent["metrics"]
    assert loss["name"] == "loss"
    assert loss["value"] > 0


def test_prometheus_serves_them_lint_clean(report: tuple[dict[str, Any], dict[str, Any]]) -> None:
    agent = the_agent(report[0])
    text = report[1]["exposition"]
    check(text)  # the exporter's whole output: promtool's lint, the naming rules, every family in --list-metrics
    labels = f'pid="{agent["pid"]}",tag="mlp"'
    assert f'tpu_tools_process_frontend_info{{frontend="torch_xla",{labels},version="2.9.0"}} 1.0' in text
    assert f"tpu_tools_process_compiles_total{{{labels}}} 2.0" in text
    assert f"tpu_tools_process_recompiles_total{{{labels}}} 1.0" in text
    assert f'tpu_tools_process_cpu_fallbacks_total{{op="{FALLBACK}",{labels}}}' in text
    assert f"tpu_tools_process_steps_per_second{{{labels}}}" in text


def test_tpu_ls_names_the_frontend_of_a_holder_whose_agent_says_it_and_no_other(
        job: tuple[TorchXlaJob, Path], report: tuple[dict[str, Any], dict[str, Any]]) -> None:
    listed, table = report[1]["ls"]
    assert listed.returncode == 0, listed.stderr + table.stderr
    assert table.returncode == 0, listed.stderr + table.stderr
    document, pid = json.loads(listed.stdout), job[0].process.pid
    holders = [[(h["pid"], h["frontend"]) for h in chip["holders"]] for chip in document["chips"]]
    assert holders == [[(pid, "torch_xla")], [(pid, "torch_xla")], [(os.getpid(), None)], []]
    assert [(j["pid"], j["frontend"]) for j in document["tpu_health"]] == [(pid, "torch_xla")]
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line.split()[:1] in (["0"], ["2"])}
    assert f"{pid} [torch_xla] python" in rows["0"]
    assert f"{os.getpid()} [" not in rows["2"]
    assert str(os.getpid()) in rows["2"]


def test_tpu_tops_job_screen_shows_them(report: tuple[dict[str, Any], dict[str, Any]]) -> None:
    document, _ = report
    state = ViewState()
    rows = state.visible_rows(as_report(document))
    frame = frame_text(render(as_report(document), state, 160, 30))
    [row] = [line for line in frame.splitlines() if "[torch_xla] mlp.py" in line]
    assert " 0B " not in row  # the list names the frontend; its device memory is unknown, not 0
    handle_key(state, "enter", rows)
    screen = frame_text(render(as_report(document), state, 160, 80))
    assert "torch_xla 2.9.0" in screen
    assert "2 compiles, 1 recompiles" in screen
    assert f"mlp.py:{SYNC_LINE})" in screen
    assert "classic cause: a dynamic shape" in screen
    assert "CPU fallbacks" in screen
    assert FALLBACK in screen
    assert "STEP/S" in screen


def test_the_job_end_record_keeps_them(job: tuple[TorchXlaJob, Path],
                                       report: tuple[dict[str, Any], dict[str, Any]]) -> None:
    launched, rundir = job
    own = launched.figures()
    assert launched.end() == 0
    result = run_tool("tpu-monitor", "--jobs-ended", env=agent_env(rundir))
    assert result.returncode == 0, result.stderr
    [record] = json.loads(result.stdout)["jobs"]
    assert (record["frontend"], record["frontend_version"], record["tag"]) == ("torch_xla", "2.9.0", "mlp")
    assert record["compile_count"] == 2
    assert record["recompile_count"] == 1
    assert record["compile_time_s"] == pytest.approx(seconds(own["metrics"]["CompileTime"]), rel=0.05)
    [recompile] = record["recent_recompiles"]
    assert "classic cause: a dynamic shape" in recompile["reason"]
    assert record["cpu_fallbacks"]["ops"][0]["op"] == FALLBACK
    assert record["steps"]["count"] >= 8
    assert record["goodput"]["since_start"]["causes_s"]["compile"] == pytest.approx(
        seconds(own["metrics"]["CompileTime"]), rel=0.05)
