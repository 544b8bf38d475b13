"""Text of the GPU figures NVML and amdsmi give: cells shared by tpu-ls and tpu-top, and tpu-ls's GPU table."""

from __future__ import annotations

from collections.abc import Callable

from tpu_tools.inventory import Inventory
from tpu_tools.metrics.amdsmi import AmdSmiSnapshot
from tpu_tools.metrics.nvml import STATUS_LOST, STATUS_NOT_ANSWERING, GpuProcess, GpuRecord, NvmlSnapshot
from tpu_tools.render.table import Column, TableData
from tpu_tools.shorten import shorten
from tpu_tools.units import MISSING, format_bytes, format_memory_pair

_COMMAND_WIDTH = 24
STATUS_TEXT = {STATUS_LOST: "LOST", STATUS_NOT_ANSWERING: "NOT ANSWERING"}


def util_text(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f}%"


def temperature_text(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} C"


def power_text(draw: float | None, limit: float | None) -> str:
    if draw is None:
        return MISSING
    return f"{draw:.0f} W" + (f" / {limit:.0f} W" if limit is not None else "")


def process_text(process: GpuProcess) -> str:
    if not process.visible:
        who = "(other PID namespace)"
    else:
        words = (process.command or "?").split()
        words[0] = words[0].rsplit("/", 1)[-1] if words else "?"
        who = " ".join(words)
        who = shorten(who, _COMMAND_WIDTH)
    return f"{process.pid} {who} {format_bytes(process.gpu_memory_bytes)}"


def processes_text(gpu: GpuRecord) -> str:
    return ", ".join(process_text(p) for p in gpu.processes) or MISSING


def gpu_table(gpus: list[GpuRecord], numa: Callable[[str | None], int | None] | None = None) -> TableData:
    """One row per NVML GPU: the card's memory, utilization, temperature, power and every process on it.

    numa: the NUMA node of a PCI bus id (from passive discovery), where known.
    """
    table = TableData([Column("GPU", "right"), Column("NAME"), Column("MEMORY USED / TOTAL", "right"),
                       Column("UTIL", "right"), Column("TEMP", "right"), Column("POWER", "right"), Column("PCI"),
                       Column("NUMA", "right"), Column("PROCESSES", max_width=_COMMAND_WIDTH + 40)])
    for gpu in gpus:
        node = numa(gpu.pci_bus_id) if numa else None
        numa_text = MISSING if node is None else node
        if not gpu.ok:
            table.add_row(gpu.index, gpu.name or MISSING, STATUS_TEXT.get(gpu.status, "ERROR"), MISSING, MISSING,
                          MISSING, gpu.pci_bus_id or MISSING, numa_text, gpu.error or MISSING)
            continue
        table.add_row(gpu.index, gpu.name or MISSING, format_memory_pair(gpu.memory_used_bytes, gpu.memory_total_bytes),
                      util_text(gpu.utilization_gpu_percent), temperature_text(gpu.temperature_celsius),
                      power_text(gpu.power_draw_watts, gpu.power_limit_watts), gpu.pci_bus_id or MISSING, numa_text,
                      processes_text(gpu))
    return table


def _link_text(current: int | None, maximum: int | None, prefix: str = "") -> str:
    if current is None:
        return MISSING
    degraded = " (!)" if maximum is not None and current < maximum else ""
    return f"{prefix}{current}" + (f"/{maximum}" if maximum is not None else "") + degraded


def _count(value: int | None) -> str:
    return MISSING if value is None else str(value)


def gpu_health_table(gpus: list[GpuRecord]) -> TableData:
    """tpu-ls -v: one row per GPU of what fails first on a node: links, fan, MIG, memory errors.

    A PCIe width below the link's maximum is marked (!): a bad riser or slot (a lower generation at idle
    is the driver saving power)."""
    table = TableData([Column("GPU", "right"), Column("PCIE GEN"), Column("PCIE WIDTH"), Column("REPLAYS", "right"),
                       Column("NVLINK UP"), Column("NVLINK ERR", "right"), Column("FAN", "right"), Column("MIG"),
                       Column("ECC UNCORR", "right"), Column("REMAPPED", "right")])
    for gpu in gpus:
        if not gpu.ok:
            table.add_row(gpu.index, *[MISSING] * 9)
            continue
        links = MISSING if gpu.nvlink_links is None else f"{gpu.nvlink_links_active}/{gpu.nvlink_links}" + (
            f" down: {','.join(str(d) for d in gpu.nvlink_links_down)}" if gpu.nvlink_links_down else "")
        errors = [gpu.nvlink_replay_errors, gpu.nvlink_recovery_errors, gpu.nvlink_crc_errors]
        nvlink_errors = MISSING if all(e is None for e in errors) else str(sum(e or 0 for e in errors))
        mig = MISSING if gpu.mig_enabled is None else ("on" if gpu.mig_enabled else "off")
        if gpu.mig_instances is not None:
            mig += f", {len(gpu.mig_instances)} instances"
        table.add_row(gpu.index, _link_text(gpu.pcie_link_generation, gpu.pcie_link_generation_max, "Gen"),
                      _link_text(gpu.pcie_link_width, gpu.pcie_link_width_max, "x"), _count(gpu.pcie_replay_errors),
                      links, nvlink_errors, util_text(gpu.fan_speed_percent), mig,
                      _count(gpu.ecc_volatile_uncorrected_errors), _count(gpu.remapped_rows_uncorrectable))
    return table


def inventory_gpu_table(inventory: Inventory, snapshot: NvmlSnapshot | None = None) -> TableData:
    """The GPU table of one read (NVML's unless another is given)."""
    def numa(pci_bus_id: str | None) -> int | None:
        chip = inventory.gpu_chip(pci_bus_id)
        return chip.numa_node if chip else None

    snapshot = inventory.nvml if snapshot is None else snapshot
    return gpu_table(snapshot.gpus if snapshot else [], numa)


def snapshot_driver_line(snapshot: NvmlSnapshot | None) -> str | None:
    if snapshot is None or not snapshot.available:
        return None
    if isinstance(snapshot, AmdSmiSnapshot):
        return (f"AMD GPU driver (amdgpu) {snapshot.driver_version or MISSING}, "
                f"amdsmi {snapshot.bindings_version or MISSING}")
    return f"NVIDIA driver {snapshot.driver_version or MISSING}, CUDA {snapshot.cuda_driver_version or MISSING}"


def driver_line(inventory: Inventory, snapshot: NvmlSnapshot | None = None) -> str | None:
    return snapshot_driver_line(inventory.nvml if snapshot is None else snapshot)
