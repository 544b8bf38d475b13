"""Device and runtime records built from PJRT.

The builders (`device_record`, `runtime_record`) take jax objects and run
where jax is imported (the isolated child, or a benchmark process); the
records themselves are plain dataclasses that travel as JSON.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class DeviceRecord:
    id: int  # global device id
    local_hardware_id: int | None
    platform: str
    device_kind: str
    process_index: int
    host: str
    coords: list[int] | None = None  # TPU chip coordinates in the slice
    core_on_chip: int | None = None
    memory_limit_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_peak_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class RuntimeRecord:
    platform: str
    platform_version: str
    process_index: int
    process_count: int
    device_count: int
    local_device_count: int
    jax_version: str
    jaxlib_version: str
    devices: list[DeviceRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["devices"] = [d.to_dict() for d in self.devices]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeRecord:
        names = {f.name for f in fields(cls)} - {"devices"}
        record = cls(**{k: v for k, v in data.items() if k in names})
        record.devices = [DeviceRecord.from_dict(d) for d in data.get("devices", [])]
        return record


# DeviceRecord field -> the key of PJRT's memory statistics it comes from
_MEMORY_FIGURES = {"memory_limit_bytes": "bytes_limit", "memory_used_bytes": "bytes_in_use",
                   "memory_peak_bytes": "peak_bytes_in_use"}


def memory_figures(device: Any) -> dict[str, int | None]:
    """The memory fields of a device's record, from its PJRT memory statistics (None where its plugin has none)."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 some plugins raise instead of returning None
        stats = {}
    return {name: stats.get(key) for name, key in _MEMORY_FIGURES.items()}


def device_record(device: Any, host: str, addressable: bool = True) -> DeviceRecord:
    """A `DeviceRecord` of one jax device; memory figures only for addressable devices that report them."""
    memory = memory_figures(device) if addressable else {}
    coords = getattr(device, "coords", None)
    return DeviceRecord(
        id=int(device.id),
        local_hardware_id=getattr(device, "local_hardware_id", None),
        platform=device.platform,
        device_kind=device.device_kind,
        process_index=int(device.process_index),
        host=host,
        coords=[int(c) for c in coords] if coords is not None else None,
        core_on_chip=getattr(device, "core_on_chip", None),
        memory_limit_bytes=memory.get("memory_limit_bytes"),
        memory_used_bytes=memory.get("memory_used_bytes"),
        memory_peak_bytes=memory.get("memory_peak_bytes"),
    )


def runtime_record(jax_module: Any, include_remote: bool = True) -> RuntimeRecord:
    """Describe the initialised runtime: every global device, addressable ones with memory."""
    import jaxlib

    local = jax_module.local_devices()
    host = socket.gethostname()
    devices = jax_module.devices() if include_remote else local
    local_ids = {d.id for d in local}
    records = [
        device_record(d, host) if d.id in local_ids else device_record(d, f"process {d.process_index}", False)
        for d in devices
    ]
    first = local[0]
    return RuntimeRecord(
        platform=first.platform,
        platform_version=str(first.client.platform_version),
        process_index=int(jax_module.process_index()),
        process_count=int(jax_module.process_count()),
        device_count=len(devices),
        local_device_count=len(local),
        jax_version=jax_module.__version__,
        jaxlib_version=jaxlib.__version__,
        devices=records,
    )
