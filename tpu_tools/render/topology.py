"""The device mesh drawn as text from TPU chip coordinates.

2-D slices are one grid; 3-D slices are a grid per z layer. Neighbouring chips
are joined by links; a dimension that wraps around (a torus) is marked `~` at
both ends of its rows or columns. Devices without coordinates are listed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from tpu_tools.pjrt.devices import DeviceRecord

# Torus dimensions per chip family: 3-D tori wrap on extents that are multiples
# of 4 (whole cubes); 2-D "lite" chips wrap only across a full 16-chip side.
_THREE_D_TORUS = ("TPU v4", "TPU v5", "TPU7")
_LITE_FULL_SIDE = 16


class Wraps(NamedTuple):
    """Which dimensions of the mesh wrap around (a torus link joins their two ends)."""

    x: bool
    y: bool
    z: bool


def wraps_around(device_kind: str, extent: int) -> bool:
    if extent < 3:
        return False
    if "lite" in device_kind.lower() or device_kind.lower().rstrip().endswith("e"):
        return extent == _LITE_FULL_SIDE
    if device_kind.startswith(_THREE_D_TORUS):
        return extent % 4 == 0
    return False


def draw_topology(devices: list[DeviceRecord]) -> str:
    with_coords = [d for d in devices if d.coords]
    if not with_coords or len(with_coords) != len(devices):
        return _device_list(devices)
    chips: dict[tuple[int, ...], list[DeviceRecord]] = defaultdict(list)
    for device in devices:
        coords = tuple(device.coords or ()) + (0,) * (3 - len(device.coords or ()))
        chips[coords[:3]].append(device)
    xs = sorted({c[0] for c in chips})
    ys = sorted({c[1] for c in chips})
    zs = sorted({c[2] for c in chips})
    kind = devices[0].device_kind
    wrap = Wraps(*(wraps_around(kind, len(values)) for values in (xs, ys, zs)))
    labels = {coords: "/".join(str(d.id) for d in sorted(group, key=lambda d: (d.core_on_chip or 0, d.id)))
              for coords, group in chips.items()}
    cell = max(len(label) for label in labels.values()) + 2
    lines = [f"{kind}: {len(chips)} chips, {len(devices)} devices, "
             f"{len(xs)}x{len(ys)}" + (f"x{len(zs)}" if len(zs) > 1 else "")]
    for z in zs:
        if len(zs) > 1:
            lines.append(f"z={z}" + ("  (~ wraps to the other end of z)" if wrap.z else ""))
        lines.extend(_grid(labels, xs, ys, z, cell, wrap))
    marked = [axis for axis, wraps in (("x", wrap.x), ("y", wrap.y)) if wraps]
    if marked:
        lines.append("~ marks a wrap-around link along " + " and ".join(marked))
    lines.append("device ids per chip are separated by /; '-' and '|' are links between neighbours")
    return "\n".join(line.rstrip() for line in lines)


def _grid(labels: dict, xs: list[int], ys: list[int], z: int, cell: int, wrap: Wraps) -> list[str]:
    link = "---"
    left = "~ " if wrap.x else "  "
    prefix = max(len(f"y={y}") for y in ys) + 1
    header = " " * (prefix + len(left)) + (" " * len(link)).join(f"x={x}".center(cell + 2) for x in xs)
    rows = [header]
    column_marks = " " * (prefix + len(left)) + (" " * len(link)).join(
        ("~" if wrap.y else "").center(cell + 2) for _ in xs)
    if wrap.y:
        rows.append(column_marks)
    for i, y in enumerate(ys):
        cells = []
        for x in xs:
            label = labels.get((x, y, z))
            cells.append(f"[{label.center(cell)}]" if label is not None else " " * (cell + 2))
        right = " ~" if wrap.x else ""
        rows.append(f"y={y}".ljust(prefix) + left + link.join(cells) + right)
        if i < len(ys) - 1:
            rows.append(" " * (prefix + len(left)) + (" " * len(link)).join("|".center(cell + 2) for _ in xs))
    if wrap.y:
        rows.append(column_marks)
    return rows


def _device_list(devices: list[DeviceRecord]) -> str:
    lines = ["no chip coordinates reported by this platform; devices:"]
    for device in devices:
        lines.append(f"  device {device.id}: {device.device_kind} ({device.platform}), "
                     f"process {device.process_index}, host {device.host}")
    return "\n".join(lines)
