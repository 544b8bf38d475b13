"""The benchmark's NVIDIA GPU as NVML sees it at the end of a case: clocks, heat, power, and what holds them.

A GPU's clocks follow its power and temperature: an H100 under a long bf16 GEMM
can fall from its boost clock to well under it within seconds, and a GEMM's rate
with it. Recorded beside each case (`values.interference.gpu`), the reading says
why a case's repeats moved, and a GPU slowed by heat or by a power brake (not by
the ordinary power cap of a busy GPU) makes the case noisy on its own.
"""

from __future__ import annotations

import os
from typing import Any

from tpu_tools.metrics.nvml.decode import POWER_REASONS, THERMAL_REASONS
from tpu_tools.metrics.nvml.reader import NvmlReader
from tpu_tools.metrics.records.gpu import STATUS_OK, GpuRecord
from tpu_tools.parsing import ascii_digits

READ_TIMEOUT_S = 2.0
# Reasons that are no slowdown: an idle GPU, clocks set by hand, a display, boost sync across GPUs.
NOT_SLOWDOWNS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"})
# Reasons that make a figure untrustworthy by themselves: the GPU is slowed by heat or by a power brake.
SLOWED_BY_FAULT = THERMAL_REASONS | POWER_REASONS


def nvml_index(cuda_ordinal: int, visible: str | None) -> int | str | None:
    """The NVML index (or UUID) of the GPU CUDA numbers `cuda_ordinal`, under CUDA_VISIBLE_DEVICES=`visible`.

    NVML numbers GPUs in PCI order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID and, on a host of one
    GPU model, by default. None when `visible` hides the ordinal.
    """
    if not visible or not visible.strip():
        return cuda_ordinal
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if cuda_ordinal >= len(entries):
        return None
    entry = entries[cuda_ordinal]
    return int(entry) if ascii_digits(entry) else entry  # "²" passes str.isdigit() and makes int() raise


class GpuClocks:
    """Reads one GPU's state through NVML; `read()` is None where NVML cannot tell."""

    def __init__(self, cuda_ordinal: int, environ: dict[str, str] | None = None):
        environ = dict(os.environ) if environ is None else environ
        self.target = nvml_index(cuda_ordinal, environ.get("CUDA_VISIBLE_DEVICES"))
        self._reader = NvmlReader()

    def read(self) -> dict[str, Any] | None:
        if self.target is None:
            return None
        snapshot = self._reader.read(READ_TIMEOUT_S)
        gpu = next((g for g in snapshot.gpus if self._is_target(g)), None)
        if not snapshot.available or gpu is None or gpu.status != STATUS_OK:
            return None
        reasons = [r for r in gpu.clock_event_reasons or [] if r not in NOT_SLOWDOWNS]
        return {"index": gpu.index, "name": gpu.name, "sm_clock_mhz": _mhz(gpu.clock_sm_hz),
                "sm_clock_max_mhz": _mhz(gpu.clock_sm_max_hz), "temperature_celsius": gpu.temperature_celsius,
                "power_draw_watts": gpu.power_draw_watts, "power_limit_watts": gpu.power_limit_watts,
                "clock_event_reasons": reasons}

    def close(self) -> None:
        self._reader.close()

    def _is_target(self, gpu: GpuRecord) -> bool:
        if isinstance(self.target, int):
            return gpu.index == self.target
        return bool(gpu.uuid) and str(gpu.uuid).startswith(str(self.target))


def _mhz(hz: float | None) -> float | None:
    return None if hz is None else round(hz / 1e6)


def slowdown_sentence(gpu: dict[str, Any]) -> str | None:
    """'the GPU's clocks were held back (...)' with the figures, or None when nothing held them."""
    reasons = gpu.get("clock_event_reasons") or []
    if not reasons:
        return None
    figures = []
    if gpu.get("sm_clock_mhz") is not None and gpu.get("sm_clock_max_mhz"):
        figures.append(f"SM clock {gpu['sm_clock_mhz']:.0f} of {gpu['sm_clock_max_mhz']:.0f} MHz")
    if gpu.get("temperature_celsius") is not None:
        figures.append(f"{gpu['temperature_celsius']:.0f} C")
    if gpu.get("power_draw_watts") is not None and gpu.get("power_limit_watts"):
        figures.append(f"{gpu['power_draw_watts']:.0f} of {gpu['power_limit_watts']:.0f} W")
    said = f": {', '.join(figures)}" if figures else ""
    return f"the GPU's clocks were held back at the end of the case ({', '.join(reasons)}){said}"
