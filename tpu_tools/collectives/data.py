"""Crafted inputs whose collective result is exact, and that result computed on the host.

Every value is a small non-negative integer, chosen per dtype and rank count so
that no sum or product rounds or overflows: the device result must then equal
the host result bit for bit. Values depend on the element index, the rank and
the group, so a chunk from the wrong rank, group or offset shows up as wrong.
Patterns are periodic in the element index, so host work is a small table per
group, repeated to the buffer length (cheap even for GiB buffers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tpu_tools.collectives.dtypes import DType
from tpu_tools.collectives.ops import Case

MOVE_MODULUS = 251  # a prime: rank offsets 31*r stay distinct for up to 251 ranks
RANK_STRIDE = 31
GROUP_STRIDE = 17
SUM_CAP = 16  # summands stay below this: sums are exact even in bf16 on 16 ranks


def _repeat(table: np.ndarray, offset: int, length: int) -> np.ndarray:
    """table[(j + offset) % len(table)] for j in range(length)."""
    return np.resize(np.roll(table, -(offset % len(table))), length)


@dataclass
class Crafted:
    """Inputs and expected outputs of one test at one size, for every (group, rank)."""

    test: Case
    dtype: DType
    ranks: int
    count: int
    shift: int = 1
    root: int = 0
    _tables: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        limit = self.dtype.exact_limit
        self.move_modulus = min(MOVE_MODULUS, limit)
        self.sum_modulus = min(SUM_CAP, limit // self.ranks + 1)  # (m - 1) * ranks <= limit
        self.avg_modulus = max(1, min(SUM_CAP, limit // self.ranks - 1))
        twos = max(1, limit.bit_length() - 1)  # 2**twos <= limit
        self.prod_period = max(2, math.ceil(self.ranks / twos))

    # --- inputs ---------------------------------------------------------------------------------------
    def input(self, group: int, rank: int) -> np.ndarray:
        table, offset = self._input_pattern(group, rank)
        return self._typed(table, offset, self.test.op.input_elements(self.count, self.ranks))

    def in_place_input(self, group: int, rank: int) -> np.ndarray:
        """The buffer an in-place call starts from: the input, where nccl-tests keeps it.

        all-gather's input is the own chunk of the full-size buffer, at rank x count (the rest is
        zero: the gather overwrites it); every other op's in-place buffer is its input.
        """
        if self.test.op.name != "all-gather":
            return self.input(group, rank)
        buffer = np.zeros(self.count * self.ranks, self.dtype.numpy())
        buffer[rank * self.count:(rank + 1) * self.count] = self.input(group, rank)
        return buffer

    def in_place_expected(self, group: int, rank: int) -> np.ndarray:
        """The in-place buffer after one call: reduce-scatter leaves its input but for its own chunk."""
        if self.test.op.name != "reduce-scatter":
            return self.expected(group, rank)
        buffer = self.input(group, rank).copy()
        buffer[rank * self.count:(rank + 1) * self.count] = self.expected(group, rank)
        return buffer

    def _typed(self, table: np.ndarray, offset: int, length: int) -> np.ndarray:
        """A buffer in the test's type; the cast happens on the small table, not on the buffer."""
        return _repeat(table.astype(self.dtype.numpy()), offset, length)

    def _input_pattern(self, group: int, rank: int) -> tuple[np.ndarray, int]:
        """One period of a rank's input (exact integers) and where the rank starts in it."""
        op, redop = self.test.op.name, self.test.redop
        if redop == "sum" or op == "reduce-scatter":
            if self.sum_modulus >= 2:
                return np.arange(self.sum_modulus), 3 * rank + 7 * group
            # More ranks than the type can count: one rank contributes 1 per element.
            return np.where(np.arange(self.ranks) == 0, 1, 0), rank
        if redop == "prod":
            return np.where(np.arange(self.prod_period) == 0, 2, 1), rank + group
        if redop == "avg":
            return np.arange(self.avg_modulus) + 1 + self._avg_offset(rank), 7 * group
        return self._move_table(), RANK_STRIDE * rank + GROUP_STRIDE * group  # max, min, data movement

    def _avg_offset(self, rank: int) -> int:
        if self.avg_modulus < 2 and self.dtype.exact_limit // self.ranks < 2:
            return 0
        if self.ranks % 2 == 1 and rank == self.ranks - 1:
            return 0  # offsets +1, -1, ..., 0 sum to zero: the mean is the shared part
        return 1 if rank % 2 == 0 else -1

    def _move_table(self) -> np.ndarray:
        if "move" not in self._tables:
            self._tables["move"] = np.arange(self.move_modulus)
        return self._tables["move"]

    def _moved(self, group: int, rank: int, start: int, length: int) -> np.ndarray:
        """Elements start..start+length of a rank's input in a data-movement test."""
        return self._typed(self._move_table(), start + RANK_STRIDE * rank + GROUP_STRIDE * group, length)

    # --- expected outputs ---------------------------------------------------------------------------
    def expected(self, group: int, rank: int) -> np.ndarray:
        op = self.test.op.name
        n, count = self.ranks, self.count
        length = self.test.op.output_elements(count, n)
        if op == "all-reduce":
            return self._reduced(group, 0, length)
        if op == "reduce-scatter":
            return self._reduced(group, rank * count, length)
        if op == "all-gather":
            return np.concatenate([self._moved(group, k, 0, count) for k in range(n)])
        if op == "all-to-all":
            return np.concatenate([self._moved(group, k, rank * count, count) for k in range(n)])
        if op == "permute":
            return self._moved(group, (rank - self.shift) % n, 0, length)
        if op == "broadcast":
            return self._moved(group, self.root, 0, length)
        raise ValueError(f"no expectation for {op}")

    def _reduced(self, group: int, start: int, length: int) -> np.ndarray:
        """Elements start..start+length of the reduction over ranks of every rank's input."""
        redop = self.test.redop or "sum"
        if redop == "avg":
            return self._typed(np.arange(self.avg_modulus) + 1, 7 * group + start, length)
        # Every rank's input over one common period, reduced on the host in exact integers.
        period = math.lcm(*(len(self._input_pattern(group, r)[0]) for r in range(self.ranks)))
        rows = np.stack([_repeat(*self._input_pattern(group, r), period) for r in range(self.ranks)])
        rows = rows.astype(np.int64)
        table = {"sum": rows.sum(0), "prod": rows.prod(0), "max": rows.max(0), "min": rows.min(0)}[redop]
        return self._typed(table, start, length)


def count_wrong(actual: np.ndarray, expected: np.ndarray, dtype: DType) -> int:
    """Elements whose bit pattern differs (a missing or misshapen result counts every element)."""
    actual = np.ascontiguousarray(actual).reshape(-1)
    expected = np.ascontiguousarray(expected).reshape(-1)
    if actual.shape != expected.shape:
        return max(actual.size, expected.size)
    bits = dtype.bits_view()
    return int(np.count_nonzero(actual.view(bits) != expected.view(bits)))
