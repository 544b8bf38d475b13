"""Pairing the devices libtpu's metrics services report with the TPU chips discovery found."""

from __future__ import annotations

from collections.abc import Sequence

from tpu_tools.metrics.libtpu import DeviceFigures, LibtpuSnapshot
from tpu_tools.pjrt.discover import Chip


def served_devices(snapshots: Sequence[LibtpuSnapshot]) -> list[tuple[str, DeviceFigures]]:
    """(address, device) of every answering service, in address order: the order they pair in."""
    return [(s.address, d) for s in snapshots if s.ok for d in s.devices]


def pair_with_chips(served: list[tuple[str, DeviceFigures]],
                    chips: Sequence[Chip]) -> list[list[tuple[str, DeviceFigures]]] | None:
    """The service devices of each chip, in chip order, when the counts agree (else None)."""
    per_chip = (chips[0].devices_per_chip or 1) if chips else 0
    if not chips or len(served) != len(chips) * per_chip:
        return None
    return [served[position * per_chip:(position + 1) * per_chip] for position in range(len(chips))]
