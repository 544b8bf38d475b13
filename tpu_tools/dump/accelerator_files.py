"""What tpu-dump's summary reads of a bundle's accelerator files, as records decoded with msgspec.

`accelerators/discovery.json` (passive discovery, with each holder's process state),
`accelerators/runtime.json` (tpu-ls's document, with the probe of each device) and the GPU libraries'
snapshots (`accelerators/nvml.json`, `accelerators/amdsmi.json`). Only the fields the findings
read are declared; a file of another shape is a ValueError naming the field (the summary notes it), an absent
one is None.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from tpu_tools.dump.reader import Bundle, BundleError

DISCOVERY = "accelerators/discovery.json"
RUNTIME = "accelerators/runtime.json"


class NodeHolder(msgspec.Struct, kw_only=True):
    """A process holding a device node, with the state tpu-dump read from /proc."""

    pid: int | None = None
    command: str | None = None
    state: str | None = None  # /proc's one-letter state: R, S, D, Z, X...
    state_name: str | None = None
    alive: bool | None = None


class DeviceNodeFile(msgspec.Struct, kw_only=True):
    path: str | None = None
    exists: bool = False
    accessible: bool | None = None  # whether the user who ran tpu-dump could open it
    mode: str | None = None
    uid: int | None = None
    gid: int | None = None
    holders: list[NodeHolder] = msgspec.field(default_factory=list)


class ChipFile(msgspec.Struct, kw_only=True):
    device_nodes: list[DeviceNodeFile] = msgspec.field(default_factory=list)


class DiscoveryFile(msgspec.Struct, kw_only=True):
    chips: list[ChipFile] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class ProbeFile(msgspec.Struct, kw_only=True):
    ok: bool | None = None
    error: str | None = None


class RuntimeDeviceFile(msgspec.Struct, kw_only=True):
    id: int | None = None
    device_kind: str | None = None
    probe: ProbeFile | None = None


class RuntimeFile(msgspec.Struct, kw_only=True):
    runtime_status: str | None = None
    devices: list[RuntimeDeviceFile] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class GpuSnapshotFile(msgspec.Struct, kw_only=True):
    """An NVML or amdsmi snapshot, its GPUs left to decode one by one (records.gpu.GpuRecord)."""

    gpus: list[msgspec.Raw] = msgspec.field(default_factory=list)


_F = TypeVar("_F", bound=msgspec.Struct)


def read_file(bundle: Bundle, name: str, record_type: type[_F]) -> _F | None:
    """The bundle's member `name` decoded into `record_type`; None when the bundle lacks it or it is unsafe."""
    try:
        data = bundle.read(name)
    except BundleError:
        return None
    return msgspec.json.decode(data, type=record_type)
