"""Element types a collective can be tested with, and what each can hold exactly.

Correctness checks compare results bit for bit, so inputs are small integers:
`exact_limit` is the largest integer up to which every integer is exactly
representable (and sums of non-negative inputs never overflow or round).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpu_tools.errors import UsageError


@dataclass(frozen=True)
class DType:
    name: str  # short name shown in the table: f32, bf16, ...
    numpy_name: str  # numpy / ml_dtypes name
    itemsize: int
    is_float: bool
    exact_limit: int  # every integer in [0, exact_limit] is exact; sums stay <= it
    signed: bool = True

    @property
    def needs_x64(self) -> bool:
        """jax keeps 64-bit types only with jax_enable_x64."""
        return self.itemsize == 8

    def numpy(self) -> np.dtype:
        if self.numpy_name == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.numpy_name)

    def bits_view(self) -> np.dtype:
        """An unsigned integer type of the same width, to compare bit patterns."""
        return np.dtype(f"u{self.itemsize}")


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("f32", "float32", 4, True, 1 << 24),
    DType("bf16", "bfloat16", 2, True, 1 << 8),
    DType("f16", "float16", 2, True, 1 << 11),
    DType("f64", "float64", 8, True, 1 << 53),
    DType("i8", "int8", 1, False, 127),
    DType("u8", "uint8", 1, False, 255, signed=False),
    DType("i16", "int16", 2, False, (1 << 15) - 1),
    DType("u16", "uint16", 2, False, (1 << 16) - 1, signed=False),
    DType("i32", "int32", 4, False, (1 << 31) - 1),
    DType("u32", "uint32", 4, False, (1 << 32) - 1, signed=False),
    DType("i64", "int64", 8, False, (1 << 63) - 1),
    DType("u64", "uint64", 8, False, (1 << 64) - 1, signed=False),
)}

# Other spellings users bring from numpy, jax and nccl-tests.
ALIASES = {
    "float": "f32", "float32": "f32", "fp32": "f32",
    "bfloat16": "bf16",
    "half": "f16", "float16": "f16", "fp16": "f16",
    "double": "f64", "float64": "f64", "fp64": "f64",
    "int8": "i8", "char": "i8", "uint8": "u8",
    "int16": "i16", "uint16": "u16",
    "int": "i32", "int32": "i32", "uint32": "u32",
    "int64": "i64", "uint64": "u64",
}


def dtype_names() -> list[str]:
    return list(DTYPES)


def parse_dtype(text: str) -> DType:
    key = text.strip().lower()
    key = ALIASES.get(key, key)
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {text!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[key]
