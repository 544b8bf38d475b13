"""What tpu-dump's summary reads of a bundle's accelerator files, as records decoded with msgspec.

`accelerators/discovery.json` (passive discovery, with each holder's process state),
`accelerators/runtime.json` (tpu-ls's document, with the probe of each device), the agents' answers
(`accelerators/agents.json`) and the GPU libraries' snapshots (`accelerators/nvml.json`,
`accelerators/amdsmi.json`). Only the fields the findings
read are declared; a file of another shape is a ValueError naming the field (the summary notes it), an absent
one is None.
"""

from __future__ import annotations

from typing import Any, TypeVar

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
    name: str | None = None
    holders: list[NodeHolder] = msgspec.field(default_factory=list)
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


class RuntimeInfo(msgspec.Struct, kw_only=True):
    platform: str | None = None
    platform_version: str | None = None


class RuntimeFile(msgspec.Struct, kw_only=True):
    runtime_status: str | None = None
    runtime: RuntimeInfo | None = None
    devices: list[RuntimeDeviceFile] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class GpuSnapshotFile(msgspec.Struct, kw_only=True):
    """An NVML or amdsmi snapshot, its GPUs left to decode one by one (records.gpu.GpuRecord)."""

    gpus: list[msgspec.Raw] = msgspec.field(default_factory=list)


class AgentItem(msgspec.Struct, kw_only=True):
    """One agent of `accelerators/agents.json`: what tpu-dump asked it and what it answered. The fields other than
    the process are read as they are and kept only when of their type (a damaged entry still names its process)."""

    pid: int
    tag: Any = None
    socket: Any = None
    error: Any = None
    snapshot: Any = None  # the agent's answer, decoded into its own record (metrics.records.agent) where it fits


class AgentsFile(msgspec.Struct, kw_only=True):
    """`accelerators/agents.json`: its entries decoded one by one (one that does not fit is left out)."""

    agents: Any = None
    ignored_sockets: Any = None


class DiagnosticFile(msgspec.Struct, kw_only=True):
    """One of libtpu's stall, crash or compiler files in the bundle's diagnostics index."""

    path: str | None = None
    kind: str | None = None  # stall_summary, core_dump, compiler_metadata, ...
    decoded: str | None = None  # the bundle member holding it decoded, where it was
    error: str | None = None  # why it was not decoded


class DiagnosticsIndex(msgspec.Struct, kw_only=True):
    files: list[DiagnosticFile] = msgspec.field(default_factory=list)


class DecodedFile(msgspec.Struct, kw_only=True):
    decoded: Any = None  # libtpu's own document, as its decoder gave it


class CompilerMetadata(msgspec.Struct, kw_only=True):
    module_name: Any = None
    program_id: Any = None


_F = TypeVar("_F", bound=msgspec.Struct)


def read_file(bundle: Bundle, name: str, record_type: type[_F]) -> _F | None:
    """The bundle's member `name` decoded into `record_type`; None when the bundle lacks it or it is unsafe."""
    try:
        data = bundle.read(name)
    except BundleError:
        return None
    return msgspec.json.decode(data, type=record_type)
