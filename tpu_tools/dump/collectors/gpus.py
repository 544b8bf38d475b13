"""What the GPU collectors share: a driver library's snapshot of every GPU, and the vendor's own tool's output.

The library (NVML, amdsmi) is read in the collector's own child with a deadline a little under the dump's
--timeout, so a GPU whose calls hang is written down as not answering rather than costing the collector.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from tpu_tools.dump.collector import CollectContext, Skipped, TimedOut
from tpu_tools.pjrt.discover import discover
from tpu_tools.render.table import plain_table

MARGIN_S = 2.0


def library_deadline(ctx: CollectContext) -> float:
    """Seconds the driver library may take: the dump's deadline less a margin to write what was read."""
    return max(1.0, ctx.options.timeout_s - MARGIN_S)


def write_snapshot(ctx: CollectContext, snapshot: Any, vendor: str, name: str, header: str) -> None:
    """accelerators/NAME.json and .txt of a library snapshot, its GPUs placed on discovery's chips of VENDOR."""
    if not snapshot.available:
        raise Skipped(snapshot.error or f"{name} is not available")
    found = discover(ctx.root).chips
    snapshot.place_unidentified([chip.pci_address for chip in found if chip.vendor == vendor])
    ctx.add_json(f"accelerators/{name}.json", snapshot.to_dict())
    from tpu_tools.render.nvml_view import gpu_table

    chips = {chip.pci_address.lower(): chip.numa_node for chip in found}
    table = plain_table(gpu_table(snapshot.gpus, lambda bus: chips.get(bus or "")))
    ctx.add_text(f"accelerators/{name}.txt", header + "\n" + table + "\n")
    for gpu in snapshot.gpus:
        if not gpu.ok:
            ctx.note(f"GPU {gpu.index} ({gpu.pci_bus_id or 'bus id unknown'}): {gpu.error}")


def run_vendor_tool(ctx: CollectContext, program_name: str, runs: dict[str, list[str]]) -> None:
    """Each of `runs` (file name -> arguments) of the vendor's program, as run, within the dump's deadline."""
    program = shutil.which(program_name)
    if program is None:
        raise Skipped(f"{program_name} is not installed")
    deadline = time.monotonic() + library_deadline(ctx)
    failures = []
    for file_name, arguments in runs.items():
        shown = " ".join([program_name, *arguments])
        limit = max(0.5, deadline - time.monotonic())
        try:
            done = subprocess.run([program, *arguments], capture_output=True, text=True, timeout=limit,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as error:
            raise TimedOut(f"{shown} did not finish within {limit:.3g} s") from error
        ctx.add_text(f"accelerators/{file_name}", done.stdout + (f"\n# stderr\n{done.stderr}" if done.stderr else ""))
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            failures.append(f"{shown} exited with status {done.returncode}: {last[0]}")
    if failures:
        raise RuntimeError("; ".join(failures))
