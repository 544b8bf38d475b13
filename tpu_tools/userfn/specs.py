"""The --arg specs of a user's function ("f32[128,512]", "bf16[8]", "i32[]") and the arguments they make."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.parsing import ascii_digits
from tpu_tools.shorten import quoted

# Short dtype names (as HLO prints them) -> numpy / ml_dtypes names.
DTYPES = {
    "pred": "bool", "bool": "bool",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}
MAX_RANK = 64
MAX_ARGUMENT_BYTES = 1 << 60  # far beyond any device, well inside XLA's int64 size arithmetic
_ITEM_BITS = {"bool": 8, "int8": 8, "uint8": 8, "float8_e4m3fn": 8, "float8_e5m2": 8, "int16": 16, "uint16": 16,
              "float16": 16, "bfloat16": 16, "int32": 32, "uint32": 32, "float32": 32, "int64": 64, "uint64": 64,
              "float64": 64, "complex64": 64, "complex128": 128}
_SPEC = re.compile(r"^\s*(?P<dtype>[a-z][a-z0-9]*)\s*(?:\[(?P<dims>[^\]]*)\])?\s*$")


@dataclass(frozen=True)
class ArgSpec:
    dtype: str  # short name, e.g. "f32"
    shape: tuple[int, ...]

    @property
    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def parse_arg_spec(text: str) -> ArgSpec:
    """ "f32[128,512]" -> ArgSpec("f32", (128, 512)); "i32[]" and "i32" are scalars."""
    match = _SPEC.match(text.lower())
    shown = quoted(text, 60)
    if not match or match["dtype"] not in DTYPES:
        raise UsageError(f"bad --arg {shown}: expected DTYPE[DIM,...] such as f32[128,512], bf16[8] or i32[] "
                         f"(dtypes: {', '.join(sorted(set(DTYPES) - {'bool', 'i8', 'i16', 'i32', 'i64'}))})")
    dims_text = (match["dims"] or "").strip()
    dims: list[int] = []
    if dims_text:
        for part in dims_text.split(","):
            part = part.strip()
            if not ascii_digits(part) or len(part) > 19:  # str.isdigit() takes "²", which int() refuses
                raise UsageError(f"bad --arg {shown}: dimension {quoted(part, 24)} is not a whole number >= 0")
            dims.append(int(part))
    if len(dims) > MAX_RANK:
        raise UsageError(f"bad --arg {shown}: {len(dims)} dimensions, XLA takes at most {MAX_RANK}")
    dtype = match["dtype"]
    elements = math.prod(dims)
    # XLA computes sizes in int64 and aborts the process (no exception) on an overflow: refuse it here.
    if elements * _ITEM_BITS.get(DTYPES[dtype], 64) // 8 > MAX_ARGUMENT_BYTES:
        raise UsageError(f"bad --arg {shown}: {elements:.3g} elements is far beyond any device "
                         "(at most 1 EiB per argument)")
    canonical = {"bool": "pred", "i8": "s8", "i16": "s16", "i32": "s32", "i64": "s64"}.get(dtype, dtype)
    return ArgSpec(canonical, tuple(dims))


def abstract_arguments(specs: list[ArgSpec]) -> list[Any]:
    """jax.ShapeDtypeStruct for each --arg spec."""
    import jax
    import numpy as np

    return [jax.ShapeDtypeStruct(s.shape, np_dtype(np, s.dtype)) for s in specs]


_SHORT = {numpy_name: short for short, numpy_name in DTYPES.items()
          if short not in ("bool", "i8", "i16", "i32", "i64")}


def short_dtype(dtype: Any) -> str:
    return _SHORT.get(str(dtype), str(dtype))


def describe_argument(jax: Any, argument: Any) -> str:
    """"f32[128,512]" for an array; a pytree of arrays is counted."""
    if hasattr(argument, "shape") and hasattr(argument, "dtype"):
        return ArgSpec(short_dtype(argument.dtype), tuple(argument.shape)).text
    leaves = jax.tree_util.tree_leaves(argument)
    return f"pytree of {len(leaves)} arrays"


def np_dtype(np: Any, name: str) -> Any:
    numpy_name = DTYPES[name]
    if hasattr(np, numpy_name):
        return np.dtype(numpy_name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, numpy_name))


def argument_bytes(specs: list[ArgSpec]) -> int:
    """Bytes the arguments take on a device."""
    return sum(math.prod(s.shape) * _ITEM_BITS.get(DTYPES[s.dtype], 64) // 8 for s in specs)


def random_arguments(jax: Any, specs: list[ArgSpec], key: Any, device: Any) -> list[Any]:
    """Concrete arguments on `device` for the specs: random, never zeros (a zero input flatters some kernels).

    Floats and complex numbers are standard normal, integers uniform in [-8, 8) (unsigned [0, 8)), booleans
    fair coins.
    """
    import numpy as np

    jnp = jax.numpy
    arrays = []
    for spec, subkey in zip(specs, jax.random.split(key, max(1, len(specs))), strict=False):
        dtype = np_dtype(np, spec.dtype)
        kind = DTYPES[spec.dtype]
        if kind == "bool":
            values = jax.random.bernoulli(subkey, 0.5, spec.shape)
        elif kind.startswith(("int", "uint")):
            values = jax.random.randint(subkey, spec.shape, 0 if kind.startswith("uint") else -8, 8, jnp.int32)
        elif kind.startswith("complex"):
            values = jax.random.normal(subkey, spec.shape, jnp.complex64)
        else:
            values = jax.random.normal(subkey, spec.shape, jnp.float32)
        arrays.append(jax.device_put(values, device).astype(dtype))
    return arrays
