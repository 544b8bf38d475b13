"""The size sweep (-b/-e with -f or -i) and its rounding to what the ranks can split."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tools.collectives.dtypes import DType
from tpu_tools.collectives.ops import OpSpec
from tpu_tools.errors import UsageError
from tpu_tools.units import format_bytes

MAX_SIZES = 1000


def sweep_sizes(min_bytes: int, max_bytes: int, factor: float | None = None,
                step_bytes: int | None = None) -> list[int]:
    """Requested sizes from min to max: multiplied by `factor`, or `step_bytes` apart."""
    if min_bytes < 1:
        raise UsageError(f"--min-bytes must be at least 1 byte, got {min_bytes}")
    if min_bytes > max_bytes:
        raise UsageError(f"--min-bytes ({format_bytes(min_bytes)}) is larger than --max-bytes "
                         f"({format_bytes(max_bytes)})")
    if factor is not None and step_bytes is not None:
        raise UsageError("give either --step-factor or --step-bytes, not both")
    if step_bytes is not None:
        if step_bytes < 1:
            raise UsageError(f"--step-bytes must be at least 1 byte, got {step_bytes}")
        count = (max_bytes - min_bytes) // step_bytes + 1
        _check_count(count)
        return list(range(min_bytes, max_bytes + 1, step_bytes))
    factor = 2.0 if factor is None else factor
    if not factor > 1:
        raise UsageError(f"--step-factor must be greater than 1, got {factor:g}")
    sizes = [min_bytes]
    while True:
        following = int(sizes[-1] * factor)
        following = following if following > sizes[-1] else sizes[-1] + 1
        if following > max_bytes:
            break
        sizes.append(following)
        _check_count(len(sizes))
    return sizes


def _check_count(count: int) -> None:
    if count > MAX_SIZES:
        raise UsageError(f"the sweep would have {count} sizes (at most {MAX_SIZES}); use a larger step")


@dataclass(frozen=True)
class SizePlan:
    requested_bytes: int
    size_bytes: int  # what runs, after rounding
    count: int  # the count column: elements per rank (or per peer)


def plan_sizes(sizes: list[int], op: OpSpec, dtype: DType, ranks: int) -> tuple[list[SizePlan], str | None]:
    """Round each size down to a whole number of elements per rank, as nccl-tests does.

    A size too small for one element per rank runs with one; sizes that round
    to the same value run once. Returns the plans and a note when anything moved.
    """
    unit = dtype.itemsize * (ranks if op.gathered else 1)
    plans: list[SizePlan] = []
    moved: list[str] = []
    seen: set[int] = set()
    for requested in sizes:
        count = max(1, requested // unit)
        size = op.size_bytes(count, dtype.itemsize, ranks)
        if size != requested:
            moved.append(f"{requested} -> {size}")
        if size in seen:
            continue
        seen.add(size)
        plans.append(SizePlan(requested, size, count))
    if not moved:
        return plans, None
    what = (f"{ranks} ranks x {dtype.itemsize} B ({dtype.name})" if op.gathered
            else f"{dtype.itemsize} B ({dtype.name})")
    shown = ", ".join(moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
    return plans, (f"{op.name}: sizes must be a multiple of {what} = {unit} B; rounded down as nccl-tests "
                   f"does (at least one element per rank): {shown}")
