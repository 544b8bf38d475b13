"""Every family the exporter can serve, with its type, unit and help (`tpu-monitor --list-metrics`).

The list is drawn from the exporters' own code, fed one record of each kind with every figure present, so it
cannot drift from what a scrape serves. Two kinds of family are named by what is found at run time and are
listed as patterns: the figures a job serves itself (Orbax, Grain: `tpu_tools_<its name>`) and, on TPUs, a
source's extra device figures beyond those libtpu gives today.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from prometheus_client.core import Metric

from tpu_tools.exporter.buildinfo import NAME as BUILD_INFO
from tpu_tools.exporter.prometheus import PREFIX, ReportCollector, device_metrics, host_metrics, process_metrics
from tpu_tools.metrics.groups.workload import prometheus_families as workload_families
from tpu_tools.metrics.libtpu.distribution import DistributionSummary
from tpu_tools.metrics.libtpu.export import gauge_samples, histogram_samples
from tpu_tools.metrics.libtpu.records import DeliveryRate, DeviceFigures, LibtpuSnapshot, TransferLatency
from tpu_tools.metrics.nvml.export import families as gpu_families
from tpu_tools.metrics.records.devices import Device, DeviceExtra, DeviceHolder, DevicesRecord
from tpu_tools.metrics.records.gpu import GpuProcess, GpuRecord, GpusRecord, MigInstance, XidEvent
from tpu_tools.metrics.records.host import HostRecord
from tpu_tools.metrics.records.jobs import (
    AgentEntry,
    JobLife,
    JobLifeFigures,
    PluginAccelerator,
    PluginRead,
    ProcessesGroup,
    WorkloadGroup,
)
from tpu_tools.metrics.records.report import waiting_report
from tpu_tools.metrics.samplefamilies import histogram_families, sample_families

UNITS = ("bytes_per_second", "seconds", "bytes", "joules", "watts", "celsius", "hertz", "ratio", "percent")


@dataclass(frozen=True)
class FamilyInfo:
    name: str  # as it appears in a scrape (a counter's with _total)
    type: str  # gauge, counter or histogram
    unit: str  # the base unit its name ends in, "" for a count or a state
    help: str
    group: str  # the report group that exports it

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "type": self.type, "unit": self.unit, "help": self.help, "group": self.group}


def unit_of(name: str) -> str:
    """The unit a family's name ends in (before _total), or ""."""
    base = name.removesuffix("_total")
    return next((unit for unit in UNITS if base.endswith("_" + unit)), "")


def _filled(record_type: Any, **fixed: Any) -> dict[str, Any]:
    """A record of this dataclass with every number and flag set (1, True), as its to_dict gives it."""
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(record_type):
        kind = str(spec.type)
        if kind.startswith(("int", "float")):
            values[spec.name] = 1
        elif kind.startswith("bool"):
            values[spec.name] = True
    record = record_type(**{**values, **fixed})
    result: dict[str, Any] = record.to_dict()
    return result


_S = TypeVar("_S", bound=msgspec.Struct)


def _filled_struct(record_type: type[_S], **fixed: Any) -> _S:
    """A record of this Struct type with every number and flag set (1, True)."""
    values: dict[str, Any] = {}
    for spec in msgspec.structs.fields(record_type):
        kind = str(spec.type)
        if kind.startswith(("int", "float")):
            values[spec.name] = 1
        elif kind.startswith("bool"):
            values[spec.name] = True
    return record_type(**{**values, **fixed})


def _example_families() -> Iterable[tuple[str, Metric]]:
    # the host group through the collector itself, which adds the group error family
    collector = ReportCollector({"host": host_metrics})
    example = waiting_report()
    example.host = HostRecord(cpu_percent=1, memory_total_bytes=1, memory_used_bytes=1, memory_available_bytes=1,
                              swap_used_bytes=1, load_average_1m=1)
    collector.update(example)
    yield from (("host" if f.name.startswith(PREFIX + "host_") else "every report" if f.name == BUILD_INFO
                 else "every group", f) for f in collector.collect())
    device = Device(key="tpu:0", platform="tpu", name="TPU", memory_used_bytes=1, memory_total_bytes=1,
                    live_array_bytes=1, utilization_percent=1, holders=[DeviceHolder(pid=1)],
                    extra=DeviceExtra(hbm_bandwidth_utilization_percent=1, tensorcore_idle_duration_seconds=1,
                                      hlo_queue_size=1))
    yield from (("devices", f) for f in device_metrics(DevicesRecord(devices=[device])))
    agent = msgspec.convert({"pid": 1, "tag": "t", "error": None, "cpu_percent": 1, "rss_bytes": 1, "threads": 1,
             "device_memory_used_bytes": 1, "live_array_bytes": 1, "live_array_count": 1,
             "compiles": {"compile_count": 1, "recompile_count": 1, "cache_hits": 1, "cache_misses": 1,
                          "trace_time_s": 1},
             "steps": {"count": 1, "steps_per_second": 1, "last_step_time_s": 1},
             "devices": [{"platform": "tpu", "id": 0, "memory_used_bytes": 1}],
             "tpu_sdk": {"tensorcore_utilization_percent": [1]}, "frontend": "torch_xla", "frontend_version": "1",
             "cpu_fallbacks": {"ops": [{"op": "aten::nonzero", "count": 1}]}, "executions": {"count": 1, "time_s": 1},
             "transfers": {"to_device": {"bytes": 1, "time_s": 1}}, "job": {"id": "j"}}, AgentEntry)
    job = JobLife(job="j", goodput=JobLifeFigures(goodput_percent=1, lost_progress_s=1, lost_progress_steps=1,
                                                  recovery_s=1, disruptions=1))
    yield from (("processes", f) for f in process_metrics(ProcessesGroup(agents=[agent], jobs=[job])))
    summary = DistributionSummary(count=1, mean=1.0, buckets=((1.0, 1), (float("inf"), 0)))
    device_figures = DeviceFigures(**{**{k: v for k, v in _filled(DeviceFigures, device_id=0).items()
                                         if k != "hlo_execution_time_us"}, "hlo_execution_time_us": summary})
    snapshot = LibtpuSnapshot("host:8431", devices=[device_figures],
                              transfer_latencies=[TransferLatency("m", "all", summary)],
                              delivery_rates=[DeliveryRate("m", "all", summary)])
    yield from (("libtpu", f) for f in sample_families(gauge_samples([snapshot])))
    yield from (("libtpu", f) for f in histogram_families(histogram_samples([snapshot])))
    process = _filled_struct(GpuProcess, pid=1, kind="compute")
    gpu = _filled_struct(GpuRecord, index=0, clock_event_reasons=["r"], xid_errors={"79": 1}, nvlink_links_down=[0],
                         mig_instances=[MigInstance(index=0, gpu_instance_id=1, compute_instance_id=0,
                                                    memory_used_bytes=1, memory_total_bytes=1)],
                         xid_last=XidEvent(code=79, time_unix_s=1.0, description="d"), processes=[process],
                         device_key="gpu:0")
    yield from (("nvml, amdsmi", f) for f in gpu_families(GpusRecord(gpus=[gpu])))
    plugin = PluginRead(accelerators=[PluginAccelerator(accelerator_id="0", duty_cycle_percent=1, memory_used_bytes=1,
                                                        memory_total_bytes=1)])
    yield from (("workload", f) for f in workload_families(WorkloadGroup(device_plugin=plugin)))


PATTERNS = [
    FamilyInfo(PREFIX + "<job family>", "gauge", "", "A family the job serves itself (Orbax checkpointing, "
               "Grain input pipelines), read from its Prometheus endpoint.", "workload"),
    FamilyInfo(PREFIX + "device_<figure>", "gauge", "", "A source's extra per-device figure on a TPU (a percent "
               "exported as a _ratio).", "devices"),
]


def exported_families() -> list[FamilyInfo]:
    """Every family, sorted by name, and the patterns of those named at run time."""
    found: dict[str, FamilyInfo] = {}
    for group, family in _example_families():
        name = family.name + ("_total" if family.type == "counter" else "")
        if name not in found:
            found[name] = FamilyInfo(name, family.type, unit_of(name), family.documentation, group)
    return [*sorted(found.values(), key=lambda info: info.name), *PATTERNS]
