"""tpu-monitor's libtpu group: the fake metrics service next to fixture TPU hosts, pairing, Prometheus, faults."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time

import pytest
import sysroot
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import DEFAULT_METRICS_ADDR, report_document, tool_command
from libtpu_server import FakeMetricsService, tpu7x_host, v4_host, v5e_host, v6e_host
from prometheus_client.utils import floatToGoString
from test_libtpu_client import SNAPSHOT_KEYS
from test_monitor_cli import LIBTPU_KEYS, _free_port, _safe_scrape, monitor

from tpu_tools.metrics.groups.base import CollectOptions
from tpu_tools.metrics.report import GroupPlan, ReportBuilder

GIB = 1 << 30


def one_chip_v4():
    """The libtpu of a process that owns one v4 chip (one of several jobs on a host, one port each)."""
    fixture = v4_host()
    fixture.metrics = {name: points[:1] for name, points in fixture.metrics.items()}
    return fixture


@pytest.fixture
def fixture_host(tmp_path, monkeypatch):
    """Point discovery at a fixture root and agents at an empty directory; returns the root."""
    root = tmp_path / "root"
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("TPU_TOOLS_SYSROOT", str(root))
    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(run))
    return root


def _devices(report: dict) -> dict[str, dict]:
    return {d["key"]: d for d in report["devices"]["devices"]}


def test_one_client_for_the_run_figures_in_the_devices_group_and_closed_at_the_end(fixture_host):
    sysroot.v5e_host(fixture_host, holders={3001: list(range(8))})
    with FakeMetricsService(v5e_host()) as service:
        builder = ReportBuilder(options=CollectOptions(metrics_addresses=[service.address], metrics_timeout_s=1.0))
        reports = [report_document(builder.build()) for _ in range(3)]
        assert len(service.servicer.peers) == 1  # one channel, reused by every period
        assert service.servicer.calls["ListSupportedMetrics"] == 3  # one read per period, shared by two groups
        group = reports[-1]["libtpu"]
        assert set(group) == LIBTPU_KEYS
        assert group["error"] is None
        assert group["notes"] == []
        [snapshot] = group["services"]
        assert set(snapshot) == SNAPSHOT_KEYS
        assert len(snapshot["devices"]) == 8
        devices = _devices(reports[-1])
        assert devices["tpu:0"]["sources"] == ["discovery", "libtpu"]
        assert devices["tpu:0"]["utilization_percent"] == 87.5
        assert devices["tpu:7"]["memory_used_bytes"] == int(11.5 * GIB)
        assert devices["tpu:7"]["memory_total_bytes"] == 16 * GIB
        assert devices["tpu:1"]["extra"] == {"hlo_queue_size": 2}  # no bandwidth or idle metric on this libtpu
        assert devices["tpu:1"]["holders"][0]["pid"] == 3001
        builder.close()
        assert builder.collectors["libtpu"]._client is None


@pytest.mark.parametrize(("host", "fixtures", "expected", "note"), [
    # 4 chips of 2 devices, duty cycle per chip: both devices of a chip carry the chip's figure
    (sysroot.tpu7x_host, [tpu7x_host], {"tpu:1": (81 * GIB, 70.0), "tpu:6": (86 * GIB, 73.0)}, None),
    # an older libtpu: duty cycle per chip on one-device chips
    (sysroot.v4_host, [v4_host], {"tpu:3": (int(20.1 * GIB), 46.8)}, None),
    # four processes of one chip each (one port each): paired with the chips in address order
    (sysroot.v4_host, [one_chip_v4] * 4, {"tpu:0": (20 * GIB, 45.0), "tpu:3": (20 * GIB, 45.0)}, None),
    # one service whose devices do not pair with the chips: placed by its own device ids, and said so
    (sysroot.v5e_host, [v6e_host], {"tpu:3": (int(27.4 * GIB), 98.9), "tpu:4": (None, None)},
     "the libtpu metrics services report 4 devices, which do not pair with this host's 8 TPU chips: placed by "
     "the service's device ids"),
    # several that do not pair: their figures stay in the libtpu group
    (sysroot.v4_host, [v6e_host, v4_host], {"tpu:0": (None, None)},
     "the libtpu metrics services report 8 devices, which do not pair with this host's 4 TPU chips: their "
     "figures are in the libtpu group only"),
], ids=["tpu7x", "v4", "one-port-per-chip", "one-unpaired", "several-unpaired"])
def test_service_devices_are_paired_with_the_chips(fixture_host, host, fixtures, expected, note):
    host(fixture_host)
    services = [FakeMetricsService(fixture()).start() for fixture in fixtures]
    try:
        options = CollectOptions(metrics_addresses=[s.address for s in services], metrics_timeout_s=1.0)
        builder = ReportBuilder([GroupPlan("devices"), GroupPlan("libtpu")], options)
        report = report_document(builder.build())
        builder.close()
    finally:
        for service in services:
            service.stop()
    devices = _devices(report)
    for key, (used, duty) in expected.items():
        assert (devices[key]["memory_used_bytes"], devices[key]["utilization_percent"]) == (used, duty), key
    notes = report["libtpu"]["notes"]
    assert (notes[0].startswith(note) if note else notes == []), notes


class _Lines:
    """The monitor's stdout, line by line, read on a thread so that a wait is always bounded."""

    def __init__(self, process: subprocess.Popen):
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self._queue.put(line)

    def report(self, timeout: float = 10.0) -> dict:
        return json.loads(self._queue.get(timeout=timeout))

    def until(self, predicate, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            report = self.report(timeout=max(0.1, deadline - time.monotonic()))
            if predicate(report):
                return report
        raise AssertionError("no such report in time")


def test_hang_stop_and_restart_of_the_service_with_prometheus(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: list(range(8))})
    service = FakeMetricsService(v5e_host()).start()
    port = _free_port()
    process = subprocess.Popen([*tool_command("tpu-monitor"), "--period", "0.3", "--metrics-timeout", "0.3",
                                "--metrics-addr", service.address, "--prometheus", str(port)],
                               env=agent_env(rundir, TPU_TOOLS_SYSROOT=str(root)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = _Lines(process)
    address = f'address="{service.address}"'
    try:
        lines.until(lambda r: r["libtpu"]["error"] is None and r["sequence"] >= 2)
        text = wait_for(lambda: (lambda t: t if "tpu_tools_libtpu_duty_cycle_ratio" in t else None)(
            _safe_scrape(port)), timeout=20)
        assert f'tpu_tools_libtpu_up{{{address}}} 1.0' in text
        assert f'tpu_tools_libtpu_duty_cycle_ratio{{{address},device="0"}} 0.875' in text
        assert f'tpu_tools_libtpu_hbm_total_bytes{{{address},device="7"}} {floatToGoString(16 * GIB)}' in text
        assert f'tpu_tools_libtpu_hlo_execution_time_seconds_bucket{{{address},device="0",le="1e-06"}}' in text
        assert f'tpu_tools_libtpu_hlo_execution_time_seconds_count{{{address},device="5"}} 0.0' in text
        assert f'tpu_tools_libtpu_hlo_execution_time_seconds_sum{{{address},device="5"}} 0.0' in text  # no samples
        assert 'tpu_tools_device_utilization_ratio{device="tpu:0",name="TPU v5e",platform="tpu"} 0.875' in text
        assert 'tpu_tools_group_error{group="libtpu"} 0.0' in text
        assert len(service.servicer.peers) == 1
        # A service that hangs costs each report its deadline, no more.
        service.hang()
        lines.until(lambda r: "did not answer within 0.3 s" in (r["libtpu"]["error"] or ""))
        # The service never answers: a report that waited on it would never come (report()'s wait is the guard).
        hung = [lines.report() for _ in range(3)]
        assert all("did not answer within 0.3 s" in r["libtpu"]["error"] for r in hung)
        assert all(r["devices"]["error"] is None and len(r["devices"]["devices"]) == 8 for r in hung)
        # A service that dies: an error, and its series disappear.
        service.stop()
        lines.until(lambda r: "connection refused" in (r["libtpu"]["error"] or ""))
        text = wait_for(lambda: (lambda t: t if 'tpu_tools_group_error{group="libtpu"} 1.0' in t else None)(
            _safe_scrape(port)), timeout=20)
        assert "tpu_tools_libtpu_" not in text
        assert 'tpu_tools_device_utilization_ratio{device="tpu:0"' not in text
        # It comes back on the same port: picked up again.
        service.start()
        report = lines.until(lambda r: r["libtpu"]["error"] is None, timeout=20)
        assert _devices(report)["tpu:0"]["utilization_percent"] == 87.5
        assert process.poll() is None
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        finally:
            process.kill()
            service.stop()
    assert process.returncode == 0
    assert process.stderr.read() == ""  # nothing from gRPC's own logs


def test_config_chooses_the_libtpu_group_its_period_and_addresses(rundir, tmp_path):
    root = tmp_path / "root"
    sysroot.v5e_host(root)
    with FakeMetricsService(v5e_host()) as service:
        config = tmp_path / "monitor.toml"
        config.write_text(f'period = "200ms"\nmetrics_addr = "{service.address}"\nmetrics_timeout = "1s"\n'
                          '[groups.devices]\n[groups.libtpu]\nperiod = "30s"\n')
        reports = monitor("--config", str(config), "--count", "3", rundir=rundir, TPU_TOOLS_SYSROOT=str(root))
        assert service.servicer.calls["ListSupportedMetrics"] == 3  # the devices group reads every report
    assert all(set(r) >= {"devices", "libtpu"} and "host" not in r for r in reports)
    assert [s["address"] for s in reports[0]["libtpu"]["services"]] == [DEFAULT_METRICS_ADDR, service.address]
    assert reports[0]["libtpu"]["period_s"] == 30.0
    assert len({r["libtpu"]["sampled_at"] for r in reports}) == 1
    assert all(_devices(r)["tpu:0"]["utilization_percent"] == 87.5 for r in reports)
