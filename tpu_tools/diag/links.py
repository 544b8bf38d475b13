"""Collective checksums over every device: exact inputs, each device's output checked bit for bit, and a
wrong value named by the link (source -> destination device) it came over.

The inputs and expected outputs are the collectives test's crafted exact patterns; the programs are its
SPMD collectives over a one-axis mesh of every device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpu_tools.collectives.data import Crafted, count_wrong
from tpu_tools.collectives.dtypes import DTYPES
from tpu_tools.collectives.mesh import build_mesh
from tpu_tools.collectives.ops import OPS, Case
from tpu_tools.collectives.spmd import build_collective

DTYPE = DTYPES["f32"]


@dataclass
class Wrong:
    device: int
    link: str | None  # "3->4" when the wrong value came over one link
    wrong: int
    checked: int


@dataclass
class Outcome:
    links: list[str] = field(default_factory=list)  # every link the collective used
    wrong: list[Wrong] = field(default_factory=list)  # this process's devices with wrong values


def _case(name: str) -> tuple[Case, int]:
    if name == "all-reduce":
        return Case(OPS["all-reduce"], "sum"), 1
    if name == "all-gather":
        return Case(OPS["all-gather"], None), 1
    return Case(OPS["permute"], None), (1 if name == "ring +1" else -1)


def run_collective(jax: Any, name: str, count: int, inject_device: int | None = None) -> Outcome:
    """Run one collective over every device and check this process's outputs; `inject_device` gets a bit
    flipped in its output first."""
    from tpu_tools.diag.kernels import flip_bit

    case, shift = _case(name)
    plan = build_mesh(jax, None, None, None)
    ranks = plan.ranks
    crafted = Crafted(case, DTYPE, ranks, count, shift=shift)
    collective = build_collective(jax, case, plan, shift=shift)
    length = case.op.input_elements(count, ranks)
    inputs = jax.make_array_from_callback(
        (ranks, length), collective.sharding,
        lambda index: crafted.input(*plan.position(index)).reshape(1, length))
    output = collective.function(inputs)
    ids = [d.id for d in plan.devices]
    outcome = Outcome(links=_links(name, ids, shift))
    for shard in output.addressable_shards:
        group, rank = plan.position(shard.index)
        data = shard.data
        device = int(shard.device.id)
        if inject_device == device:
            data = flip_bit(data)
        actual = np.asarray(data).reshape(-1)
        expected = crafted.expected(group, rank)
        wrong = count_wrong(actual, expected, DTYPE)
        if not wrong:
            continue
        if name == "all-gather":  # chunk k of the output came from rank k
            for source in range(ranks):
                part = slice(source * count, (source + 1) * count)
                bad = count_wrong(actual[part], expected[part], DTYPE)
                if bad:
                    link = None if source == rank else f"{ids[source]}->{device}"
                    outcome.wrong.append(Wrong(device, link, bad, count))
        elif name.startswith("ring"):
            outcome.wrong.append(Wrong(device, f"{ids[(rank - shift) % ranks]}->{device}", wrong, actual.size))
        else:
            outcome.wrong.append(Wrong(device, None, wrong, actual.size))
    return outcome


def _links(name: str, ids: list[int], shift: int) -> list[str]:
    n = len(ids)
    if name.startswith("ring"):
        return [f"{ids[r]}->{ids[(r + shift) % n]}" for r in range(n)]
    return []
