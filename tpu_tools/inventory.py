"""The device inventory behind `tpu-ls` (and the dump's device listing).

Joins passive discovery (chips, PCI, NUMA, holders) with what the PJRT runtime
reports (devices, memory, versions), querying the runtime in an isolated child
only when that is safe: a TPU held by another process is never opened unless
the caller forces it. Where asked, it also reads libtpu's metrics service, which
never opens the TPU: the running job's HBM use and duty cycle, paired with the
chips (or the runtime's devices) in order when the counts agree.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpu_tools.accelerators import spec_for_device_kind
from tpu_tools.metrics import amdsmi
from tpu_tools.metrics.amdsmi import AmdSmiSnapshot
from tpu_tools.metrics.chiphealth import HostHealth, name_frontends, read_host_health
from tpu_tools.metrics.libtpu import DEFAULT_TIMEOUT_S as METRICS_TIMEOUT_S
from tpu_tools.metrics.libtpu import DeviceFigures, LibtpuSnapshot, RuntimeStatus, UsageFigures, read_once
from tpu_tools.metrics.libtpu.pairing import pair_with_chips, served_devices
from tpu_tools.metrics.nvml import NvmlSnapshot, read_snapshot
from tpu_tools.metrics.nvml.reader import PendingRead
from tpu_tools.metrics.records.gpu import GpuRecord
from tpu_tools.pjrt import headstart, isolate, queries
from tpu_tools.pjrt.devices import DeviceRecord, RuntimeRecord
from tpu_tools.pjrt.discover import Chip, Discovery, Holder, discover
from tpu_tools.pjrt.pairing import GPU_PLATFORMS, local_order, match_chips
from tpu_tools.pjrt.placement import FreeChips, free_chips
from tpu_tools.pjrt.probe import ProbeResult
from tpu_tools.pjrt.runtime import RuntimePolicy
from tpu_tools.pjrt.tpuvm import SliceInfo, slice_info
from tpu_tools.versions import StackVersions, stack_versions

SCHEMA = "tpu-tools/ls/v1"

RUNTIME_OK = "ok"
RUNTIME_SKIPPED = "skipped"  # --no-runtime
RUNTIME_HELD = "held"  # a TPU is held by another process

@dataclass
class ServiceFigures:
    """What libtpu's metrics service says of one listed device or chip (summed over a chip's devices)."""

    address: str
    device_ids: list[int]  # as the serving runtime numbers them
    usage: UsageFigures

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "device_ids": list(self.device_ids), **self.usage.to_dict()}


@dataclass
class DeviceEntry:
    """One PJRT device with the chip it sits on, as far as that is known."""

    device: DeviceRecord
    chip: Chip | None = None
    probe: ProbeResult | None = None
    libtpu: ServiceFigures | None = None

    @property
    def holders(self) -> list[Holder]:
        return self.chip.holders if self.chip else []

    def to_dict(self) -> dict[str, Any]:
        data = self.device.to_dict()
        chip = self.chip
        spec = spec_for_device_kind(self.device.device_kind)
        data.update(
            chip_index=chip.index if chip else None,
            devices_per_chip=(chip.devices_per_chip if chip else None) or (spec.devices_per_chip if spec else None),
            cores_per_chip=(chip.cores_per_chip if chip else None) or (spec.cores_per_chip if spec else None),
            pci_address=chip.pci_address if chip else None,
            numa_node=chip.numa_node if chip else None,
            holders=[h.to_dict() for h in self.holders],
            probe=self.probe.to_dict() if self.probe else None,
            libtpu=self.libtpu.to_dict() if self.libtpu else None,
        )
        return data


def gpu_holders(gpu: GpuRecord) -> list[Holder]:
    """The processes the GPU's driver lists on it, as holders (those of other containers included)."""
    return [Holder(p.pid, p.user or "", p.command or "") for p in gpu.processes]


@dataclass
class DeviceSummary:
    """One device of the listing in flat figures: a PJRT device, else a GPU the driver lists, else a chip.

    Memory and utilization come from the best source there is: a GPU's driver (NVML, amdsmi), libtpu's
    metrics service, then PJRT's allocator in the listing process. None where no source says.
    """

    index: int  # the row's position in the listing
    platform: str
    name: str
    device_id: int | None = None  # the PJRT device id, where the runtime was opened
    chip_index: int | None = None
    pci_address: str | None = None
    numa_node: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_percent: float | None = None  # a GPU's utilization, a TPU's duty cycle
    temperature_celsius: float | None = None
    power_draw_watts: float | None = None
    holders: list[Holder] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The device as a flat dict, its holders as tpu-ls --json writes them."""
        data = asdict(self)
        data["holders"] = [h.to_dict() for h in self.holders]
        return data


@dataclass
class Inventory:
    host: str
    time: str
    requested_platform: str
    runtime_status: str
    versions: StackVersions
    discovery: Discovery
    runtime: RuntimeRecord | None = None
    devices: list[DeviceEntry] = field(default_factory=list)
    probed: bool = False
    notes: list[str] = field(default_factory=list)
    libtpu: list[LibtpuSnapshot] = field(default_factory=list)  # one per metrics address asked
    libtpu_status: list[RuntimeStatus] | None = None  # when asked for
    tpu_slice: SliceInfo = field(default_factory=SliceInfo)  # the TPU slice this host is a worker of
    chip_libtpu: dict[int, ServiceFigures] = field(default_factory=dict)  # chip index -> service figures
    nvml: NvmlSnapshot | None = None  # NVIDIA GPUs as the driver's NVML reports them (None: not read)
    amdsmi: AmdSmiSnapshot | None = None  # AMD GPUs as amdsmi reports them (None: not read)
    tpu_health: HostHealth | None = None  # what the agents of the jobs holding TPU chips read (None: not asked)

    @property
    def gpu_snapshots(self) -> list[NvmlSnapshot]:
        """The reads (NVML's, amdsmi's) that list GPUs."""
        return [s for s in (self.nvml, self.amdsmi) if s is not None and s.gpus]

    @property
    def libtpu_paired(self) -> bool:
        return bool(self.chip_libtpu) or any(e.libtpu for e in self.devices)

    def all_notes(self) -> list[str]:
        """Discovery's notes, then the inventory's, then one about service figures that could not be paired."""
        notes = [*self.discovery.notes, *self.notes, *(self.tpu_health.notes if self.tpu_health else [])]
        served = sum(len(s.devices) for s in self.libtpu if s.ok)
        if served and not self.libtpu_paired:
            chips = len(self.discovery.chips_for_platform("tpu"))
            notes.append(f"the libtpu metrics service reports {served} devices, which do not pair with this "
                         f"host's {chips} TPU chips: its figures are listed by service device")
        return notes

    @property
    def probe_failed(self) -> bool:
        return self.probed and (not self.devices or any(e.probe is None or not e.probe.ok for e in self.devices))

    def to_dict(self) -> dict[str, Any]:
        runtime = None
        if self.runtime is not None:
            runtime = {k: v for k, v in asdict(self.runtime).items() if k != "devices"}
        return {
            "schema": SCHEMA,
            "host": self.host,
            "time": self.time,
            "requested_platform": self.requested_platform,
            "runtime_status": self.runtime_status,
            "runtime": runtime,
            "versions": self.versions.to_dict(),
            "devices": [entry.to_dict() for entry in self.devices],
            "chips": [{**chip.to_dict(), "libtpu": self._chip_libtpu(chip), "tpu_health": self._chip_health(chip)}
                      for chip in self.discovery.chips],
            "notes": self.all_notes(),
            "libtpu_metrics": [snapshot.to_dict() for snapshot in self.libtpu],
            "libtpu_runtime_status": (None if self.libtpu_status is None
                                      else [status.to_dict() for status in self.libtpu_status]),
            "tpu_slice": self.tpu_slice.to_dict(),
            "tpu_health": (None if self.tpu_health is None
                           else [job.to_dict() for job in self.tpu_health.jobs]),
            "nvml": self._gpu_dict(self.nvml),
            "amdsmi": self._gpu_dict(self.amdsmi),
        }

    def summaries(self) -> list[DeviceSummary]:
        """One flat record per device: the runtime's devices when it was opened, else the chips found."""
        # The runtime's devices, unless it opened another platform than the chips found (the CPU on a GPU host).
        if self.devices and (not self.discovery.chips or any(e.chip is not None for e in self.devices)):
            return [self._summary(index, entry.chip, entry) for index, entry in enumerate(self.devices)]
        return [self._summary(index, chip, None) for index, chip in enumerate(self.discovery.chips)]

    def _summary(self, index: int, chip: Chip | None, entry: DeviceEntry | None) -> DeviceSummary:
        gpu = next((g for s in self.gpu_snapshots if chip is not None
                    for g in [s.gpu_for_pci(chip.pci_address)] if g is not None), None)
        device = entry.device if entry else None
        summary = DeviceSummary(index=index, platform=device.platform if device else chip.platform if chip else "",
                                name=(device.device_kind if device else chip.name if chip else ""),
                                device_id=device.id if device else None,
                                chip_index=chip.index if chip else None,
                                pci_address=chip.pci_address if chip else None,
                                numa_node=chip.numa_node if chip else None,
                                holders=list(chip.holders) if chip else [])
        service = entry.libtpu if entry and entry.libtpu else self.chip_libtpu.get(chip.index) if chip else None
        if gpu is not None:
            summary.memory_total_bytes, summary.memory_used_bytes = gpu.memory_total_bytes, gpu.memory_used_bytes
            summary.utilization_percent = gpu.utilization_gpu_percent
            summary.temperature_celsius, summary.power_draw_watts = gpu.temperature_celsius, gpu.power_draw_watts
            known = {h.pid for h in summary.holders}
            summary.holders += [h for h in gpu_holders(gpu) if h.pid not in known]
        elif service is not None:
            summary.memory_total_bytes = service.usage.hbm_total_bytes
            summary.memory_used_bytes = service.usage.hbm_used_bytes
            summary.utilization_percent = service.usage.duty_cycle_percent
        elif device is not None:
            summary.memory_total_bytes, summary.memory_used_bytes = device.memory_limit_bytes, device.memory_used_bytes
        if summary.memory_total_bytes is None and chip is not None:
            summary.memory_total_bytes = chip.hbm_bytes
        return summary

    def free_chips(self) -> list[FreeChips]:
        """Per platform, the chips no process holds and the environment that pins a new job to them; a GPU
        process that the driver lists and /proc does not show (another container) holds its GPU too."""
        held_elsewhere = {gpu.pci_bus_id: gpu_holders(gpu) for snapshot in self.gpu_snapshots
                          for gpu in snapshot.gpus if gpu.pci_bus_id}
        return free_chips(self.discovery, held_elsewhere)

    def gpu_chip(self, pci_bus_id: str | None) -> Chip | None:
        """The chip passive discovery found at an NVML GPU's PCI bus id."""
        return next((c for c in self.discovery.chips if pci_bus_id and c.pci_address.lower() == pci_bus_id), None)

    def _gpu_dict(self, snapshot: NvmlSnapshot | None) -> dict[str, Any] | None:
        if snapshot is None:
            return None
        data = snapshot.to_dict()
        for gpu, record in zip(data["gpus"], snapshot.gpus, strict=True):
            chip = self.gpu_chip(record.pci_bus_id)
            gpu["chip_index"] = chip.index if chip else None
            gpu["numa_node"] = chip.numa_node if chip else None
        return data

    def _chip_health(self, chip: Chip) -> dict[str, Any] | None:
        health = self.tpu_health.chips.get(chip.index) if self.tpu_health else None
        return health.to_dict() if health else None

    def _chip_libtpu(self, chip: Chip) -> dict[str, Any] | None:
        figures = self.chip_libtpu.get(chip.index)
        return figures.to_dict() if figures else None


def _figures(group: list[tuple[str, DeviceFigures]]) -> ServiceFigures:
    return ServiceFigures(address=",".join(dict.fromkeys(address for address, _ in group)),
                          device_ids=[device.device_id for _, device in group],
                          usage=UsageFigures.combine([device for _, device in group]))


def attach_libtpu(inventory: Inventory, snapshots: list[LibtpuSnapshot]) -> None:
    """Pair a read of the metrics services with the listed devices and chips (again on every refresh).

    Service devices of every answering address, in address order, go to this process's runtime devices
    (TPU only) and to the TPU chips in order, when the counts agree.
    """
    inventory.libtpu = snapshots
    inventory.chip_libtpu = {}
    for entry in inventory.devices:
        entry.libtpu = None
    served = served_devices(snapshots)
    if not served:
        return
    runtime = inventory.runtime
    if runtime is not None and runtime.platform == "tpu":
        entries = {e.device.id: e for e in inventory.devices}
        local = local_order(runtime)
        if len(local) == len(served):
            for device, pair in zip(local, served):
                entries[device.id].libtpu = _figures([pair])
    chips = inventory.discovery.chips_for_platform("tpu")
    for chip, group in zip(chips, pair_with_chips(served, chips) or []):
        inventory.chip_libtpu[chip.index] = _figures(group)


def _nvml_answers_for_runtime(policy: RuntimePolicy, *snapshots: NvmlSnapshot | None) -> bool:
    """NVML (or amdsmi) lists GPUs that are what the runtime would open: the runtime (a CUDA or HIP context)
    is not needed."""
    if not any(s is not None and s.available and s.gpus for s in snapshots):
        return False
    platforms = policy.requested_platforms()
    return not platforms or any(p in GPU_PLATFORMS for p in platforms)


def build_inventory(policy: RuntimePolicy, *, timeout_s: float = isolate.DEFAULT_TIMEOUT_S,
                    probe: bool = False, use_runtime: bool = True, force: bool = False,
                    metrics_addresses: Sequence[str] = (), metrics_timeout_s: float = METRICS_TIMEOUT_S,
                    libtpu_status: bool = False, nvml_timeout_s: float | None = None,
                    nvml_pending: PendingRead | None = None, agent_timeout_s: float | None = None) -> Inventory:
    """The listing. metrics_addresses: libtpu metrics services to read (none: do not read any).

    On a host whose GPUs NVML lists, the runtime is started only with `probe` or `force`: NVML has the
    card's own figures, and a PJRT client would create a CUDA context on every GPU. nvml_pending: a read
    the caller started early (see `tpu_tools.metrics.nvml.reader.PendingRead`). agent_timeout_s: ask the agents
    of the processes holding TPU chips for the chips' ICI link health and throttle scores (None: do not).
    """
    discovery = discover()
    has_gpu = any(c.platform in GPU_PLATFORMS for c in discovery.chips)
    held = headstart.tpu_holders(policy, discovery) if use_runtime and not force else []
    call = None
    if use_runtime and not held and not headstart.gpu_driver_present():
        # Start the runtime first (or take the child the entry point started): it takes longest, and the rest
        # (NVML, amdsmi, libtpu's service, the slice's metadata) runs while it starts. Only a GPU driver's own
        # library could make it unneeded (below).
        call = headstart.take_or_start(queries.LIST_DEVICES, {"probe": probe}, policy, timeout_s)
    else:
        headstart.cancel()
    # NVML answers in a fraction of a second when it works and at once when the library is absent; a GPU
    # whose calls hang costs at most the deadline.
    nvml = None
    if has_gpu or not discovery.chips:
        nvml = nvml_pending.result() if nvml_pending is not None else read_snapshot(
            timeout_s if nvml_timeout_s is None else nvml_timeout_s)
    if nvml is not None:
        nvml.place_unidentified([chip.pci_address for chip in discovery.chips if chip.vendor == "nvidia"])
    amd = None
    if any(c.vendor == "amd" for c in discovery.chips) or not discovery.chips:
        amd = amdsmi.read_snapshot(timeout_s if nvml_timeout_s is None else nvml_timeout_s)
        amd.place_unidentified([chip.pci_address for chip in discovery.chips if chip.vendor == "amd"])
    nvml_only = _nvml_answers_for_runtime(policy, nvml, amd) and not probe and not force
    if nvml_only and call is not None:  # a driver library without its device node: it listed the GPUs after all
        call.kill()
        call = None
    if use_runtime and not held and not nvml_only and call is None:
        call = isolate.start_isolated(queries.LIST_DEVICES, {"probe": probe}, policy, timeout_s)
    inventory = Inventory(
        host=socket.gethostname(),
        time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        requested_platform=policy.display_platform(),
        runtime_status=RUNTIME_HELD if held else RUNTIME_SKIPPED,
        versions=stack_versions(),
        discovery=discovery,
        probed=probe,
        nvml=nvml,
        amdsmi=amd,
    )
    if use_runtime and nvml_only:
        lister = "NVML" if nvml is not None and nvml.gpus else "amdsmi"
        inventory.notes.append(f"the PJRT runtime was not started: {lister} lists the GPUs without creating a "
                               f"{'CUDA' if lister == 'NVML' else 'HIP'} context (--probe or --force starts it)")
    if held:
        owners = ", ".join(f"{h.pid} ({h.command.split(' ')[0]})" for h in held)
        inventory.notes.append(f"the TPU is held by process {owners}: runtime details need the device "
                               "to be free (or --force, which may disturb that process)")
    snapshots: list[LibtpuSnapshot] = []
    if metrics_addresses:  # while the runtime child starts
        snapshots, inventory.libtpu_status = read_once(
            metrics_addresses, metrics_timeout_s, runtime_status=libtpu_status, include_hlo_info=libtpu_status)
    # The metadata server is asked only on a TPU host that is a GCE VM (and within the metrics deadline).
    inventory.tpu_slice = slice_info(metadata_timeout_s=min(metrics_timeout_s, 1.0),
                                     ask_metadata=bool(discovery.chips_for_platform("tpu")))
    if agent_timeout_s is not None:  # over the agents' sockets, while the runtime child starts
        inventory.tpu_health = read_host_health(discovery, agent_timeout_s, exclude_pids=frozenset({os.getpid()}))
        name_frontends(discovery, inventory.tpu_health)
    if call is not None:
        _add_runtime(inventory, call.result(), discovery)
    attach_libtpu(inventory, snapshots)
    return inventory


def _add_runtime(inventory: Inventory, answer: dict[str, Any], discovery: Discovery) -> None:
    runtime = RuntimeRecord.from_dict(answer["runtime"])
    chips = match_chips(runtime, discovery)
    probes = {p["device_id"]: ProbeResult.from_dict(p) for p in answer.get("probe", [])}
    inventory.runtime = runtime
    inventory.runtime_status = RUNTIME_OK
    inventory.devices = [DeviceEntry(d, chips.get(d.id), probes.get(d.id)) for d in runtime.devices]
    if runtime.platform == "tpu" and discovery.chips_for_platform("tpu") and not chips:
        inventory.notes.append("could not pair PJRT devices with PCI chips (counts differ)")
