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
    _tables: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        limit = self.dtype.exact_limit
        self.move_modulus = min(MOVE_MODULUS, limit)
        self.sum_modulus = min(SUM_CAP, limit // self.ranks + 1)  # (m - 1) * ranks <= limit
        self.avg_modulus = max(1, min(SUM_CAP, limit // self.ranks - 1))
        twos = max(1, limit.bit_length() - 1)  # 2**twos <= limit
        self.prod_period = max(2, math.ceil(self.ranks / twos))

    # --- inputs -------------------------------------------------------------------------------------
    def input(self, group: int, rank: int) -> np.ndarray:
        length = self.test.op.input_elements(self.count, self.ranks)
        return self._input_values(group, rank, length).astype(self.dtype.numpy())

    def _input_values(self, group: int, rank: int, length: int) -> np.ndarray:
        """The first `length` input elements of a rank, as exact integers."""
        op, redop = self.test.op.name, self.test.redop
        if redop == "sum" or op == "reduce-scatter":
            values = self._sum_input(group, rank, length)
        elif redop == "prod":
            period = self.prod_period
            table = np.where(np.arange(period) == 0, 2, 1)
            values = _repeat(table, rank + group, length)
        elif redop == "avg":
            values = _repeat(np.arange(self.avg_modulus) + 1, 7 * group, length) + self._avg_offset(rank)
        else:  # max, min and every data movement
            values = self._move_pattern(group, rank, 0, length)
        return values

    def _sum_input(self, group: int, rank: int, length: int) -> np.ndarray:
        if self.sum_modulus >= 2:
            return _repeat(np.arange(self.sum_modulus), 3 * rank + 7 * group, length)
        # More ranks than the type can count: one rank contributes 1 per element.
        return _repeat(np.where(np.arange(self.ranks) == 0, 1, 0), rank, length)

    def _avg_offset(self, rank: int) -> int:
        if self.avg_modulus < 2 and self.dtype.exact_limit // self.ranks < 2:
            return 0
        if self.ranks % 2 == 1 and rank == self.ranks - 1:
            return 0  # offsets +1, -1, ..., 0 sum to zero: the mean is the shared part
        return 1 if rank % 2 == 0 else -1

    def _move_pattern(self, group: int, rank: int, start: int, length: int) -> np.ndarray:
        table = self._table("move", lambda: np.arange(self.move_modulus))
        return _repeat(table, start + RANK_STRIDE * rank + GROUP_STRIDE * group, length)

    def _table(self, key: str, build) -> np.ndarray:
        if key not in self._tables:
            self._tables[key] = build()
        return self._tables[key]

    # --- expected outputs ---------------------------------------------------------------------------
    def expected(self, group: int, rank: int) -> np.ndarray:
        op, redop = self.test.op.name, self.test.redop
        n, count = self.ranks, self.count
        length = self.test.op.output_elements(count, n)
        if op == "all-reduce":
            values = self._reduced(group, 0, length)
        elif op == "reduce-scatter":
            values = self._reduced(group, rank * count, length)
        elif op == "all-gather":
            values = np.concatenate([self._move_pattern(group, k, 0, count) for k in range(n)])
        elif op == "all-to-all":
            values = np.concatenate([self._move_pattern(group, k, rank * count, count) for k in range(n)])
        elif op == "permute":
            values = self._move_pattern(group, (rank - self.shift) % n, 0, length)
        elif op == "broadcast":
            values = self._move_pattern(group, self.root, 0, length)
        else:
            raise ValueError(f"no expectation for {op}")
        return values.astype(self.dtype.numpy())

    def _reduced(self, group: int, start: int, length: int) -> np.ndarray:
        """Elements start..start+length of the reduction over ranks of every rank's input."""
        redop = self.test.redop or "sum"
        if redop == "avg":
            return _repeat(np.arange(self.avg_modulus) + 1, 7 * group + start, length)
        # One period of every rank's input, reduced on the host in exact integers.
        period = {"sum": self.sum_modulus if self.sum_modulus >= 2 else self.ranks,
                  "prod": self.prod_period}.get(redop, self.move_modulus)
        rows = np.stack([self._input_values(group, r, period) for r in range(self.ranks)]).astype(np.int64)
        table = {"sum": rows.sum(0), "prod": rows.prod(0), "max": rows.max(0), "min": rows.min(0)}[redop]
        return _repeat(table, start, length)


def count_wrong(actual: np.ndarray, expected: np.ndarray, dtype: DType) -> int:
    """Elements whose bit pattern differs (a missing or misshapen result counts every element)."""
    actual = np.ascontiguousarray(actual).reshape(-1)
    expected = np.ascontiguousarray(expected).reshape(-1)
    if actual.shape != expected.shape:
        return max(actual.size, expected.size)
    bits = dtype.bits_view()
    return int(np.count_nonzero(actual.view(bits) != expected.view(bits)))
