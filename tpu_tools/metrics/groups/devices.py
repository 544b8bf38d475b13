"""The `devices` group: accelerator devices from passive discovery, with runtime figures where known.

Hardware comes from `tpu_tools.pjrt.discover` (sysfs, /dev, /proc): the monitor
never opens a runtime itself, so it never takes a TPU. Runtime figures come
from the agents (the devices of each agent-attached process, paired with the
chips as tpu-ls pairs them) and from any other source with per-device figures
(`DeviceFigures`, e.g. libtpu's metrics service). Devices that belong to one
process only and have no hardware behind them (the CPU platform) are listed
per process.
"""

from __future__ import annotations

import msgspec

from tpu_tools.accelerators import spec_for_device_kind
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, DeviceFigures, DeviceHolders
from tpu_tools.metrics.records.agent import AgentSnapshot
from tpu_tools.metrics.records.agent import Device as AgentDevice
from tpu_tools.metrics.records.devices import Device, DeviceHolder, DeviceProcess, DevicesRecord
from tpu_tools.pjrt.devices import DeviceRecord, RuntimeRecord
from tpu_tools.pjrt.discover import Chip, Holder
from tpu_tools.pjrt.pairing import GPU_PLATFORMS, match_chips


def _family(platform: str | None) -> str:
    return "gpu" if platform in GPU_PLATFORMS else (platform or "?")


def _holders(held: list[Holder]) -> list[DeviceHolder]:
    return [DeviceHolder(pid=h.pid, user=h.user, command=h.command, frontend=h.frontend) for h in held]


def _new_entry(key: str, platform: str, device_id: int, name: str, chip: Chip | None,
               held: DeviceHolders | None = None) -> Device:
    total = None
    if chip is not None and chip.hbm_bytes:
        total = chip.hbm_bytes // (chip.devices_per_chip or 1)
    return Device(key=key, platform=platform, id=device_id, name=name, chip_index=chip.index if chip else None,
                  pci_address=chip.pci_address if chip else None, memory_total_bytes=total,
                  holders=_holders(held.holders) if held else [], holders_source=held.source if held else None,
                  sources=["discovery"] if chip else [])


def _add(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value


def _merge_agent_device(entry: Device, device: AgentDevice, pid: int, tag: str | None) -> None:
    entry.memory_used_bytes = _add(entry.memory_used_bytes, device.memory_used_bytes)
    entry.memory_peak_bytes = _add(entry.memory_peak_bytes, device.memory_peak_bytes)
    entry.live_array_bytes = _add(entry.live_array_bytes, device.live_array_bytes)
    entry.live_array_count = _add(entry.live_array_count, device.live_array_count)
    if device.memory_limit_bytes is not None:
        entry.memory_total_bytes = device.memory_limit_bytes
    entry.processes.append(DeviceProcess(pid=pid, tag=tag))
    if "agent" not in entry.sources:
        entry.sources.append("agent")


def _merge_figures(entry: Device, figures: DeviceFigures) -> None:
    # A source that reads the device itself (libtpu) knows its whole memory, agents only their own part.
    if figures.memory_used_bytes is not None:
        entry.memory_used_bytes = figures.memory_used_bytes
    if figures.memory_total_bytes is not None:
        entry.memory_total_bytes = figures.memory_total_bytes
    if figures.utilization_percent is not None:
        entry.utilization_percent = figures.utilization_percent
    given = {name: value for name, value in msgspec.structs.asdict(figures.extra).items() if value is not None}
    entry.extra = msgspec.structs.replace(entry.extra, **given)
    if figures.holders is not None:  # the vendor's list of the device's processes, not the device nodes'
        entry.holders = _holders(figures.holders)
        entry.holders_source = figures.source
    if figures.source not in entry.sources:
        entry.sources.append(figures.source)


def _runtime_of(snapshot: AgentSnapshot) -> RuntimeRecord | None:
    runtime, devices = snapshot.runtime, snapshot.devices or []
    if runtime is None or not devices:
        return None
    records = [DeviceRecord.from_dict(msgspec.structs.asdict(d)) for d in devices]
    return RuntimeRecord(platform=runtime.platform, platform_version=runtime.platform_version or "",
                         process_index=runtime.process_index or 0, process_count=runtime.process_count or 1,
                         device_count=len(records), local_device_count=len(records), jax_version="",
                         jaxlib_version="", devices=records)


def build_devices(context: CollectContext) -> DevicesRecord:
    """The `devices` group: discovered chips joined with the agents' devices and the sources' figures (a source
    that fails is left out, not raised)."""
    discovery = context.discovery()
    held = context.chip_holders()
    entries: list[Device] = []
    by_chip: dict[tuple[int, int], Device] = {}  # (chip index, device on chip) -> entry
    by_id: dict[tuple[str, int], Device] = {}  # (platform family, local id) -> hardware entry
    for chip in discovery.chips:
        family = _family(chip.platform)
        for k in range(chip.devices_per_chip or 1):
            device_id = sum(1 for e in entries if _family(e.platform) == family)
            entry = _new_entry(f"{family}:{device_id}", chip.platform, device_id, chip.name, chip, held[chip.index])
            entries.append(entry)
            by_chip[(chip.index, k)] = entry
            by_id[(family, device_id)] = entry
    notes = list(discovery.notes)
    for result in context.agents().results:
        snapshot = result.snapshot
        runtime = _runtime_of(snapshot) if snapshot else None
        if snapshot is None or runtime is None:
            continue
        chips = match_chips(runtime, discovery)
        seen_on_chip: dict[int, int] = {}
        for device, raw in sorted(zip(runtime.devices, snapshot.devices or []), key=lambda pair: pair[0].id):
            paired = chips.get(device.id)
            found = None
            if paired is not None:
                k = seen_on_chip.get(paired.index, 0)
                seen_on_chip[paired.index] = k + 1
                found = by_chip.get((paired.index, k))
            if found is None:  # no hardware to pair with: this process's own device
                name = device.device_kind
                spec = spec_for_device_kind(device.device_kind)
                found = _new_entry(f"{device.platform}:{device.id}@{result.pid}", device.platform, device.id,
                                   spec.name if spec else name, None)
                entries.append(found)
            _merge_agent_device(found, raw, result.pid, result.tag)
    for figures in context.device_figures():
        family = _family(figures.platform)
        known = by_id.get((family, figures.device_id))
        if known is None:
            known = _new_entry(f"{family}:{figures.device_id}", figures.platform, figures.device_id,
                               figures.platform, None)
            entries.append(known)
            by_id[(family, figures.device_id)] = known
        _merge_figures(known, figures)
    return DevicesRecord(devices=entries, chips=[chip.to_dict() for chip in discovery.chips], notes=notes)


class DevicesGroup:
    name = "devices"
    reads_agents = True  # the report asks the agents at the start of a round in which this group is due
    record_type = DevicesRecord

    def __init__(self, options: CollectOptions):
        pass

    def collect(self, context: CollectContext) -> DevicesRecord:
        return build_devices(context)
