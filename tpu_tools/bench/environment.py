"""What a result depends on besides the code: the device, the host, the software stack, the flags.

Recorded in every result file so that comparing runs from different machines or
versions says so instead of passing silently.
"""

from __future__ import annotations

import os
import platform as host_platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

from tpu_tools.accelerators import F32_ARITHMETIC, PRECISIONS, ChipSpec, spec_for_device_kind
from tpu_tools.bench.records import BenchDevice, BenchEnvironment, F32Matmul, RecordedVersions
from tpu_tools.versions import stack_versions

# Matmul dtypes with a published peak somewhere (ChipSpec.peak_for_matmul); f32's is at the default precision.
PEAK_DTYPES = ("f32", "bf16", "f16", "int8", "fp8")

# Environment variables that change what XLA or jax compile and run.
_RECORDED_VARIABLES = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "JAX_ENABLE_X64",
                       "JAX_DEFAULT_MATMUL_PRECISION", "LIBTPU_INIT_ARGS", "XLA_PYTHON_CLIENT_PREALLOCATE",
                       "XLA_PYTHON_CLIENT_MEM_FRACTION", "CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return host_platform.processor() or host_platform.machine()


def _usable_cpus() -> int | None:
    """CPUs this process may run on (taskset, cgroups' cpusets), which can be fewer than the host has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def environment_record(env: Mapping[str, str] | None = None) -> BenchEnvironment:
    """Host and software facts; needs no runtime. `env`: the environment the runtime starts with."""
    env = os.environ if env is None else env
    return BenchEnvironment(host=socket.gethostname(), os=host_platform.platform(),
                            python=host_platform.python_version(), cpu_model=cpu_model(), cpu_count=os.cpu_count(),
                            cpus_usable=_usable_cpus(), versions=_versions(),
                            variables={name: env[name] for name in _RECORDED_VARIABLES if name in env},
                            command=" ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]))


def _versions() -> RecordedVersions:
    stack = stack_versions()
    return RecordedVersions(tpu_tools=stack.tpu_tools, jax=stack.jax, jaxlib=stack.jaxlib, plugins=stack.plugins)


def device_record(devices: list[Any], process_count: int = 1) -> BenchDevice:
    """The benchmarked devices and the peaks known for them (per device, not per chip)."""
    first = devices[0]
    spec = spec_for_device_kind(first.device_kind)
    return BenchDevice(
        platform=first.platform, platform_version=getattr(first.client, "platform_version", None),
        kind=first.device_kind, count=len(devices), process_count=process_count, chip=spec.name if spec else None,
        devices_per_chip=spec.devices_per_chip if spec else None, memory_bytes=_memory_limit(first),
        peak_ops_per_s_per_device={dtype: _per_device(spec, spec.peak_for_matmul(dtype)) if spec else None
                                   for dtype in PEAK_DTYPES},
        f32_matmul={precision: F32Matmul(arithmetic=f32_arithmetic(first, spec, precision),
                                         peak_ops_per_s=_per_device(spec, spec.peak_for_matmul("f32", precision))
                                         if spec else None)
                    for precision in PRECISIONS},
        peak_memory_bandwidth_bytes_per_s_per_device=_per_device(spec, spec.hbm_bandwidth_bytes_per_s)
        if spec else None)


def f32_arithmetic(device: Any, spec: ChipSpec | None, precision: str) -> str | None:
    """What an f32 matmul runs as on this device at a JAX precision: "fp32", "tf32", "bf16_3x (3 passes)"."""
    if spec is not None:
        return spec.f32_arithmetic(precision)
    if device.platform == "cpu":
        return "fp32"  # XLA's CPU backend computes f32 dots in f32 at every precision
    version = str(getattr(device.client, "platform_version", "")).lower()
    family = "tpu" if device.platform == "tpu" else "cuda" if "cuda" in version else None
    return F32_ARITHMETIC[family][precision] if family else None


def _per_device(spec: ChipSpec, chip_figure: float | None) -> float | None:
    if chip_figure is None:
        return None
    return chip_figure / (spec.devices_per_chip or 1)


def _memory_limit(device: Any) -> int | None:
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 some plugins raise instead of returning None
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def peak_for_dtype(device: BenchDevice, dtype: str, precision: str = "default") -> float | None:
    """Per-device dense peak in (FL)OP/s for a matmul dtype ("bf16", "int8") at a precision, from a `device_record`.

    f32 takes the peak of what it runs as at that precision (TF32 on NVIDIA at "default").
    """
    if dtype == "f32" and precision != "default":
        f32 = device.f32_matmul.get(precision)
        return f32.peak_ops_per_s if f32 else None
    return device.peak_ops_per_s_per_device.get(dtype)


def matmul_arithmetic(device: BenchDevice, dtype: str, precision: str) -> str | None:
    """What a matmul of `dtype` runs as at a precision, from a `device_record` (None where unknown)."""
    if dtype != "f32":
        return dtype
    f32 = device.f32_matmul.get(precision)
    return f32.arithmetic if f32 else None


def differences(baseline: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(errors, warnings) about comparing two result documents' environments.

    A different device kind or platform makes the figures incomparable (error);
    a different device count, host, CPU, version or flag is a warning.
    """
    errors: list[str] = []
    warnings: list[str] = []
    base_device, cur_device = baseline.get("device") or {}, current.get("device") or {}
    if (base_device.get("platform"), base_device.get("kind")) != (cur_device.get("platform"), cur_device.get("kind")):
        errors.append(f"the baseline was measured on {base_device.get('kind')!r} ({base_device.get('platform')}), "
                      f"this run on {cur_device.get('kind')!r} ({cur_device.get('platform')}): "
                      "the figures are not comparable")
    if base_device.get("count") != cur_device.get("count"):
        warnings.append(f"device count differs: baseline {base_device.get('count')}, current {cur_device.get('count')}")
    base_env, cur_env = baseline.get("environment") or {}, current.get("environment") or {}
    for key, label in (("host", "host"), ("cpu_model", "host CPU"), ("cpu_count", "host CPU count"),
                       ("cpus_usable", "usable CPU count")):
        if base_env.get(key) != cur_env.get(key):
            warnings.append(f"{label} differs: baseline {base_env.get(key)!r}, current {cur_env.get(key)!r}")
    base_versions, cur_versions = base_env.get("versions") or {}, cur_env.get("versions") or {}
    for key in sorted(set(base_versions) | set(cur_versions)):
        if base_versions.get(key) != cur_versions.get(key):
            warnings.append(f"{key} version differs: baseline {base_versions.get(key)!r}, "
                            f"current {cur_versions.get(key)!r}")
    base_vars, cur_vars = base_env.get("variables") or {}, cur_env.get("variables") or {}
    for key in sorted(set(base_vars) | set(cur_vars)):
        if base_vars.get(key) != cur_vars.get(key):
            warnings.append(f"{key} differs: baseline {base_vars.get(key)!r}, current {cur_vars.get(key)!r}")
    base_settings, cur_settings = baseline.get("settings") or {}, current.get("settings") or {}
    if base_settings.get("min_time_s") != cur_settings.get("min_time_s"):
        warnings.append(f"--min-time differs: baseline {base_settings.get('min_time_s')}, "
                        f"current {cur_settings.get('min_time_s')}")
    return errors, warnings
