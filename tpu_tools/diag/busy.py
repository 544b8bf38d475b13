"""Who holds the accelerators tpu-diag would open: a diagnostic never runs beside a job.

TPUs: the processes holding a chip's device node or libtpu's lock (passive discovery, as tpu-ls finds
them). NVIDIA GPUs: the processes NVML lists with a context on a GPU, where NVML answers (the device
nodes themselves are also held open by monitors reading NVML, such as tpu-monitor); without NVML, and for
AMD GPUs, the device nodes' holders.
"""

from __future__ import annotations

import os

from tpu_tools.pjrt.discover import Holder, discover
from tpu_tools.pjrt.runtime import RuntimePolicy

NVML_TIMEOUT_S = 5.0


def busy_holders(policy: RuntimePolicy) -> list[Holder]:
    """Other processes holding a device of the platforms `policy` would open ([] for the CPU platform)."""
    platforms = policy.requested_platforms()
    if platforms == ["cpu"]:
        return []
    own = {os.getpid()}
    discovery = discover()
    found: dict[int, Holder] = {}
    if not platforms or "tpu" in platforms:
        found.update({h.pid: h for h in discovery.tpu_holders(exclude_pids=own)})
    gpu_chips = [c for c in discovery.chips if c.platform != "tpu"
                 and (not platforms or c.platform in platforms or "gpu" in platforms)]
    nvidia = [c for c in gpu_chips if c.vendor == "nvidia"]
    if nvidia:
        listed = _nvml_processes(own)
        if listed is not None:
            found.update(listed)
            gpu_chips = [c for c in gpu_chips if c.vendor != "nvidia"]
    for chip in gpu_chips:
        found.update({h.pid: h for h in chip.holders if h.pid not in own})
    return list(found.values())


def _nvml_processes(own: set[int]) -> dict[int, Holder] | None:
    """The processes with a context on an NVIDIA GPU, or None when NVML cannot say."""
    from tpu_tools.metrics.nvml.reader import enabled, read_snapshot

    if not enabled():
        return None
    snapshot = read_snapshot(NVML_TIMEOUT_S)
    if not snapshot.available:
        return None
    return {p.pid: Holder(p.pid, p.user or "?", p.command or "?")
            for gpu in snapshot.gpus for p in gpu.processes if p.pid not in own}
