"""NVIDIA collectors: an NVML snapshot of every GPU, and `nvidia-smi -q` where the program exists.

NVML is read in this collector's own child with a deadline a little under the dump's --timeout, so a
GPU whose NVML calls hang is written down as not answering rather than costing the collector.
"""

from __future__ import annotations

import shutil
import subprocess

from tpu_tools.dump.collector import CollectContext, Skipped, TimedOut
from tpu_tools.metrics.nvml import read_snapshot
from tpu_tools.pjrt.discover import discover
from tpu_tools.render.table import plain_table

_MARGIN_S = 2.0


def collect_nvml(ctx: CollectContext) -> None:
    snapshot = read_snapshot(max(1.0, ctx.options.timeout_s - _MARGIN_S))
    if not snapshot.available:
        raise Skipped(snapshot.error or "NVML is not available")
    found = discover(ctx.root).chips
    snapshot.place_unidentified([chip.pci_address for chip in found if chip.vendor == "nvidia"])
    ctx.add_json("accelerators/nvml.json", snapshot.to_dict())
    from tpu_tools.render.nvml_view import gpu_table

    chips = {chip.pci_address.lower(): chip.numa_node for chip in found}
    header = f"NVIDIA driver {snapshot.driver_version or '-'}, CUDA {snapshot.cuda_driver_version or '-'}\n"
    ctx.add_text("accelerators/nvml.txt", header + plain_table(gpu_table(snapshot.gpus, lambda bus: chips.get(
        bus or ""))) + "\n")
    for gpu in snapshot.gpus:
        if not gpu.ok:
            ctx.note(f"GPU {gpu.index} ({gpu.pci_bus_id or 'bus id unknown'}): {gpu.error}")


def collect_nvidia_smi(ctx: CollectContext) -> None:
    program = shutil.which("nvidia-smi")
    if program is None:
        raise Skipped("nvidia-smi is not installed")
    limit = max(1.0, ctx.options.timeout_s - _MARGIN_S)
    try:
        done = subprocess.run([program, "-q"], capture_output=True, text=True, timeout=limit,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as error:
        raise TimedOut(f"nvidia-smi -q did not finish within {limit:g} s") from error
    ctx.add_text("accelerators/nvidia-smi-q.txt", done.stdout + (f"\n# stderr\n{done.stderr}" if done.stderr else ""))
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi -q exited with status {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ''}")
