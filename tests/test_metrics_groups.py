"""Report assembly from pluggable groups: a source is one collector registered in GROUPS under its group's name."""

from __future__ import annotations

import pytest
import sysroot
from conftest import as_report, report_document
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from tpu_tools.exporter.prometheus import ReportCollector, exporters_for, parse_listen_address
from tpu_tools.metrics.groups import GROUPS
from tpu_tools.metrics.groups.base import CollectOptions, DeviceFigures
from tpu_tools.metrics.records.devices import DeviceExtra
from tpu_tools.metrics.records.libtpu import LibtpuGroup, LibtpuService
from tpu_tools.metrics.report import SCHEMA, GroupPlan, ReportBuilder
from tpu_tools.parsing import parse_duration
from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.model import ViewState


class FakeRuntimeSource:
    """Stands in for a runtime metrics service with per-device figures (the shape a libtpu group has)."""

    name = "libtpu"  # in the place of libtpu's metrics service, whose shape it has
    fail = False

    def __init__(self, options: CollectOptions):
        self.calls = 0

    def _fetch(self, context):
        def fetch():
            self.calls += 1
            if FakeRuntimeSource.fail:
                raise ConnectionError("no metrics service answers at localhost:8431")
            return {0: (3 << 30, 16 << 30, 87.5), 1: (1 << 30, 16 << 30, 12.0)}
        return context.memo("fakeruntime", fetch)

    record_type = LibtpuGroup

    def collect(self, context):
        self._fetch(context)  # its group says only which service answered: the figures go to the devices group
        return LibtpuGroup(services=[LibtpuService(address="fake:8431")])

    def device_figures(self, context):
        return [DeviceFigures("tpu", k, "fakeruntime", memory_used_bytes=used, memory_total_bytes=total,
                              utilization_percent=util, extra=DeviceExtra(hbm_bandwidth_utilization_percent=40.0))
                for k, (used, total, util) in self._fetch(context).items()]


@pytest.fixture
def tpu_host(tmp_path, monkeypatch):
    root = tmp_path / "root"
    sysroot.v5e_host(root)
    rundir = tmp_path / "run"
    rundir.mkdir(mode=0o700)
    monkeypatch.setenv("TPU_TOOLS_SYSROOT", str(root))
    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(rundir))
    monkeypatch.setitem(GROUPS, "libtpu", "test_metrics_groups:FakeRuntimeSource")
    FakeRuntimeSource.fail = False


def test_a_registered_source_feeds_its_group_the_devices_and_top(tpu_host):
    builder = ReportBuilder()
    report = builder.build()
    document = report_document(report)
    assert document["schema"] == SCHEMA
    assert list(document)[-8:] == ["host", "devices", "processes", "libtpu",
                                                                    "workload", "nvml", "amdsmi", "diag"]
    assert document["libtpu"]["error"] is None
    assert [service["address"] for service in document["libtpu"]["services"]] == ["fake:8431"]
    assert builder.collectors["libtpu"].calls == 1  # fetched once per round, shared by two groups
    devices = {d["key"]: d for d in document["devices"]["devices"]}
    assert devices["tpu:0"]["utilization_percent"] == 87.5
    assert devices["tpu:0"]["memory_used_bytes"] == 3 << 30
    assert devices["tpu:0"]["sources"] == ["discovery", "fakeruntime"]
    assert devices["tpu:0"]["extra"] == {"hbm_bandwidth_utilization_percent": 40.0}
    assert devices["tpu:5"]["utilization_percent"] is None
    frame = frame_text(render(as_report(report), ViewState(), 120, 40))
    row = next(line for line in frame.splitlines() if line.startswith(" tpu:0 "))
    assert "3.0 GiB / 16.0 GiB" in row
    assert " 87.5 " in row
    registry = CollectorRegistry(auto_describe=False)
    collector = ReportCollector(exporters_for(builder.collectors))
    registry.register(collector)
    collector.update(as_report(report))
    text = generate_latest(registry).decode()
    assert 'tpu_tools_device_utilization_ratio{device="tpu:0",name="TPU v5e",platform="tpu"} 0.875' in text
    assert 'tpu_tools_device_hbm_bandwidth_utilization_ratio{device="tpu:1",name="TPU v5e",platform="tpu"} 0.4' in text


def test_a_failing_source_is_its_group_error_only(tpu_host):
    FakeRuntimeSource.fail = True
    report = report_document(ReportBuilder().build())
    assert report["libtpu"]["error"] == "no metrics service answers at localhost:8431"
    assert report["devices"]["error"] is None
    assert len(report["devices"]["devices"]) == 8
    assert report["host"]["error"] is None
    assert report["processes"]["error"] is None


def test_group_periods_repeat_earlier_figures(tpu_host):
    builder = ReportBuilder([GroupPlan("libtpu", period_s=60.0), GroupPlan("host")],
                            report_period_s=0.01)
    first, second = report_document(builder.build()), report_document(builder.build())
    assert builder.collectors["libtpu"].calls == 1
    assert first["libtpu"]["sampled_at"] == second["libtpu"]["sampled_at"]
    assert first["libtpu"]["period_s"] == 60.0
    assert second["host"]["period_s"] == 0.01


@pytest.mark.parametrize(("text", "seconds"), [("1", 1.0), ("0.5", 0.5), ("500ms", 0.5), ("2s", 2.0), ("1m", 60.0),
                                               (3, 3.0), (".25", 0.25)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-1", "", "1 day", "ms", "2d", "nan", True, None, "100000s"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match=r"^period (.* is not a duration|.* is longer than a day|must be)"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "address"), [("9100", ("127.0.0.1", 9100)), ("0.0.0.0:80", ("0.0.0.0", 80)),
                                               ("[::1]:9100", ("::1", 9100)), (":9100", ("127.0.0.1", 9100))])
def test_listen_addresses(text, address):
    assert parse_listen_address(text) == address


