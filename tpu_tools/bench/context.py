"""What every in-process benchmark needs: jax, the devices, their peaks, the timing settings.

Built once after the runtime policy is applied (`tpu_tools.pjrt.runtime.import_jax`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tpu_tools.bench.environment import peak_for_dtype
from tpu_tools.bench.failures import OutOfMemory
from tpu_tools.bench.records import BenchDevice
from tpu_tools.bench.timing import TimingSettings
from tpu_tools.units import format_bytes

MISMATCH_WARNING_FRACTION = 0.10  # analytic vs XLA counts further apart than this are reported


@dataclass
class BenchContext:
    jax: ModuleType
    devices: list[Any]  # all local devices; single-device benchmarks use the first
    device: BenchDevice  # environment.device_record
    timing: TimingSettings
    seed: int = 0
    gpu_clocks: Any = None  # gpu_clocks.GpuClocks on an NVIDIA GPU: its clocks and heat beside every case
    _keys: Iterator[int] = field(default_factory=itertools.count, repr=False)

    @property
    def platform(self) -> str:
        return str(self.device.platform)

    def next_key(self) -> Any:
        """A fresh PRNG key: inputs are random, and different for each case."""
        return self.jax.random.key(self.seed * 1_000_003 + next(self._keys))

    def peak(self, dtype: str, precision: str = "default") -> float | None:
        return peak_for_dtype(self.device, dtype, precision)

    @property
    def peak_bandwidth(self) -> float | None:
        return self.device.peak_memory_bandwidth_bytes_per_s_per_device

    def memory_available(self) -> int | None:
        """Bytes a new buffer can take on the first device (host memory for the CPU platform)."""
        if self.platform == "cpu":
            import psutil

            return int(psutil.virtual_memory().available)
        try:
            stats = self.devices[0].memory_stats() or {}
        except Exception:  # noqa: BLE001 some plugins raise instead of returning None
            return None
        if "bytes_limit" not in stats:
            return None
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))

    def require_memory(self, needed_bytes: int, what: str) -> None:
        """Refuse a case that cannot fit before allocating it.

        On the CPU platform a buffer larger than free memory may be granted and
        then take the host down when touched, so it is never attempted.
        """
        available = self.memory_available()
        if available is not None and needed_bytes > available:
            raise OutOfMemory(f"out of memory: {what} needs {format_bytes(needed_bytes)}, the {self.platform} "
                              f"device has {format_bytes(available)} free")


def xla_cost(compiled: Any) -> dict[str, float]:
    """XLA's cost analysis of a compiled executable ({} when the backend has none).

    For a program partitioned over several devices the figures are per device.
    A negative figure (XLA's -1) means "not available" and is left out.
    """
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 NotImplementedError, or a backend error: the cross-check is then skipped
        return {}
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return {str(k): float(v) for k, v in (analysis or {}).items() if isinstance(v, (int, float)) and v >= 0}


# Library calls whose work XLA's cost analysis does not count (it sees an opaque custom call).
_LIBRARY_CALLS = re.compile(r'custom_call_target="(__cublas[^"]*|__cudnn[^"]*|__onednn[^"]*|__cusolver[^"]*)"')


def library_calls(compiled: Any) -> list[str]:
    """The library custom calls (cuBLAS, cuDNN) in a compiled program, whose work XLA does not count."""
    try:
        text = compiled.as_text() or ""
    except Exception:  # noqa: BLE001 a backend without HLO text: nothing known to exclude
        return []
    return sorted(set(_LIBRARY_CALLS.findall(text)))


@dataclass
class CostCheck:
    """XLA's count of one figure beside the analytic count, and whether the two can be compared."""

    xla: float | None  # None: not available
    excluded: list[str]  # library calls XLA did not count; the counts are then not comparable

    def values(self, key: str) -> dict[str, Any]:
        """`key` (xla_flops_per_call) with XLA's count, or None where it is missing or not comparable."""
        out: dict[str, Any] = {key: None if self.excluded else self.xla}
        if self.excluded:
            out["xla_cost_excludes"] = self.excluded
        return out


def cost_check(compiled: Any, figure: str, devices: int = 1) -> CostCheck:
    """XLA's `figure` ("flops", "bytes accessed") for the whole program, `devices` times the per-device count."""
    value = xla_cost(compiled).get(figure)
    return CostCheck(value * devices if value is not None else None, library_calls(compiled))


def mismatch_warning(what: str, analytic: float, xla: float | None, excluded: list[str] | None = None) -> str | None:
    """A sentence when the analytic count and XLA's differ by more than 10 %.

    Nothing when XLA's count is missing, zero (not counted) or excludes library calls: only comparable
    counts that disagree are worth a warning.
    """
    if xla is None or xla <= 0 or analytic <= 0 or excluded:
        return None
    difference = (xla - analytic) / analytic
    if abs(difference) <= MISMATCH_WARNING_FRACTION:
        return None
    return (f"{what}: XLA's cost analysis counts {xla:.4g}, the analytic count is {analytic:.4g} "
            f"({difference * 100:+.0f}%)")
