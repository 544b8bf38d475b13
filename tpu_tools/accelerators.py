"""Public facts about accelerator chips: PCI identity, layout and peak figures.

One table serves passive discovery (which chip is this PCI function?), the
device listing (how many devices per chip?) and the benchmarks ("% of peak").
Peaks are dense figures per chip, from vendor pages.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

GOOGLE = 0x1AE0
NVIDIA = 0x10DE
AMD = 0x1002

GIB = 1 << 30
GB = 10**9


# What f32 matmuls run as at each JAX precision, by platform, and so which peak bounds them.
# TPU: the MXU multiplies bf16; f32 at "default" is one bf16 pass, "high" three (bf16_3x), "highest" six.
# NVIDIA: "default" and "high" run TF32 on the tensor cores (Ampere and later), "highest" true FP32 on CUDA cores.
PRECISIONS = ("default", "high", "highest")
F32_ARITHMETIC = {
    "tpu": {"default": "bf16 (1 pass)", "high": "bf16_3x (3 passes)", "highest": "bf16_6x (6 passes)"},
    "cuda": {"default": "tf32", "high": "tf32", "highest": "fp32"},
}


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
    peak_bf16_flops: float | None = None  # also f16
    peak_int8_ops: float | None = None
    device_kind_pattern: str | None = None  # regex matched against PJRT device_kind
    peak_fp8_flops: float | None = None
    peak_tf32_flops: float | None = None  # NVIDIA tensor cores
    peak_fp32_flops: float | None = None  # true FP32 (NVIDIA CUDA cores); TPUs publish none
    pci_device_ids: tuple[int, ...] = ()  # GPUs: PCI device ids of this part

    def peak_for_dtype(self, dtype: str) -> float | None:
        """Dense peak in (FL)OP/s for a matmul dtype whose arithmetic does not depend on precision."""
        if dtype in ("bf16", "bfloat16", "f16", "float16"):
            return self.peak_bf16_flops
        if dtype in ("int8", "i8"):
            return self.peak_int8_ops
        if dtype in ("fp8", "float8_e4m3fn", "f8"):
            return self.peak_fp8_flops
        return None

    def f32_arithmetic(self, precision: str) -> str | None:
        """What an f32 matmul runs as at a JAX precision ("tf32", "bf16_3x (3 passes)"), where known."""
        return F32_ARITHMETIC.get(self.platform, {}).get(precision)

    def peak_for_matmul(self, dtype: str, precision: str = "default") -> float | None:
        """Dense peak of a matmul of `dtype` at a JAX precision: f32 takes the peak of what it runs as."""
        if dtype not in ("f32", "float32"):
            return self.peak_for_dtype(dtype)
        arithmetic = self.f32_arithmetic(precision)
        if arithmetic is None:
            return None
        if arithmetic == "tf32":
            return self.peak_tf32_flops
        if arithmetic == "fp32":
            return self.peak_fp32_flops
        passes = int(arithmetic.split("(")[1].split()[0])  # "bf16_3x (3 passes)" -> 3
        return self.peak_bf16_flops / passes if self.peak_bf16_flops else None


def _tpu(name: str, device_id: int, *, subsystem: int | None = None, devices: int, cores: int, nodes: str,
         hbm_gib: int, bw_gbs: float, bf16_t: float, int8_t: float | None, kind: str,
         fp8_t: float | None = None) -> tuple[tuple[int, int, int | None], ChipSpec]:
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
            peak_fp8_flops=fp8_t * 1e12 if fp8_t else None,
        ),
    )


# (vendor, device, subsystem_device or None) -> spec. TPUs have no TF32; fp8 only where Google publishes it
# (TPU7x). v4's int8 runs at the bf16 rate.
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
             bf16_t=2307, int8_t=None, fp8_t=4614, kind=r"^TPU ?7x?"),
    ]
)


def _nvidia(name: str, kind: str, ids: tuple[int, ...], *, hbm_gb: int, bw_gbs: float, bf16_t: float,
            tf32_t: float, fp32_t: float, int8_t: float | None, fp8_t: float | None) -> ChipSpec:
    return ChipSpec(name, "nvidia", "cuda", devices_per_chip=1, hbm_bytes=hbm_gb * GB,
                    hbm_bandwidth_bytes_per_s=bw_gbs * GB, peak_bf16_flops=bf16_t * 1e12,
                    peak_int8_ops=int8_t * 1e12 if int8_t else None, device_kind_pattern=kind,
                    peak_fp8_flops=fp8_t * 1e12 if fp8_t else None, peak_tf32_flops=tf32_t * 1e12,
                    peak_fp32_flops=fp32_t * 1e12, pci_device_ids=ids)


# GPUs are recognised by vendor and PCI class; these entries add peaks by PCI device id and by PJRT device
# kind (the CUDA device name). Dense datasheet figures (the sparse ones are twice these). Order matters for
# names: the more specific pattern first ("H100 NVL" and "H100 PCIe" before the SXM part's plain "H100").
GPU_SPECS: tuple[ChipSpec, ...] = (
    _nvidia("NVIDIA A100 PCIe 80GB", r"A100.*(PCIe.*80|80GB.*PCIe)", (0x20B5,), hbm_gb=80, bw_gbs=1935,
            bf16_t=312, tf32_t=156, fp32_t=19.5, int8_t=624, fp8_t=None),
    _nvidia("NVIDIA A100 SXM 80GB", r"A100.*80", (0x20B2,), hbm_gb=80, bw_gbs=2039, bf16_t=312,
            tf32_t=156, fp32_t=19.5, int8_t=624, fp8_t=None),
    _nvidia("NVIDIA A100 40GB", r"A100.*40", (0x20B0, 0x20F1), hbm_gb=40, bw_gbs=1555, bf16_t=312,
            tf32_t=156, fp32_t=19.5, int8_t=624, fp8_t=None),
    _nvidia("NVIDIA H100 NVL", r"H100.*NVL", (0x2321,), hbm_gb=94, bw_gbs=3900, bf16_t=835,
            tf32_t=418, fp32_t=60, int8_t=1671, fp8_t=1671),
    _nvidia("NVIDIA H100 PCIe", r"H100.*PCIe", (0x2331,), hbm_gb=80, bw_gbs=2000, bf16_t=756,
            tf32_t=378, fp32_t=51, int8_t=1513, fp8_t=1513),
    _nvidia("NVIDIA H100 SXM", r"H100", (0x2330,), hbm_gb=80, bw_gbs=3350, bf16_t=989,
            tf32_t=494, fp32_t=67, int8_t=1979, fp8_t=1979),
    _nvidia("NVIDIA H200 NVL", r"H200.*NVL", (0x233B,), hbm_gb=141, bw_gbs=4800, bf16_t=835,
            tf32_t=418, fp32_t=60, int8_t=1671, fp8_t=1671),
    _nvidia("NVIDIA H200", r"H200", (0x2335,), hbm_gb=141, bw_gbs=4800, bf16_t=989,
            tf32_t=494, fp32_t=67, int8_t=1979, fp8_t=1979),
    _nvidia("NVIDIA GB200", r"GB200", (), hbm_gb=186, bw_gbs=8000, bf16_t=2500,
            tf32_t=1250, fp32_t=80, int8_t=5000, fp8_t=5000),
    _nvidia("NVIDIA B200", r"B200", (0x2901,), hbm_gb=180, bw_gbs=8000, bf16_t=2250,
            tf32_t=1100, fp32_t=80, int8_t=4500, fp8_t=4500),
)

NVIDIA_GPU_CLASSES = (0x0302, 0x0300)
AMD_GPU_CLASSES = (0x0380, 0x1200)


def tpu_spec_for_pci(device_id: int, subsystem_device: int | None) -> ChipSpec | None:
    return TPU_BY_PCI_ID.get((GOOGLE, device_id, subsystem_device)) or TPU_BY_PCI_ID.get((GOOGLE, device_id, None))


def gpu_spec_for_pci(vendor_id: int, device_id: int) -> ChipSpec | None:
    """The GPU part behind a PCI vendor and device id (0x10de, 0x2330 is an H100 SXM), if known."""
    if vendor_id != NVIDIA:
        return None
    return next((spec for spec in GPU_SPECS if device_id in spec.pci_device_ids), None)


def generic_gpu_spec(vendor: str) -> ChipSpec:
    if vendor == "nvidia":
        return ChipSpec("NVIDIA GPU", "nvidia", "cuda", devices_per_chip=1)
    return ChipSpec("AMD GPU", "amd", "rocm", devices_per_chip=1)


@functools.lru_cache(maxsize=256)
def spec_for_device_kind(device_kind: str) -> ChipSpec | None:
    """The chip behind a PJRT device kind string ("TPU v5 lite", "NVIDIA H100 80GB HBM3"), if known (a monitor asks
    for each agent's devices every round: the patterns are searched once per kind)."""
    for spec in (*TPU_BY_PCI_ID.values(), *GPU_SPECS):
        if spec.device_kind_pattern and re.search(spec.device_kind_pattern, device_kind, re.IGNORECASE):
            return spec
    return None
