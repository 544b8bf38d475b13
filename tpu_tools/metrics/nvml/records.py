"""Records of what NVML says about the GPUs of this host (one snapshot), in SI units with the unit in the name.

A field the driver does not support (or that this driver's NVML lacks) is None, and its name is listed in
`unsupported` with NVML's reason; it is never an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STATUS_OK = "ok"
STATUS_LOST = "lost"  # NVML answered GPU_IS_LOST: the GPU fell off the bus or needs a reset
STATUS_NOT_ANSWERING = "not_answering"  # an NVML call on it did not return within the deadline
STATUS_ERROR = "error"  # NVML could not give a handle for it


@dataclass
class GpuProcess:
    """A process with a context on the GPU, as NVML lists it, with what /proc says of it."""

    pid: int
    kind: str  # "compute" or "graphics"
    gpu_memory_bytes: int | None
    sm_utilization_percent: float | None = None  # NVML's recent per-process sample, where it keeps them
    memory_utilization_percent: float | None = None
    visible: bool = True  # False: not in this /proc (another PID namespace, e.g. a container)
    user: str | None = None
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GpuRecord:
    index: int
    status: str = STATUS_OK
    error: str | None = None
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None  # the board's serial where the source gives it (amdsmi's ASIC serial)
    pci_bus_id: str | None = None  # sysfs form, lower case: 0000:18:00.0
    minor_number: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # the driver's own, excluded from used by the v2 call
    memory_free_bytes: int | None = None
    memory_info_version: int | None = None  # 2 where the driver has the v2 call, else 1 (used includes reserved)
    utilization_gpu_percent: float | None = None
    utilization_memory_percent: float | None = None
    temperature_celsius: float | None = None  # NVIDIA: the core; AMD: edge, else hotspot
    temperature_hotspot_celsius: float | None = None  # AMD's hotspot (junction) sensor
    temperature_memory_celsius: float | None = None  # AMD's VRAM (HBM) sensor
    power_draw_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since the driver was loaded
    clock_sm_hz: float | None = None
    clock_sm_max_hz: float | None = None
    clock_memory_hz: float | None = None
    clock_memory_max_hz: float | None = None
    performance_state: int | None = None  # 0 is P0, the highest
    clock_event_reasons_mask: int | None = None
    clock_event_reasons: list[str] | None = None  # decoded to words (decode.CLOCK_EVENT_REASONS)
    ecc_enabled: bool | None = None
    ecc_volatile_uncorrected_errors: int | None = None
    ecc_aggregate_uncorrected_errors: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    mig_enabled: bool | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None
    nvlink_links_active: int | None = None
    nvlink_links: int | None = None
    nvlink_tx_bytes_total: int | None = None
    nvlink_rx_bytes_total: int | None = None
    pcie_replay_errors: int | None = None  # PCIe replays since the driver was loaded
    fan_speed_percent: float | None = None
    nvlink_replay_errors: int | None = None  # all links, since the driver was loaded
    nvlink_recovery_errors: int | None = None
    nvlink_crc_errors: int | None = None
    nvlink_links_down: list[int] | None = None  # the board's links that are not active
    # MIG mode's instances, as found at the read: [{index, gpu_instance_id, compute_instance_id,
    # memory_used_bytes, memory_total_bytes}] (None: MIG off or not read)
    mig_instances: list[dict[str, Any]] | None = None
    xid_errors: dict[str, int] | None = None  # XID code -> events since the monitor started (None: not watched)
    xid_last: dict[str, Any] | None = None  # {code, time_unix_s, description} of the last XID event
    processes: list[GpuProcess] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)  # field -> NVML's reason

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["processes"] = [p.to_dict() for p in self.processes]
        return data


@dataclass
class NvmlSnapshot:
    """One read of NVML. available is False when NVML could not be used at all (error says why)."""

    available: bool
    error: str | None = None
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None  # "13.0"
    gpus: list[GpuRecord] = field(default_factory=list)
    elapsed_ms: float | None = None

    def gpu_for_pci(self, address: str | None) -> GpuRecord | None:
        if address is None:
            return None
        wanted = address.lower()
        return next((g for g in self.gpus if g.pci_bus_id == wanted), None)

    def place_unidentified(self, addresses: list[str]) -> None:
        """Give GPUs that could not tell their bus id (lost, hung) the NVIDIA PCI addresses left over.

        NVML numbers GPUs in PCI bus order, so the GPUs left pair with the addresses left, in order,
        when the counts agree. addresses: every NVIDIA GPU's PCI address from passive discovery.
        """
        known = {g.pci_bus_id for g in self.gpus if g.pci_bus_id}
        free = sorted(a.lower() for a in addresses if a.lower() not in known)
        unplaced = [g for g in self.gpus if not g.pci_bus_id]
        if unplaced and len(unplaced) == len(free):
            for gpu, address in zip(unplaced, free, strict=True):
                gpu.pci_bus_id = address

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "error": self.error,
            "driver_version": self.driver_version,
            "nvml_version": self.nvml_version,
            "cuda_driver_version": self.cuda_driver_version,
            "elapsed_ms": self.elapsed_ms,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NvmlSnapshot:
        gpus = []
        for raw in data.get("gpus") or []:
            known = {k: v for k, v in raw.items() if k in GpuRecord.__dataclass_fields__ and k != "processes"}
            gpu = GpuRecord(**known)
            gpu.processes = [GpuProcess(**{k: v for k, v in p.items() if k in GpuProcess.__dataclass_fields__})
                             for p in raw.get("processes") or []]
            gpus.append(gpu)
        return cls(available=bool(data.get("available")), error=data.get("error"),
                   driver_version=data.get("driver_version"), nvml_version=data.get("nvml_version"),
                   cuda_driver_version=data.get("cuda_driver_version"), gpus=gpus,
                   elapsed_ms=data.get("elapsed_ms"))
