"""The libtpu part of a bundle's summary: each metrics service's usage and the TPU cores libtpu reports in error.

Read from the bundle's accelerators/libtpu.json (outside data: another host's bundle, perhaps damaged), decoded
into the report's libtpu records; a file of another shape is an OutsideError, which the summary turns into a note.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tpu_tools.metrics.libtpu import DeviceFigures, UsageFigures
from tpu_tools.metrics.records.libtpu import LibtpuService
from tpu_tools.outside import convert


class _Core(msgspec.Struct):
    global_core_id: int | None = None
    chip_id: int | None = None
    core_type: str | None = None
    state: str | None = None
    error_message: str | None = None


class _RuntimeStatus(msgspec.Struct):
    address: str | None = None
    cores: list[_Core] = msgspec.field(default_factory=list)


class _LibtpuFile(msgspec.Struct):
    metrics: list[LibtpuService] = msgspec.field(default_factory=list)
    runtime_status: list[_RuntimeStatus] = msgspec.field(default_factory=list)


class ServiceUsage(msgspec.Struct, kw_only=True):
    """One metrics service: HBM summed and duty cycle averaged over its devices, as tpu-ls shows a chip."""

    address: str
    error: str | None
    device_count: int
    hbm_used_bytes: int | None
    hbm_total_bytes: int | None
    duty_cycle_percent: float | None
    not_served_metrics: list[str]


class CoreInError(msgspec.Struct, kw_only=True):
    address: str | None
    global_core_id: int | None
    chip_id: int | None
    core_type: str | None
    error_message: str | None


class LibtpuSummary(msgspec.Struct, kw_only=True):
    services: list[ServiceUsage]
    core_count: int
    cores_in_error: list[CoreInError]


def libtpu_summary(document: Any) -> LibtpuSummary:
    """The summary of a bundle's libtpu.json document; raises OutsideError for a document of another shape."""
    found = convert(document, _LibtpuFile)
    services = []
    for service in found.metrics:
        devices = [DeviceFigures(d.device_id, hbm_used_bytes=d.hbm_used_bytes, hbm_total_bytes=d.hbm_total_bytes,
                                 duty_cycle_percent=d.duty_cycle_percent) for d in service.devices]
        usage = UsageFigures.combine(devices)
        duty = usage.duty_cycle_percent
        services.append(ServiceUsage(address=service.address, error=service.error, device_count=len(devices),
                                     hbm_used_bytes=usage.hbm_used_bytes, hbm_total_bytes=usage.hbm_total_bytes,
                                     duty_cycle_percent=None if duty is None else round(duty, 2),
                                     not_served_metrics=service.not_served_metrics))
    cores = [(status.address, core) for status in found.runtime_status for core in status.cores]
    return LibtpuSummary(services=services, core_count=len(cores), cores_in_error=[
        CoreInError(address=address, global_core_id=core.global_core_id, chip_id=core.chip_id,
                    core_type=core.core_type, error_message=core.error_message)
        for address, core in cores if core.state == "error" or core.error_message])
