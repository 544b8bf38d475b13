"""The reach of each output of a compiled program: was it reduced over every device, some, or none?

Read from the optimised HLO: from each output of the entry computation back to the parameters, the
cross-device reductions on the path (all-reduce, reduce-scatter, also inside called computations)
and their replica groups. With the program's mesh, a group is named by the mesh axes its members
differ along; the axes of all the reductions on a path together give the reach:

- "reduced over all N devices (axes data, model)";
- "partial: reduced over data only" (some axes, not all);
- "local: no cross-device reduction on its path" (it came from a sharded input or from computation
  each device did on its own part);
- "replicated input, no reduction needed" (only replicated parameters and constants on its path);
- "unknown" where a reduction on its path names its groups in a form this reader does not know (a newer
  XLA's): never a guess.

XLA has written replica groups in three forms: listed ({{0,2},{1,3}}), as an iota ([2,2]<=[4]T(1,0)), and
over a mesh, naming the reduced axes: `mesh['data'=4,'model'=2] {'data'}` (jax 0.11) or
`@mesh<data=4,model=2>(devices=[4,2]<=[8]) {data,model:(1)2}` (later XLA, where `model:(1)2` is a part of an
axis: its size 2 after a leading part of size 1).

A metric read from a "local" or "partial" output is one part's view, however the output is sharded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

REDUCING = ("all-reduce", "all-reduce-start", "reduce-scatter")
_INSTRUCTION = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
                          r"(?P<op>[a-z][a-z0-9\-]*)\((?P<operands>.*?)\)(?P<attrs>(?:,.*)?)$")
_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|body|condition|branch_computations|true_computation|false_computation)="
                     r"(\{[^}]*\}|%?[\w.\-]+)")
_LIST_GROUPS = re.compile(r"replica_groups=\{(?P<groups>(?:\{[\d,\s]*\},?\s*)*)\}")
_IOTA = r"\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?"  # [2,4]<=[4,2]T(1,0)
_IOTA_GROUPS = re.compile(r"replica_groups=" + _IOTA)
_MESH_GROUPS = re.compile(r"replica_groups=(?:@mesh<(?P<angled>[^>]*)>|mesh\[(?P<squared>[^\]]*)\])"
                          r"(?:\(devices=(?:" + _IOTA + r"|\[[\d,]+\](?P<ids>[\d,]+))\))?\s*\{(?P<axes>[^}]*)\}")
# A mesh and, where given, its device order, as a sharding names them (not captured)
_MESH = r"(?:@mesh<[^>]*>|mesh\[[^\]]*\])(?:\(devices=[^()]*(?:\([^()]*\))?\))?"
# A parameter's sharding over a mesh (jax 0.11 on), one {axes} per dimension: replicated where every one is empty,
# or where it says so (jax 0.11.2 writes a replicated parameter `sharding={mesh[], replicated}`).
_MESH_REPLICATED = re.compile(r"sharding=\{" + _MESH + r"\s*,\s*replicated\s*\}")
_NAMED_SHARDING = re.compile(r"sharding=\{" + _MESH + r"\s*,\s*\[(?P<dims>[^\]]*)\](?P<rest>[^}]*)\}")
_MESH_AXIS = re.compile(r"^'?(?P<name>[^'=]+)'?=(?P<size>\d+)$")
_REDUCED_AXIS = re.compile(r"^'?(?P<name>[^':]+)'?(?::\((?P<pre>\d+)\)(?P<size>\d+))?$")
_INDEX = re.compile(r"\bindex=(\d+)")
MAX_INSTRUCTIONS = 1_000_000  # a bound on the walk for programs larger than any real one


@dataclass
class Instruction:
    name: str
    op: str
    operands: list[str]
    attrs: str
    called: list[str] = field(default_factory=list)


@dataclass
class Computation:
    name: str
    entry: bool
    instructions: dict[str, Instruction] = field(default_factory=dict)
    root: str | None = None


def parse_hlo(text: str) -> dict[str, Computation]:
    """The computations of an HLO module's text, each with its instructions (names, opcodes, operands)."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and "=" not in line.split("(")[0]:
                current = Computation(header["name"], bool(header["entry"]))
            continue
        if line.strip() == "}":
            computations[current.name] = current
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        operands_text = match["operands"]
        if "%" in operands_text:
            operands = re.findall(r"%([\w.\-]+)", operands_text)
        else:
            operands = [part.split()[-1] for part in operands_text.split(",") if part.strip()]
        attrs = match["attrs"]
        called = [name.lstrip("%") for found in _CALLED.findall(attrs)
                  for name in re.findall(r"%?([\w.\-]+)", found)]
        instruction = Instruction(match["name"], match["op"], operands, attrs, called)
        current.instructions[instruction.name] = instruction
        if match["root"]:
            current.root = instruction.name
    return computations


def replica_groups(attrs: str, devices: int) -> list[list[int]] | None:
    """The replica groups of a collective, in any of XLA's forms (the module's docstring); {} or none at all
    is every device. None where the groups are written in a form this reader does not know."""
    mesh = _MESH_GROUPS.search(attrs)
    if mesh:
        return _mesh_groups(mesh)
    listed = _LIST_GROUPS.search(attrs)
    if listed:
        groups = [[int(x) for x in re.findall(r"\d+", group)] for group in re.findall(r"\{([\d,\s]*)\}",
                                                                                      listed["groups"])]
        groups = [g for g in groups if g]
        return groups or [list(range(devices))]
    iota = _IOTA_GROUPS.search(attrs)
    if iota:
        shape = [int(x) for x in iota["shape"].split(",")]
        return [list(map(int, row)) for row in _iota_ids(iota).reshape(shape)]
    if "replica_groups=" in attrs:
        return None
    return [list(range(devices))]


def _iota_ids(found: re.Match[str]) -> Any:
    """The device ids of an iota form ([shape]<=[dims]T(perm)): 0..N-1 laid out as dims, transposed by perm."""
    import numpy as np

    dims = [int(x) for x in found["dims"].split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    return ids.transpose([int(x) for x in found["perm"].split(",")]) if found["perm"] else ids


def replicated(attrs: str) -> bool:
    """Whether a parameter's sharding gives every device the whole of it: {replicated}, a mesh's `replicated`,
    or a mesh with no axis on any dimension (and no part left unreduced)."""
    if "sharding={replicated}" in attrs or _MESH_REPLICATED.search(attrs):
        return True
    named = _NAMED_SHARDING.search(attrs)
    if named is None:
        return False
    return all(not axes.strip() for axes in re.findall(r"\{([^}]*)\}", named["dims"])) \
        and "unreduced" not in named["rest"]


def _mesh_groups(found: re.Match[str]) -> list[list[int]] | None:
    """The groups of the mesh form: the devices that differ only along the reduced axes (or parts of axes)."""
    import numpy as np

    axes = [_MESH_AXIS.match(part.strip()) for part in (found["angled"] or found["squared"] or "").split(",")]
    reduced = [_REDUCED_AXIS.match(part.strip()) for part in found["axes"].split(",") if part.strip()]
    if not axes or not all(axes) or not all(reduced):
        return None
    names = [axis["name"] for axis in axes if axis]
    sizes = [int(axis["size"]) for axis in axes if axis]
    total = math.prod(sizes)
    if found["ids"]:
        ids = np.array([int(x) for x in found["ids"].split(",")])
    else:
        ids = _iota_ids(found) if found["dims"] else np.arange(total)
    if ids.size != total:
        return None
    parts: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
    for axis in reduced:
        if axis is None or axis["name"] not in parts:
            return None
        size = sizes[names.index(axis["name"])]
        parts[axis["name"]].append((int(axis["pre"]), int(axis["size"])) if axis["pre"] else (1, size))
    factors: list[int] = []  # every axis split where a part of it is reduced (its leading part first)
    reduced_dims: list[int] = []
    for name, size in zip(names, sizes):
        done = 1
        for pre, part in sorted(parts[name]):
            if pre % done or size % (pre * part):
                return None
            if pre > done:
                factors.append(pre // done)
            reduced_dims.append(len(factors))
            factors.append(part)
            done = pre * part
        if size > done:
            factors.append(size // done)
    kept = [dim for dim in range(len(factors)) if dim not in reduced_dims]
    grouped = ids.reshape(factors).transpose(kept + reduced_dims)
    return [list(map(int, row)) for row in grouped.reshape(-1, math.prod(factors[d] for d in reduced_dims))]


@dataclass
class MeshAxes:
    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def axes_of(self, group: list[int]) -> set[str]:
        """The axes along which the members of a group (partition ids in mesh order) differ."""
        coordinates = [_unravel(member, self.sizes) for member in group]
        return {name for axis, name in enumerate(self.names) if len({c[axis] for c in coordinates}) > 1}


def _unravel(index: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    coordinate = []
    for size in reversed(sizes):
        coordinate.append(index % size)
        index //= size
    return tuple(reversed(coordinate))


def mesh_of(compiled: Any) -> MeshAxes | None:
    """The mesh of a compiled program's named shardings (outputs first), or None."""
    for attribute in ("output_shardings", "input_shardings"):
        try:
            import jax

            leaves = jax.tree_util.tree_leaves(getattr(compiled, attribute))
        except Exception:  # noqa: BLE001 a program without readable shardings names no mesh
            continue
        for sharding in leaves:
            mesh = getattr(sharding, "mesh", None)
            names = getattr(mesh, "axis_names", None)
            shape = getattr(getattr(mesh, "devices", None), "shape", None)
            if names and shape and len(names) == len(shape):
                return MeshAxes(tuple(str(n) for n in names), tuple(int(s) for s in shape))
    return None


def _devices(text: str) -> int:
    match = re.search(r"num_partitions=(\d+)", text)
    partitions = int(match[1]) if match else 1
    match = re.search(r"replica_count=(\d+)", text)
    return partitions * (int(match[1]) if match else 1)


@dataclass
class OutputReach:
    index: int
    reach: str  # "all", "partial", "local", "replicated_input" or "unknown"
    axes: list[str]  # the mesh axes reduced over (empty without a mesh)
    devices: int
    text: str


class _Walk:
    def __init__(self, computations: dict[str, Computation], devices: int, mesh: MeshAxes | None):
        self.computations = computations
        self.devices = devices
        self.mesh = mesh
        self.steps = 0

    def collectives_in(self, name: str, seen: set[str]) -> list[Instruction]:
        """Every reduction inside a called computation (and the ones it calls)."""
        if name in seen or name not in self.computations:
            return []
        seen.add(name)
        found = []
        for instruction in self.computations[name].instructions.values():
            if instruction.op in REDUCING:
                found.append(instruction)
            for called in instruction.called:
                found += self.collectives_in(called, seen)
        return found

    def path(self, computation: Computation, start: str) -> tuple[list[Instruction], list[Instruction]]:
        """(reductions, parameters and constants) on the paths from `start` back to the computation's inputs."""
        reductions: list[Instruction] = []
        leaves: list[Instruction] = []
        stack: list[str] = [start]
        seen: set[str] = set()
        called_seen: set[str] = set()
        while stack and self.steps < MAX_INSTRUCTIONS:
            self.steps += 1
            name = stack.pop()
            if name in seen or name not in computation.instructions:
                continue
            seen.add(name)
            instruction = computation.instructions[name]
            if instruction.op in REDUCING:
                reductions.append(instruction)
            if instruction.op in ("parameter", "constant", "iota"):
                leaves.append(instruction)
            for called in instruction.called:
                reductions += self.collectives_in(called, called_seen)
            operands = instruction.operands
            if instruction.op == "get-tuple-element" and operands:
                source = computation.instructions.get(operands[0])
                index = _INDEX.search(instruction.attrs)
                if source is not None and source.op == "tuple" and index and int(index[1]) < len(source.operands):
                    operands = [source.operands[int(index[1])]]
            stack.extend(operands)
        return reductions, leaves

    def reach(self, index: int, computation: Computation, start: str) -> OutputReach:
        reductions, leaves = self.path(computation, start)
        reduced: set[str] = set()
        widest = 1
        for instruction in reductions:
            groups = replica_groups(instruction.attrs, self.devices)
            if groups is None:
                return OutputReach(index, "unknown", [], self.devices,
                                   f"unknown: {instruction.op} {instruction.name} names its replica groups in a "
                                   "form this version does not read")
            for group in groups:
                widest = max(widest, len(group))
                if self.mesh is not None:
                    reduced |= self.mesh.axes_of(group)
        n = self.devices
        if reductions and widest > 1:
            if self.mesh is not None:
                names = [axis for axis in self.mesh.names if axis in reduced]
                if len(names) == len(self.mesh.names):
                    return OutputReach(index, "all", names, n,
                                       f"reduced over all {n} devices (axes {', '.join(names)})")
                return OutputReach(index, "partial", names, n,
                                   f"partial: reduced over {', '.join(names)} only")
            if widest >= n:
                return OutputReach(index, "all", [], n, f"reduced over all {n} devices")
            return OutputReach(index, "partial", [], n, f"partial: reduced within groups of {widest} of {n} devices")
        parameters = [leaf for leaf in leaves if leaf.op == "parameter"]
        if all(replicated(p.attrs) or n == 1 for p in parameters):
            return OutputReach(index, "replicated_input", [], n, "replicated input, no reduction needed")
        return OutputReach(index, "local", [], n, "local: no cross-device reduction on its path")


def output_reach(hlo_text: str, mesh: MeshAxes | None = None) -> list[OutputReach]:
    """The reach of each output of the entry computation (one per element of a returned tuple)."""
    computations = parse_hlo(hlo_text)
    entry = next((c for c in computations.values() if c.entry), None)
    if entry is None or entry.root is None:
        return []
    devices = _devices(hlo_text)
    if mesh is not None and math.prod(mesh.sizes) != devices:
        mesh = None  # a mesh that does not cover the program's devices cannot name its groups
    walk = _Walk(computations, devices, mesh)
    root = entry.instructions[entry.root]
    outputs = root.operands if root.op == "tuple" else [root.name]
    return [walk.reach(index, entry, name) for index, name in enumerate(outputs)]
