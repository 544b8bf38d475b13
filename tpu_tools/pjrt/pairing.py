"""Pairing PJRT devices with the chips passive discovery found (PCI order)."""

from __future__ import annotations

from tpu_tools.pjrt.devices import DeviceRecord, RuntimeRecord
from tpu_tools.pjrt.discover import Chip, Discovery

GPU_PLATFORMS = ("gpu", "cuda", "rocm")  # PJRT platform names of GPUs (and discovery's GPU chips)


def match_chips(runtime: RuntimeRecord, discovery: Discovery) -> dict[int, Chip]:
    """Device id -> chip, pairing local devices with chips in order when the counts agree."""
    platform = runtime.platform
    if platform in GPU_PLATFORMS:
        chips = [c for c in discovery.chips if c.platform in GPU_PLATFORMS]
    else:
        chips = discovery.chips_for_platform(platform)
    local = local_order(runtime)
    if not chips or not local:
        return {}
    per_chip = chips[0].devices_per_chip or max(1, len(local) // len(chips))
    if per_chip * len(chips) != len(local):
        return {}
    return {device.id: chips[i // per_chip] for i, device in enumerate(local)}


def local_order(runtime: RuntimeRecord) -> list[DeviceRecord]:
    """This process's devices in hardware order (the order chips and service devices are paired in)."""
    return sorted((d for d in runtime.devices if d.process_index == runtime.process_index),
                  key=lambda d: (d.local_hardware_id if d.local_hardware_id is not None else d.id, d.id))
