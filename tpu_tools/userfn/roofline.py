"""Roofline verdicts: is a program bound by compute or by memory bandwidth on a given chip?

Arithmetic intensity (FLOPs per byte accessed) against the chip's ridge point
(peak FLOP/s over memory bandwidth): above it the peak compute is the ceiling,
below it the bandwidth is. The best case is the larger of the two times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpu_tools.accelerators import GPU_SPECS, TPU_BY_PCI_ID, ChipSpec
from tpu_tools.errors import UsageError

_FLOAT_LOW = ("bf16", "f16")
_INT8 = ("s8", "u8", "i8")


@dataclass
class Roofline:
    chip: str | None
    peak_dtype: str | None
    peak_flops_per_s: float | None
    memory_bandwidth_bytes_per_s: float | None
    arithmetic_intensity_flops_per_byte: float | None
    ridge_point_flops_per_byte: float | None
    bound: str | None  # "compute", "memory" or None when the peak is unknown
    compute_time_us: float | None
    memory_time_us: float | None
    best_case_time_us: float | None
    note: str | None = None


def known_chips() -> list[ChipSpec]:
    seen: dict[str, ChipSpec] = {}
    for spec in (*TPU_BY_PCI_ID.values(), *GPU_SPECS):
        seen.setdefault(spec.name, spec)
    return list(seen.values())


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def chip_by_name(name: str) -> ChipSpec:
    """A chip from the table by a forgiving name: "v5e", "TPU v5e", "tpu-v6e", "H100"."""
    wanted = _normal(name)
    chips = known_chips()
    exact = [c for c in chips if _normal(c.name) in (wanted, "tpu" + wanted, "nvidia" + wanted)]
    matches = exact or [c for c in chips if wanted and wanted in _normal(c.name)]
    by_kind = [c for c in (matches or chips) if c.device_kind_pattern and re.search(c.device_kind_pattern, name, re.I)]
    if not matches or len(by_kind) == 1:  # "H100" is the SXM part's device kind, not every H100 variant
        matches = by_kind or matches
    if len(matches) == 1:
        return matches[0]
    names = ", ".join(c.name for c in (matches or chips))
    if matches:
        raise UsageError(f"--chip {name!r} matches several chips: {names}")
    raise UsageError(f"--chip {name!r} is not a known chip; known: {names}")


def compute_dtype(arg_dtypes: list[str]) -> str:
    """The dtype whose peak applies: bf16 when every float input is 16-bit, int8 for int8 inputs, else f32."""
    floats = [d for d in arg_dtypes if d.startswith(("f", "bf"))]
    if floats:
        return "bf16" if all(d in _FLOAT_LOW for d in floats) else "f32"
    if arg_dtypes and all(d in _INT8 for d in arg_dtypes):
        return "int8"
    return "f32"


def peak_for(spec: ChipSpec, dtype: str) -> tuple[float | None, str | None, str | None]:
    """(peak FLOP/s, the dtype of that peak, a note)."""
    peak = spec.peak_for_dtype(dtype)
    if peak is not None:
        return peak, dtype, None
    if dtype == "f32" and spec.platform == "tpu" and spec.peak_bf16_flops:
        return (spec.peak_bf16_flops, "bf16",
                "f32 matmuls run as bf16 passes on the MXU at JAX's default precision; the bf16 peak is the ceiling")
    return None, None, f"{spec.name} has no published {dtype} peak in the chip table"


def roofline(flops: float | None, bytes_accessed: float | None, spec: ChipSpec | None, dtype: str,
             device_kind: str | None = None) -> Roofline:
    intensity = flops / bytes_accessed if flops is not None and bytes_accessed else None
    if spec is None:
        return Roofline(None, None, None, None, intensity, None, None, None, None, None,
                        f"no peak figures known for device kind {device_kind!r}; pass --chip to compare against "
                        "an accelerator's peak")
    peak, peak_dtype, note = peak_for(spec, dtype)
    bandwidth = spec.hbm_bandwidth_bytes_per_s
    limits = ceilings(flops, bytes_accessed, peak, bandwidth)
    return Roofline(spec.name, peak_dtype, peak, bandwidth, intensity, limits.ridge_flops_per_byte, limits.bound,
                    _us(limits.compute_s), _us(limits.memory_s), _us(limits.best_case_s), note)


@dataclass(frozen=True)
class Ceilings:
    """The time a program's FLOPs take at the compute peak and its bytes at the bandwidth, and which is larger."""

    compute_s: float | None
    memory_s: float | None
    ridge_flops_per_byte: float | None
    bound: str | None  # "compute" or "memory"; None when either ceiling is unknown
    best_case_s: float | None  # the larger of the two known times


def ceilings(flops: float | None, bytes_accessed: float | None, peak: float | None,
             bandwidth: float | None) -> Ceilings:
    """A program's place under a device's two ceilings (from its FLOPs and bytes per run)."""
    intensity = flops / bytes_accessed if flops is not None and bytes_accessed else None
    compute_s = flops / peak if peak and flops is not None else None
    memory_s = bytes_accessed / bandwidth if bandwidth and bytes_accessed is not None else None
    ridge = peak / bandwidth if peak and bandwidth else None
    bound = None
    if intensity is not None and ridge is not None:
        bound = "compute" if intensity >= ridge else "memory"
    elif compute_s is not None and memory_s is not None:
        bound = "compute" if compute_s >= memory_s else "memory"
    times = [t for t in (compute_s, memory_s) if t is not None]
    return Ceilings(compute_s, memory_s, ridge, bound, max(times) if times else None)


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6

