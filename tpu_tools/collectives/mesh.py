"""Which devices take part and how they form a mesh; where each device sits in it.

`--devices 0,2,4-7` picks devices by their global id; `--mesh 2x4` arranges
them in a 2-D mesh with axes x and y, and `--axis y` runs the collective along
y (two independent groups of four ranks here). The parsing is plain Python;
`build_mesh` takes the imported jax module.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.parsing import parse_number
from tpu_tools.shorten import quoted

AXIS_NAMES = ("x", "y", "z")


MAX_DEVICE_IDS = 1 << 16  # far more devices than any slice has; a bigger range is a typo (and memory)


def parse_device_ids(text: str | None) -> list[int] | None:
    """"0,1,4-7" -> [0, 1, 4, 5, 6, 7]; None selects every device."""
    if text is None:
        return None
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            if "-" in part.lstrip("-"):
                low, high = (_device_id(v) for v in part.split("-", 1))
                if low > high:
                    raise ValueError
                if high - low >= MAX_DEVICE_IDS or len(ids) + high - low >= MAX_DEVICE_IDS:
                    raise UsageError(f"--devices {quoted(text, 40)}: more than {MAX_DEVICE_IDS} device ids")
                ids.extend(range(low, high + 1))
            else:
                ids.append(_device_id(part))
        except ValueError:
            raise UsageError(f"--devices {text!r}: use device ids and ranges such as 0,1,4-7") from None
    if any(i < 0 for i in ids):
        raise UsageError(f"--devices {text!r}: device ids are not negative")
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
    if duplicates:
        raise UsageError(f"--devices names device {duplicates[0]} more than once")
    return ids


def _device_id(text: str) -> int:
    """ASCII digits only (int() takes "١" and "1_0"); ValueError otherwise."""
    return int(parse_number(text.strip(), "device id", integer=True))


def parse_mesh_shape(text: str | None) -> tuple[int, ...] | None:
    """"2x4" -> (2, 4): up to three axes, named x, y, z."""
    if text is None:
        return None
    try:
        shape = tuple(int(parse_number(v, "--mesh", integer=True)) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--mesh {text!r}: use sizes joined by x, e.g. 8 or 2x4") from None
    if not 1 <= len(shape) <= len(AXIS_NAMES) or any(s < 1 for s in shape):
        raise UsageError(f"--mesh {text!r}: use one to three positive sizes joined by x, e.g. 8 or 2x4")
    return shape


def axis_names(ndim: int) -> tuple[str, ...]:
    return AXIS_NAMES[:ndim]


def choose_axis(shape: tuple[int, ...], axis: str | None) -> str:
    names = axis_names(len(shape))
    if axis is None:
        return names[-1]
    if axis not in names:
        raise UsageError(f"--axis {axis!r} is not an axis of the {'x'.join(map(str, shape))} mesh "
                         f"(its axes are {', '.join(names)})")
    return axis


def id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[tuple[int, int]] = []
    for value in sorted(ids):
        if parts and parts[-1][1] == value - 1:
            parts[-1] = (parts[-1][0], value)
        else:
            parts.append((value, value))
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


@dataclass
class MeshPlan:
    mesh: Any  # jax.sharding.Mesh
    axis: str
    shape: tuple[int, ...]
    names: tuple[str, ...]
    devices: list[Any]  # the selected jax devices, in mesh order

    @property
    def ranks(self) -> int:
        """Ranks in one collective group: the size of the chosen axis."""
        return self.shape[self.names.index(self.axis)]

    @property
    def groups(self) -> int:
        return math.prod(self.shape) // self.ranks

    def position(self, index: tuple[slice, ...]) -> tuple[int, int]:
        """(group, rank) of the shard at a global index (one slice per mesh axis, then the buffer)."""
        coords = [s.start or 0 for s in index[: len(self.shape)]]
        axis_position = self.names.index(self.axis)
        rank = coords[axis_position]
        group = 0
        for position, (coord, size) in enumerate(zip(coords, self.shape)):
            if position != axis_position:
                group = group * size + coord
        return group, rank


def build_mesh(jax: Any, device_ids: list[int] | None, shape: tuple[int, ...] | None,
               axis: str | None) -> MeshPlan:
    import numpy as np
    from jax.sharding import Mesh

    everything = jax.devices()
    by_id = {d.id: d for d in everything}
    if device_ids is None:
        selected = list(everything)
    else:
        missing = [i for i in device_ids if i not in by_id]
        if missing:
            raise UsageError(f"--devices names device {missing[0]}, which does not exist: this run has "
                             f"{len(everything)} {everything[0].platform} devices ({id_ranges(list(by_id))})")
        selected = [by_id[i] for i in device_ids]
    processes = {d.process_index for d in everything}
    idle = sorted(processes - {d.process_index for d in selected})
    if idle:
        raise UsageError(f"--devices leaves process {idle[0]} without a device; every process must take part "
                         "(select at least one device of each)")
    shape = shape or (len(selected),)
    if math.prod(shape) != len(selected):
        raise UsageError(f"--mesh {'x'.join(map(str, shape))} needs {math.prod(shape)} devices but "
                         f"{len(selected)} are selected")
    names = axis_names(len(shape))
    chosen = choose_axis(shape, axis)
    grid = _device_grid(jax, selected, shape, every=device_ids is None)
    return MeshPlan(Mesh(grid, names), chosen, shape, names, list(np.asarray(grid).reshape(-1)))


def _device_grid(jax: Any, devices: list[Any], shape: tuple[int, ...], every: bool):
    """jax's topology-aware layout (rings along physical links on TPU) when it applies, else in order."""
    import numpy as np

    if every:
        try:
            from jax.experimental import mesh_utils

            return mesh_utils.create_device_mesh(shape, devices=devices)
        except (ValueError, NotImplementedError, AssertionError):
            pass
    return np.asarray(devices, dtype=object).reshape(shape)
