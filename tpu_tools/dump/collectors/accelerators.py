"""Accelerator collectors: passive discovery, and the PJRT device listing with a probe.

Discovery never opens a device. The runtime collector goes through the
device inventory (`tpu_tools.inventory`), which asks PJRT in an isolated child
with a time limit, and does not open a TPU that another process holds unless
--force-runtime says so.
"""

from __future__ import annotations

import os
import re

from tpu_tools.dump.collector import CollectContext, Skipped, TimedOut
from tpu_tools.dump.sysfiles import try_text, under_root
from tpu_tools.errors import RuntimeFailure, RuntimeHang
from tpu_tools.pjrt.discover import LIBTPU_LOCKFILE, discover
from tpu_tools.pjrt.tpuvm import slice_info
from tpu_tools.render.table import plain_table

# A runtime that hangs should be reported by the inventory's own limit (a clear
# message, the child killed) a little before the runner's hard stop.
_RUNTIME_MARGIN_S = 2.0
_PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible (disk or driver wait)", "Z": "zombie",
                   "T": "stopped", "t": "traced", "X": "dead", "I": "idle"}


def _process_state(ctx: CollectContext, pid: int) -> dict:
    status = try_text(under_root(f"/proc/{pid}/status", ctx.root)) or ""
    match = re.search(r"^State:\s*(\S)", status, re.MULTILINE)
    code = match.group(1) if match else None
    return {"state": code, "state_name": _PROCESS_STATES.get(code or "", None),
            "alive": os.path.isdir(under_root(f"/proc/{pid}", ctx.root))}


def collect_discovery(ctx: CollectContext) -> None:
    found = discover(ctx.root)
    document = found.to_dict()
    states: dict[int, dict] = {}
    for holder_list in _holder_lists(document):
        for holder in holder_list:
            holder.update(states.setdefault(holder["pid"], _process_state(ctx, holder["pid"])))
    for chip in document["chips"]:
        for node in chip["device_nodes"]:
            path = under_root(node["path"], ctx.root)
            node["accessible"] = bool(node["exists"]) and os.access(path, os.R_OK | os.W_OK)
    lock = under_root(LIBTPU_LOCKFILE, ctx.root)
    document["libtpu_lockfile"] = {"path": LIBTPU_LOCKFILE, "exists": lock.exists(),
                                   "held": bool(found.libtpu_lock_holders)}
    # The slice this host is a worker of (environment; GCE metadata only on a GCE VM with TPU chips).
    document["tpu_slice"] = slice_info(root=ctx.root, metadata_timeout_s=1.0).to_dict()
    ctx.add_json("accelerators/discovery.json", document)
    if found.chips:
        from tpu_tools.render.inventory_view import chip_table

        ctx.add_text("accelerators/chips.txt", plain_table(chip_table(found.chips)) + "\n")
    for note in found.notes:
        ctx.note(note)


def _holder_lists(document: dict):
    for chip in document["chips"]:
        yield chip["holders"]
        for node in chip["device_nodes"]:
            yield node["holders"]
    for node in document["shared_nodes"]:
        yield node["holders"]
    yield document["libtpu_lock_holders"]


def collect_runtime(ctx: CollectContext) -> None:
    from tpu_tools.inventory import RUNTIME_HELD, build_inventory
    from tpu_tools.render.inventory_view import device_table, header_line

    timeout_s = max(1.0, ctx.options.timeout_s - _RUNTIME_MARGIN_S)
    try:
        inventory = build_inventory(ctx.policy, timeout_s=timeout_s, probe=True,
                                    force=ctx.options.force_runtime)
    except RuntimeFailure as error:
        for extra in ("child_stderr", "child_traceback"):
            text = getattr(error, extra, "")
            if text:
                ctx.add_text(f"accelerators/runtime-{extra.removeprefix('child_')}.txt", text)
        if isinstance(error, RuntimeHang):
            raise TimedOut(str(error)) from error
        raise
    ctx.add_json("accelerators/runtime.json", inventory.to_dict())
    lines = [header_line(inventory)]
    if inventory.devices:
        lines.append(plain_table(device_table(inventory)))
    lines += [f"note: {note}".replace("(or --force,", "(or --force-runtime,")
              for note in [*inventory.discovery.notes, *inventory.notes]]
    ctx.add_text("accelerators/devices.txt", "\n".join(lines) + "\n")
    if inventory.runtime_status == RUNTIME_HELD:
        raise Skipped("; ".join(inventory.notes).replace("(or --force,", "(or --force-runtime,"))
    failed = [e.probe for e in inventory.devices if e.probe is not None and not e.probe.ok]
    for probe in failed:
        ctx.note(f"device {probe.device_id} failed the probe: {probe.error}")
