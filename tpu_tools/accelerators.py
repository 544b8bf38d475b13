"""Public facts about accelerator chips: PCI identity, layout and peak figures.

One table serves passive discovery (which chip is this PCI function?), the
device listing (how many devices per chip?) and the benchmarks ("% of peak").
Peaks are dense figures per chip, from vendor pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GOOGLE = 0x1AE0
NVIDIA = 0x10DE
AMD = 0x1002

GIB = 1 << 30
GB = 10**9


@dataclass(frozen=True)
class ChipSpec:
    name: str  # e.g. "TPU v5e"
    vendor: str  # "google", "nvidia", "amd"
    platform: str  # PJRT platform that drives it: "tpu", "cuda", "rocm"
    devices_per_chip: int | None = None  # PJRT devices one chip shows as
    cores_per_chip: int | None = None  # TensorCores (TPU) per chip
    node_style: str | None = None  # "accel" (/dev/accelN) or "vfio" (/dev/vfio/<group>)
    hbm_bytes: int | None = None
    hbm_bandwidth_bytes_per_s: float | None = None
    peak_bf16_flops: float | None = None
    peak_int8_ops: float | None = None
    device_kind_pattern: str | None = None  # regex matched against PJRT device_kind

    def peak_for_dtype(self, dtype: str) -> float | None:
        """Dense peak in (FL)OP/s for a matmul dtype, where the vendor publishes one."""
        if dtype in ("bf16", "bfloat16", "f16", "float16"):
            return self.peak_bf16_flops
        if dtype in ("int8", "i8"):
            return self.peak_int8_ops
        return None


def _tpu(name, device_id, *, subsystem=None, devices, cores, nodes, hbm_gib, bw_gbs, bf16_t, int8_t, kind):
    return (
        (GOOGLE, device_id, subsystem),
        ChipSpec(
            name=name,
            vendor="google",
            platform="tpu",
            devices_per_chip=devices,
            cores_per_chip=cores,
            node_style=nodes,
            hbm_bytes=hbm_gib * GIB,
            hbm_bandwidth_bytes_per_s=bw_gbs * GB,
            peak_bf16_flops=bf16_t * 1e12,
            peak_int8_ops=int8_t * 1e12 if int8_t else None,
            device_kind_pattern=kind,
        ),
    )


# (vendor, device, subsystem_device or None) -> spec
TPU_BY_PCI_ID: dict[tuple[int, int, int | None], ChipSpec] = dict(
    [
        _tpu("TPU v2", 0x0027, subsystem=0x004E, devices=2, cores=2, nodes="accel", hbm_gib=16, bw_gbs=700,
             bf16_t=45, int8_t=None, kind=r"^TPU v2$"),
        _tpu("TPU v3", 0x0027, subsystem=0x004F, devices=2, cores=2, nodes="accel", hbm_gib=32, bw_gbs=900,
             bf16_t=123, int8_t=None, kind=r"^TPU v3$"),
        _tpu("TPU v4", 0x005E, devices=1, cores=2, nodes="accel", hbm_gib=32, bw_gbs=1200,
             bf16_t=275, int8_t=275, kind=r"^TPU v4$"),
        _tpu("TPU v5e", 0x0063, devices=1, cores=1, nodes="vfio", hbm_gib=16, bw_gbs=819,
             bf16_t=197, int8_t=394, kind=r"^TPU v5 ?(lite|e)$"),
        _tpu("TPU v5p", 0x0062, devices=1, cores=2, nodes="vfio", hbm_gib=95, bw_gbs=2765,
             bf16_t=459, int8_t=918, kind=r"^TPU v5p?$"),
        _tpu("TPU v6e", 0x006F, devices=1, cores=1, nodes="vfio", hbm_gib=32, bw_gbs=1640,
             bf16_t=918, int8_t=1836, kind=r"^TPU v6 ?(lite|e)$"),
        _tpu("TPU7x", 0x0076, devices=2, cores=2, nodes="vfio", hbm_gib=192, bw_gbs=7370,
             bf16_t=2307, int8_t=None, kind=r"^TPU ?7x?"),
    ]
)

# GPUs are recognised by vendor and PCI class; these entries add peaks by PJRT device kind.
GPU_SPECS: tuple[ChipSpec, ...] = (
    ChipSpec("NVIDIA A100 SXM 80GB", "nvidia", "cuda", 1, None, None, 80 * GB, 2039 * GB, 312e12, 624e12,
             r"A100.*80"),
    ChipSpec("NVIDIA H100 SXM", "nvidia", "cuda", 1, None, None, 80 * GB, 3350 * GB, 989e12, 1979e12, r"H100"),
    ChipSpec("NVIDIA H200", "nvidia", "cuda", 1, None, None, 141 * GB, 4800 * GB, 989e12, 1979e12, r"H200"),
)

NVIDIA_GPU_CLASSES = (0x0302, 0x0300)
AMD_GPU_CLASSES = (0x0380, 0x1200)


def tpu_spec_for_pci(device_id: int, subsystem_device: int | None) -> ChipSpec | None:
    return TPU_BY_PCI_ID.get((GOOGLE, device_id, subsystem_device)) or TPU_BY_PCI_ID.get((GOOGLE, device_id, None))


def generic_gpu_spec(vendor: str) -> ChipSpec:
    if vendor == "nvidia":
        return ChipSpec("NVIDIA GPU", "nvidia", "cuda", devices_per_chip=1)
    return ChipSpec("AMD GPU", "amd", "rocm", devices_per_chip=1)


def spec_for_device_kind(device_kind: str) -> ChipSpec | None:
    """The chip behind a PJRT device kind string ("TPU v5 lite", "NVIDIA H100 80GB HBM3"), if known."""
    for spec in (*TPU_BY_PCI_ID.values(), *GPU_SPECS):
        if spec.device_kind_pattern and re.search(spec.device_kind_pattern, device_kind, re.IGNORECASE):
            return spec
    return None
