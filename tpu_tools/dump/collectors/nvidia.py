"""NVIDIA collectors: an NVML snapshot of every GPU, and `nvidia-smi -q` where the program exists."""

from __future__ import annotations

from tpu_tools.dump.collector import CollectContext
from tpu_tools.dump.collectors.gpus import library_deadline, run_vendor_tool, write_snapshot
from tpu_tools.metrics.nvml import read_snapshot


def collect_nvml(ctx: CollectContext) -> None:
    snapshot = read_snapshot(library_deadline(ctx))
    header = f"NVIDIA driver {snapshot.driver_version or '-'}, CUDA {snapshot.cuda_driver_version or '-'}"
    write_snapshot(ctx, snapshot, "nvidia", "nvml", header)


def collect_nvidia_smi(ctx: CollectContext) -> None:
    run_vendor_tool(ctx, "nvidia-smi", {"nvidia-smi-q.txt": ["-q"]})
