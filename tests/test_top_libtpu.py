"""tpu-top's device panel with libtpu's metrics service: figures, "not served" vs "no service", a service that dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import sysroot
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import as_report, run_tool, tool_command
from libtpu_server import DUTY_CYCLE, FakeMetricsService, FakeRuntimeService, v5e_host
from programs import needs
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
        return frame_text(render(as_report(builder.build()), ViewState(), width, 40))
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
    assert "11.2 GiB / 16.0 GiB" in row
    assert row.split()[-3] == "n/s"
    frame = _frame(["127.0.0.1:1"])
    assert " Devices  libtpu: no metrics service (127.0.0.1:1)" in frame
    row = _device_rows(frame)["tpu:0"]
    assert "- / 16.0 GiB" in row
    assert row.split()[-3] == "-"
    assert "n/s" not in frame


def test_once_shows_the_jobs_duty_cycle_and_hbm(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: list(range(8))})
    with FakeMetricsService(v5e_host()) as service:
        result = run_tool("tpu-top", "--once", "--metrics-addr", service.address,
                          env=agent_env(rundir, TPU_TOOLS_SYSROOT=str(root), COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "platform tpu" in lines[0]
    assert f" Devices  libtpu {service.address}" in lines
    rows = _device_rows(result.stdout)
    assert len(rows) == 8
    assert "11.2 GiB / 16.0 GiB  87.5 3001 python3" in rows["tpu:0"]
    assert "11.5 GiB / 16.0 GiB   0.0" in rows["tpu:7"]


@needs("tmux")
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
        # A frame is painted from the top down and a capture can land inside one: the wait names the rows too.
        def tpu0(screen: str) -> str:
            return _device_rows(screen).get("tpu:0", "")

        tmux.wait_for(lambda s: f" Devices  libtpu {service.address}" in s and "87.5" in tpu0(s)
                      and "11.2 GiB / 16.0 GiB" in tpu0(s))
        service.stop()
        screen = tmux.wait_for(lambda s: "libtpu: no metrics service" in s and "3001 python3" in tpu0(s)
                               and "- / 16.0 GiB" in tpu0(s))
        assert "87.5" not in tpu0(screen)  # back to what discovery knows
        service.start()
        tmux.wait_for(lambda s: f"libtpu {service.address}" in s and "87.5" in tpu0(s)
                      and "11.2 GiB / 16.0 GiB" in tpu0(s))
        tmux.keys("q")
        _terminal_restored(tmux)
    finally:
        tmux.kill()
        service.stop()


class _SlowRuntimeService(FakeRuntimeService):
    """The fixture service, taking `delay_s` over every call: a runtime near its deadline."""

    delay_s = 2.0

    def _enter(self, rpc, request, context):
        super()._enter(rpc, request, context)
        time.sleep(self.delay_s)


def _key_latency(tmux: Tmux, key: str, changed) -> float:
    """Seconds from sending `key` until the screen shows its effect, polling the pane as fast as tmux answers.

    The clock starts before `send-keys` runs and stops after the capture that shows the change, so the
    figure is an upper bound: it includes tmux's own two round trips."""
    started = time.monotonic()
    tmux.keys(key)
    while True:
        screen = tmux.screen()
        if changed(screen):
            return time.monotonic() - started
        if time.monotonic() - started > 10:
            raise AssertionError(f"key {key!r} had no effect in 10 s:\n{screen}")


@needs("tmux")
def test_keys_answer_at_once_while_sources_are_slow(rundir, tmp_path):
    """A libtpu service that takes 2 s per call and an agent that never answers: every key still takes
    effect well before a slow source answers (a second, on a loaded machine too), since reports are gathered in
    the background."""
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: list(range(8))})
    service = FakeMetricsService(v5e_host())
    service.servicer = _SlowRuntimeService(service.servicer.fixture)
    service.start()
    ready = tmp_path / "ready"
    silent = subprocess.Popen([sys.executable, str(Path(__file__).parent / "fakeagent.py"), str(rundir), str(ready),
                               "hang"])
    env = agent_env(rundir, TERM="xterm-256color")
    env["PATH"] = str(Path(tool_command("tpu-top")[0]).parent) + os.pathsep + env.get("PATH", "")
    tmux = Tmux(120, 40, env)
    try:
        wait_for(lambda: ready.exists() and ready.read_text(), timeout=20)
        tmux.keys(f"clear; echo MARKER-BEFORE; TPU_TOOLS_SYSROOT={root} tpu-top --interval 1 --agent-timeout 2 "
                  f"--metrics-timeout 3 --metrics-addr {service.address}", "Enter")
        # The first frame comes before the slow sources answer; their figures follow, seconds later.
        tmux.wait_for(lambda s: " tpu:0 " in s and "sorted by DEV MEM" in s)
        tmux.wait_for(lambda s: "87.5" in s and "no complete answer" in s, timeout=60)
        assert service.servicer.calls  # the slow service is being asked all along
        latencies = {}
        steps = [
            ("s", lambda s: "sorted by COMP" in s), ("s", lambda s: "sorted by RECOMP" in s),
            ("r", lambda s: "sorted by RECOMP ^" in s), ("p", lambda s: "PAUSED" in s.splitlines()[0]),
            ("p", lambda s: "PAUSED" not in s.splitlines()[0]), ("h", lambda s: "tpu-top keys" in s),
            ("x", lambda s: "tpu-top keys" not in s), ("/", lambda s: "filter: /_" in s),
            ("Escape", lambda s: "filter: /" not in s), ("S", lambda s: "sorted by COMP" in s),
        ]
        for key, changed in steps:
            latencies[key + str(len(latencies))] = _key_latency(tmux, key, changed)
            time.sleep(0.3)  # the next key lands at another point of the slow collection
        slowest = max(latencies.values())
        print(f"key latencies (ms): {' '.join(f'{k}={v * 1e3:.0f}' for k, v in latencies.items())}")
        assert slowest < 1.0, latencies  # a key waiting on the collection would take the service's 2 s
        tmux.keys("q")
        _terminal_restored(tmux)
    finally:
        tmux.kill()
        silent.kill()
        silent.wait()
        service.stop()
