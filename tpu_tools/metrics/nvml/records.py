"""One read of NVML: its versions and the GPUs' records (tpu_tools.metrics.records.gpu)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from tpu_tools.metrics.records.gpu import GpuRecord


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
            "gpus": msgspec.to_builtins(self.gpus),
        }
