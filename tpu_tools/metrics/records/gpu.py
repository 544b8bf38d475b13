"""The `nvml` and `amdsmi` groups: GPUs as their vendor's library reports them, in one record for both vendors.

SI units with the unit in the name. A figure the driver does not support (or that this driver's library lacks)
is None, and its name is listed in `unsupported` with the library's reason; it is never an error.
"""

from __future__ import annotations

import msgspec

from tpu_tools.metrics.records.group import GroupRecord

STATUS_OK = "ok"
STATUS_LOST = "lost"  # NVML answered GPU_IS_LOST: the GPU fell off the bus or needs a reset
STATUS_NOT_ANSWERING = "not_answering"  # a call on it did not return within the deadline
STATUS_ERROR = "error"  # the library could not give a handle for it


class GpuProcess(msgspec.Struct, kw_only=True):
    """A process with a context on the GPU, as the library lists it, with what /proc says of it."""

    pid: int
    kind: str  # "compute" or "graphics"
    gpu_memory_bytes: int | None
    sm_utilization_percent: float | None = None  # NVML's recent per-process sample, where it keeps them
    memory_utilization_percent: float | None = None
    visible: bool = True  # False: not in this /proc (another PID namespace, e.g. a container)
    user: str | None = None
    command: str | None = None
    # The monitor's groups only (tpu-ls and tpu-dump leave them out): its agent's tag, its Slurm job.
    tag: str | None | msgspec.UnsetType = msgspec.UNSET
    slurm_job_id: str | None | msgspec.UnsetType = msgspec.UNSET


class MigInstance(msgspec.Struct, kw_only=True):
    """A MIG instance of the GPU as found at the read."""

    index: int
    gpu_instance_id: int
    compute_instance_id: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


class XidEvent(msgspec.Struct, kw_only=True):
    """The last XID event of a GPU, with what its code means."""

    code: int
    time_unix_s: float
    description: str | None = None


class GpuRecord(msgspec.Struct, kw_only=True):
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
    clock_event_reasons: list[str] | None = None  # decoded to words (nvml.decode.CLOCK_EVENT_REASONS)
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
    mig_instances: list[MigInstance] | None = None  # None: MIG off or not read
    xid_errors: dict[str, int] | None = None  # XID code -> events since the monitor started (None: not watched)
    xid_last: XidEvent | None = None
    processes: list[GpuProcess] = msgspec.field(default_factory=list)
    unsupported: dict[str, str] = msgspec.field(default_factory=dict)  # field -> the library's reason
    # The devices group's key of this GPU (the monitor's groups only; None: not placed).
    device_key: str | None | msgspec.UnsetType = msgspec.UNSET

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK


class GpusRecord(GroupRecord, kw_only=True):
    """One read of a GPU library (NVML or amdsmi). available is False when it could not be used at all: the
    group's error says why, or its notes on a host without a GPU of the vendor."""

    available: bool = False
    driver_version: str | None = None
    nvml_version: str | None | msgspec.UnsetType = msgspec.UNSET  # NVML's group only
    cuda_driver_version: str | None | msgspec.UnsetType = msgspec.UNSET  # NVML's group only: "13.0"
    elapsed_ms: float | None = None
    gpus: list[GpuRecord] = msgspec.field(default_factory=list)
    source: str | msgspec.UnsetType = msgspec.UNSET  # amdsmi's group only: "amdsmi"
    bindings_version: str | None | msgspec.UnsetType = msgspec.UNSET  # amdsmi's group only: its Python package
    notes: list[str] = msgspec.field(default_factory=list)
