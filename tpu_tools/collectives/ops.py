"""The collective operations: what they move, how their bandwidth is counted.

Bandwidth follows the convention users know from nccl-tests and nccom-test:
algbw = bytes / time (GB = 1e9) and busbw = algbw x a per-op factor that makes
the figure comparable to the link speed. "bytes" is the per-rank buffer for
all-reduce, permute and broadcast, and the whole gathered buffer (count x
type size x ranks) for all-gather, reduce-scatter and all-to-all; the count
column is the per-rank (all-reduce, permute, broadcast) or per-peer count.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tools.errors import UsageError

REDOPS = ("sum", "max", "min", "prod", "avg")


@dataclass(frozen=True)
class OpSpec:
    name: str
    redops: tuple[str, ...]  # the reductions it supports; () for data movement
    gathered: bool  # size = count x type size x ranks
    factor_text: str  # the busbw factor as users read it
    has_root: bool = False

    def busbw_factor(self, ranks: int) -> float:
        if self.factor_text == "2(n-1)/n":
            return 2 * (ranks - 1) / ranks
        if self.factor_text == "(n-1)/n":
            return (ranks - 1) / ranks
        return 1.0

    def busbw_formula(self, ranks: int) -> str:
        return f"busbw = algbw * {self.factor_text} = algbw * {self.busbw_factor(ranks):.3f} (n = {ranks} ranks)"

    def input_elements(self, count: int, ranks: int) -> int:
        """Elements each rank sends in; `count` as in the table's count column."""
        return count * ranks if self.name in ("reduce-scatter", "all-to-all") else count

    def output_elements(self, count: int, ranks: int) -> int:
        return count * ranks if self.name in ("all-gather", "all-to-all") else count

    def size_bytes(self, count: int, itemsize: int, ranks: int) -> int:
        return count * itemsize * (ranks if self.gathered else 1)


OPS: dict[str, OpSpec] = {op.name: op for op in (
    OpSpec("all-reduce", REDOPS, False, "2(n-1)/n"),
    OpSpec("all-gather", (), True, "(n-1)/n"),
    OpSpec("reduce-scatter", ("sum",), True, "(n-1)/n"),
    OpSpec("all-to-all", (), True, "(n-1)/n"),
    OpSpec("permute", (), False, "1"),
    OpSpec("broadcast", (), False, "1", has_root=True),
)}
OP_CHOICES = (*OPS, "all")


@dataclass(frozen=True)
class Case:
    """One section of the report: an op with one reduction (or none)."""

    op: OpSpec
    redop: str | None  # None for data movement

    @property
    def label(self) -> str:
        return self.op.name + (f" ({self.redop})" if self.redop else "")


def parse_op(text: str) -> list[OpSpec]:
    key = text.strip().lower().replace("_", "-")
    key = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
           "alltoall": "all-to-all", "ppermute": "permute", "sendrecv": "permute"}.get(key, key)
    if key == "all":
        return list(OPS.values())
    if key not in OPS:
        raise UsageError(f"unknown op {text!r}: choose one of {', '.join(OP_CHOICES)}")
    return [OPS[key]]


def plan_tests(ops: list[OpSpec], redop: str) -> tuple[list[Case], list[str]]:
    """The tests to run for the chosen ops and --redop ("all" runs every reduction)."""
    if redop != "all" and redop not in REDOPS:
        raise UsageError(f"unknown reduction {redop!r}: choose one of {', '.join(REDOPS)}, all")
    wanted = REDOPS if redop == "all" else (redop,)
    tests: list[Case] = []
    notes: list[str] = []
    for op in ops:
        if not op.redops:
            tests.append(Case(op, None))
            continue
        usable = [r for r in wanted if r in op.redops]
        if not usable:
            if len(ops) == 1:
                raise UsageError(f"{op.name} supports only --redop {', '.join(op.redops)} "
                                 "(JAX's SPMD collective has no other reduction)")
            notes.append(f"{op.name} runs with {', '.join(op.redops)} only (JAX's SPMD collective has no "
                         f"{', '.join(wanted)})")
            usable = list(op.redops)
        tests.extend(Case(op, r) for r in usable)
    return tests, notes
