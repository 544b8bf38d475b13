"""AMD collectors: an amdsmi snapshot of every GPU, and `amd-smi static` / `amd-smi metric` where the program exists.

amdsmi is read in this collector's own child with a deadline a little under the dump's --timeout, so a
GPU whose amdsmi calls hang is written down as not answering rather than costing the collector.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from tpu_tools.dump.collector import CollectContext, Skipped, TimedOut
from tpu_tools.metrics.amdsmi import read_snapshot
from tpu_tools.pjrt.discover import discover
from tpu_tools.render.table import plain_table

_MARGIN_S = 2.0


def collect_amdsmi(ctx: CollectContext) -> None:
    snapshot = read_snapshot(max(1.0, ctx.options.timeout_s - _MARGIN_S))
    if not snapshot.available:
        raise Skipped(snapshot.error or "amdsmi is not available")
    found = discover(ctx.root).chips
    snapshot.place_unidentified([chip.pci_address for chip in found if chip.vendor == "amd"])
    ctx.add_json("accelerators/amdsmi.json", snapshot.to_dict())
    from tpu_tools.render.nvml_view import gpu_table, snapshot_driver_line

    chips = {chip.pci_address.lower(): chip.numa_node for chip in found}
    header = (snapshot_driver_line(snapshot) or "") + "\n"
    ctx.add_text("accelerators/amdsmi.txt", header + plain_table(gpu_table(snapshot.gpus, lambda bus: chips.get(
        bus or ""))) + "\n")
    for gpu in snapshot.gpus:
        if not gpu.ok:
            ctx.note(f"GPU {gpu.index} ({gpu.pci_bus_id or 'bus id unknown'}): {gpu.error}")


def collect_amd_smi(ctx: CollectContext) -> None:
    """`amd-smi static` (identity, limits, driver) and `amd-smi metric` (usage, power, clocks, ECC), as run."""
    program = shutil.which("amd-smi")
    if program is None:
        raise Skipped("amd-smi is not installed")
    deadline = time.monotonic() + max(1.0, ctx.options.timeout_s - _MARGIN_S)
    failures = []
    for command in ("static", "metric"):
        limit = max(0.5, deadline - time.monotonic())
        try:
            done = subprocess.run([program, command], capture_output=True, text=True, timeout=limit,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as error:
            raise TimedOut(f"amd-smi {command} did not finish within {limit:.3g} s") from error
        ctx.add_text(f"accelerators/amd-smi-{command}.txt",
                     done.stdout + (f"\n# stderr\n{done.stderr}" if done.stderr else ""))
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            failures.append(f"amd-smi {command} exited with status {done.returncode}: {last[0]}")
    if failures:
        raise RuntimeError("; ".join(failures))
