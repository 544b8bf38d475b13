"""tpu-top's device panel with libtpu's metrics service: figures, "not served" vs "no service", a service that dies."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import sysroot
from agentjobs import agent_env, rundir  # noqa: F401 (rundir is a fixture)
from conftest import run_tool, tool_command
from libtpu_server import DUTY_CYCLE, FakeMetricsService, v5e_host
from test_monitor_libtpu import fixture_host  # noqa: F401 (a fixture)
from test_top import Tmux, _terminal_restored

from tpu_tools.metrics.groups.base import CollectOptions
from tpu_tools.metrics.report import ReportBuilder
from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.model import ViewState


def _device_rows(frame: str) -> dict[str, str]:
    return {line.split()[0]: line for line in frame.splitlines() if line.startswith(" tpu:")}


def _frame(addresses: list[str], width: int = 120) -> str:
    builder = ReportBuilder(options=CollectOptions(metrics_addresses=addresses, metrics_timeout_s=1.0))
    try:
        return frame_text(render(builder.build(), ViewState(), width, 40))
    finally:
        builder.close()


def test_not_served_is_not_the_same_as_no_service(fixture_host):
    sysroot.v5e_host(fixture_host, holders={3001: list(range(8))})
    no_duty_cycle = v5e_host()
    del no_duty_cycle.metrics[DUTY_CYCLE]  # a libtpu that serves HBM but no duty cycle
    with FakeMetricsService(no_duty_cycle) as service:
        frame = _frame([service.address])
    title = next(line for line in frame.splitlines() if line.startswith(" Devices"))
    assert title == f" Devices  libtpu {service.address}; duty cycle not served by this runtime (n/s)"
    row = _device_rows(frame)["tpu:0"]
    assert "11.2 GiB / 16.0 GiB" in row and row.split()[-3] == "n/s"
    frame = _frame(["127.0.0.1:1"])
    assert " Devices  libtpu: no metrics service (127.0.0.1:1)" in frame
    row = _device_rows(frame)["tpu:0"]
    assert "- / 16.0 GiB" in row and row.split()[-3] == "-" and "n/s" not in frame


def test_once_shows_the_jobs_duty_cycle_and_hbm(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: list(range(8))})
    with FakeMetricsService(v5e_host()) as service:
        result = run_tool("tpu-top", "--once", "--metrics-addr", service.address,
                          env=agent_env(rundir, TPU_TOOLS_SYSROOT=str(root), COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "platform tpu" in lines[0]
    assert f" Devices  libtpu {service.address}" in lines
    rows = _device_rows(result.stdout)
    assert len(rows) == 8
    assert "11.2 GiB / 16.0 GiB  87.5 3001 python3" in rows["tpu:0"]
    assert "11.5 GiB / 16.0 GiB   0.0" in rows["tpu:7"]


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_a_service_that_dies_between_refreshes_and_comes_back(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: list(range(8))})
    env = agent_env(rundir, TERM="xterm-256color")
    env["PATH"] = str(Path(tool_command("tpu-top")[0]).parent) + os.pathsep + env.get("PATH", "")
    service = FakeMetricsService(v5e_host()).start()
    tmux = Tmux(80, 24, env)
    try:
        tmux.keys(f"clear; echo MARKER-BEFORE; TPU_TOOLS_SYSROOT={root} tpu-top --interval 0.3 "
                  f"--metrics-timeout 0.3 --metrics-addr {service.address}", "Enter")
        screen = tmux.wait_for(lambda s: " tpu:0 " in s and "87.5" in s)
        assert f" Devices  libtpu {service.address}" in screen
        assert "11.2 GiB / 16.0 GiB" in _device_rows(screen)["tpu:0"]
        service.stop()
        screen = tmux.wait_for(lambda s: "libtpu: no metrics service" in s)
        row = _device_rows(screen)["tpu:0"]  # back to what discovery knows
        assert "- / 16.0 GiB" in row and "87.5" not in row and "3001 python3" in row
        service.start()
        screen = tmux.wait_for(lambda s: f"libtpu {service.address}" in s and "87.5" in s)
        assert "11.2 GiB / 16.0 GiB" in _device_rows(screen)["tpu:0"]
        tmux.keys("q")
        _terminal_restored(tmux)
    finally:
        tmux.kill()
        service.stop()
