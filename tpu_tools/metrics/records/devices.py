"""The `devices` group: each accelerator device with its figures from every source, one name per figure."""

from __future__ import annotations

from typing import Any

import msgspec

from tpu_tools.metrics.records.group import GroupRecord


class DeviceHolder(msgspec.Struct, kw_only=True):
    """A process that holds the device: its device node open, or on the vendor library's list of the GPU's."""

    pid: int
    user: str | None = None
    command: str | None = None
    frontend: str | None = None  # jax or torch_xla, as the process's agent says; None: no agent answered for it


class DeviceProcess(msgspec.Struct, kw_only=True):
    """An agent-attached process that uses the device."""

    pid: int
    tag: str | None = None


# Only the figures a source gave are written (the JSON's `extra` lists what is known).
class DeviceExtra(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The figures of a device that one kind of source reads: libtpu's, the GPU libraries', tpu-diag's."""

    # libtpu's metrics service
    hbm_bandwidth_utilization_percent: float | None = None
    tensorcore_idle_duration_seconds: float | None = None
    hlo_queue_size: int | float | None = None
    # NVML or amdsmi, one name per figure for both
    temperature_celsius: float | None = None  # NVIDIA: the core; AMD: edge, else hotspot
    power_draw_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    clock_sm_hz: float | None = None
    utilization_memory_percent: float | None = None
    gpu_status: str | None = None  # as NVML or amdsmi answered (the device's holders_source): ok, lost, ...
    gpu_name: str | None = None  # the card's model, without its vendor's name
    # tpu-diag's last run on this host
    diag_status: str | None = None  # pass, warn, fail, skip
    diag_age_s: int | float | None = None


class Device(msgspec.Struct, kw_only=True):
    """One device: its hardware (passive discovery), the agents' runtime figures, and other sources' figures.

    `key` names it in every view and series: tpu:0, gpu:1, or cpu:0@1234 for a process's own device with no
    hardware behind it; a fleet's keys start with their host (HOST:PORT/tpu:0).
    """

    key: str
    platform: str | None = None
    id: int | None = None
    name: str | None = None
    chip_index: int | None = None
    pci_address: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_peak_bytes: int | None = None
    live_array_bytes: int | None = None
    live_array_count: int | None = None
    utilization_percent: float | None = None
    holders: list[DeviceHolder] = msgspec.field(default_factory=list)
    holders_source: str | None = None  # nvml, amdsmi or device_nodes
    processes: list[DeviceProcess] = msgspec.field(default_factory=list)
    sources: list[str] = msgspec.field(default_factory=list)  # discovery, agent, libtpu, nvml, ...
    extra: DeviceExtra = msgspec.field(default_factory=DeviceExtra)
    # A fleet's device only (a report of one host leaves them out): its host, and its holders' count as exported.
    host: str | msgspec.UnsetType = msgspec.UNSET
    holder_processes: int | None | msgspec.UnsetType = msgspec.UNSET

    def memory_used_or_live_bytes(self) -> int | None:
        """The device's memory in use, else the bytes of its live arrays (a platform that does not say)."""
        return self.memory_used_bytes if self.memory_used_bytes is not None else self.live_array_bytes

    def host_name(self) -> str | None:
        """The host a fleet's device is on; None for a device of this host."""
        return None if isinstance(self.host, msgspec.UnsetType) else self.host


class DevicesRecord(GroupRecord, kw_only=True):
    devices: list[Device] = msgspec.field(default_factory=list)
    chips: list[dict[str, Any]] = msgspec.field(default_factory=list)  # tpu-ls's chip records, as it writes them
    notes: list[str] = msgspec.field(default_factory=list)
