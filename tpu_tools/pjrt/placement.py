"""Which accelerator chips of this host no process holds, and the environment that pins a new job to them.

On a TPU host a job takes every chip unless libtpu is told otherwise: `TPU_VISIBLE_CHIPS` names the chips
(their index on the host, PCI order), `TPU_CHIPS_PER_PROCESS_BOUNDS` the shape they form (x,y,z) and
`TPU_PROCESS_BOUNDS` the processes of the job (1,1,1: one). The chips must form a block of the host's grid
that the runtime accepts as one process's chips: every TPU host of a known generation lays its chips out two
wide (v4 and v5p: 2x2, v5e and v6e: 2x4, TPU7x: 2x2), chip i at (i % 2, i // 2), and the blocks taken here are
those of Cloud TPU's public examples of several jobs on one host: one chip (1,1,1), a row of two (2,1,1), or
whole rows aligned to their height (2x2 of chips 0-3 or 4-7, 2x4 of all eight). The largest such block of free
chips is chosen.

On NVIDIA GPUs `CUDA_VISIBLE_DEVICES` takes indexes in CUDA's order, which is PCI order only with
`CUDA_DEVICE_ORDER=PCI_BUS_ID`: both are given. AMD GPUs take `HIP_VISIBLE_DEVICES` the same way (ROCm's
enumeration is in PCI order).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.pjrt.discover import Chip, Discovery, Holder

TPU_GRID_WIDTH = 2


@dataclass
class FreeChips:
    """One platform's chips on this host: which are free, and the environment for a job on the chosen ones."""

    platform: str  # "tpu", "cuda", "rocm"
    chip_indexes: list[int]  # every chip of the platform (host index)
    held: dict[int, list[Holder]]  # chip index -> the processes holding it (held chips only)
    free: list[int]  # chips no process holds
    chosen: list[int]  # the free chips the environment pins a job to (empty: none can be)
    environment: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The platform's chips as tpu-ls --free --json writes them."""
        return {"platform": self.platform, "chips": list(self.chip_indexes),
                "held": [{"chip_index": index, "holders": [h.to_dict() for h in holders]}
                         for index, holders in sorted(self.held.items())],
                "free": list(self.free), "chosen": list(self.chosen), "environment": dict(self.environment),
                "notes": list(self.notes)}


def tpu_block(free: Iterable[int], count: int) -> tuple[list[int], tuple[int, int, int]] | None:
    """The largest block of free TPU chips the runtime accepts on a host of `count` chips, with its bounds."""
    free_set = set(free)
    rows = max(1, -(-count // TPU_GRID_WIDTH))
    if count < TPU_GRID_WIDTH:
        return ([0], (1, 1, 1)) if 0 in free_set else None
    height = 1 << (rows.bit_length() - 1)  # the largest power of two of rows that fits
    while height >= 1:
        for top in range(0, rows - height + 1, height):
            block = list(range(top * TPU_GRID_WIDTH, (top + height) * TPU_GRID_WIDTH))
            if block[-1] < count and free_set.issuperset(block):
                return block, (TPU_GRID_WIDTH, height, 1)
        height //= 2
    return ([min(free_set)], (1, 1, 1)) if free_set else None


def _tpu_environment(block: list[int], bounds: tuple[int, int, int]) -> dict[str, str]:
    return {"TPU_VISIBLE_CHIPS": ",".join(map(str, block)),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": ",".join(map(str, bounds)),
            "TPU_PROCESS_BOUNDS": "1,1,1"}


def free_chips(discovery: Discovery, held_elsewhere: dict[str, list[Holder]] | None = None) -> list[FreeChips]:
    """Per platform with chips on this host, which are free and how to pin a job to them.

    held_elsewhere: PCI address -> holders known from another source (NVML lists processes in other PID
    namespaces, which /proc does not show).
    """
    extra = {address.lower(): holders for address, holders in (held_elsewhere or {}).items()}
    found: list[FreeChips] = []
    for platform in dict.fromkeys(c.platform for c in discovery.chips):
        chips = discovery.chips_for_platform(platform)
        held: dict[int, list[Holder]] = {}
        for position, chip in enumerate(chips):
            holders = _merged(chip.holders, extra.get(chip.pci_address.lower(), []))
            if holders:
                held[position] = holders
        free = [position for position in range(len(chips)) if position not in held]
        found.append(_placement(platform, chips, held, free, discovery))
    return found


def _merged(first: list[Holder], second: list[Holder]) -> list[Holder]:
    seen: dict[int, Holder] = {h.pid: h for h in first}
    for holder in second:
        seen.setdefault(holder.pid, holder)
    return sorted(seen.values(), key=lambda h: h.pid)


def _placement(platform: str, chips: list[Chip], held: dict[int, list[Holder]], free: list[int],
               discovery: Discovery) -> FreeChips:
    """Chips are numbered by their position among the platform's chips: the index the runtime uses."""
    result = FreeChips(platform, list(range(len(chips))), held, free, [])
    if not free:
        result.notes.append(f"every {platform} chip is held: no job can be pinned to a free one")
        return result
    if platform == "tpu":
        block = tpu_block(free, len(chips))
        if block is not None:
            result.chosen = block[0]
            result.environment = _tpu_environment(*block)
        if len(result.chosen) < len(free):
            result.notes.append(f"{len(free)} chips are free; the largest block of them the runtime accepts as "
                                f"one job's is {len(result.chosen)} chip{'s' if len(result.chosen) > 1 else ''}")
        holding = {h.pid for holders in held.values() for h in holders}
        for holder in discovery.libtpu_lock_holders:
            if holder.pid not in holding:
                result.notes.append(f"process {holder.pid} holds libtpu's lock file: a new job's libtpu may "
                                    "refuse to start while it runs")
    elif platform in ("cuda", "gpu"):
        result.chosen = list(free)
        result.environment = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, free))}
    elif platform == "rocm":
        result.chosen = list(free)
        result.environment = {"HIP_VISIBLE_DEVICES": ",".join(map(str, free))}
    else:
        result.notes.append(f"no environment is known that pins a job to {platform} chips")
    return result


def export_lines(placements: list[FreeChips], *, export: bool) -> list[str]:
    """`NAME=value` lines for `env`, or `export NAME=value` for a shell; values quoted for the shell."""
    prefix = "export " if export else ""
    return [f"{prefix}{name}={shlex.quote(value)}" for placement in placements
            for name, value in placement.environment.items()]
