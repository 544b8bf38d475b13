"""AMD collectors: an amdsmi snapshot of every GPU, and `amd-smi static` / `amd-smi metric` where the program exists."""

from __future__ import annotations

from tpu_tools.dump.collector import CollectContext
from tpu_tools.dump.collectors.gpus import library_deadline, run_vendor_tool, write_snapshot
from tpu_tools.metrics.amdsmi import read_snapshot


def collect_amdsmi(ctx: CollectContext) -> None:
    from tpu_tools.render.nvml_view import snapshot_driver_line

    snapshot = read_snapshot(library_deadline(ctx))
    write_snapshot(ctx, snapshot, "amd", "amdsmi", snapshot_driver_line(snapshot) or "")


def collect_amd_smi(ctx: CollectContext) -> None:
    """`amd-smi static` (identity, limits, driver) and `amd-smi metric` (usage, power, clocks, ECC), as run."""
    run_vendor_tool(ctx, "amd-smi", {"amd-smi-static.txt": ["static"], "amd-smi-metric.txt": ["metric"]})
