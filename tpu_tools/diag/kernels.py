"""The device programs of the diagnostics and their exact answers on the host.

Known-answer kernels use small integers (or wrapping integer arithmetic), so the exact result is known
whatever precision the device multiplies at. Everything here needs jax imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from tpu_tools.diag.digest import device_digest_words
from tpu_tools.diag.settings import GEMM_DTYPES, MEMORY_PATTERNS

__all__ = ["GEMM_DTYPES", "MEMORY_PATTERNS"]


def small_ints(size: int, multiplier: int, offset: int, modulus: int = 8) -> np.ndarray:
    values = (np.arange(size * size, dtype=np.int64) * multiplier + offset) % modulus
    return values.reshape(size, size)


def mix32(x: Any, xp: Any) -> Any:
    """A wrapping 32-bit integer mix (murmur3's finalizer), numpy or jax.numpy alike."""
    x = x ^ (x >> xp.uint32(16))
    x = x * xp.uint32(0x85EBCA6B)
    x = x ^ (x >> xp.uint32(13))
    x = x * xp.uint32(0xC2B2AE35)
    return x ^ (x >> xp.uint32(16))


@functools.cache
def known_answer_programs() -> dict[str, Callable[..., Any]]:
    """name -> jitted (a, b) -> result; each result has an exact host answer in `known_answers`."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def int_matmul(a: Any, b: Any) -> Any:
        return jnp.matmul(a.astype(jnp.int32), b.astype(jnp.int32), preferred_element_type=jnp.int32)

    def f32_matmul(a: Any, b: Any) -> Any:
        return jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision=lax.Precision.HIGHEST)

    def bf16_arith(a: Any, b: Any) -> Any:  # sums and products of 0..7 stay exact in bfloat16
        x, y = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        return x * y + x + y

    def int_mix(a: Any, b: Any) -> Any:
        x = (a.astype(jnp.uint32) * jnp.uint32(2654435761)) ^ (b.astype(jnp.uint32) << jnp.uint32(7))
        return mix32(x + lax.iota(jnp.uint32, x.size).reshape(x.shape), jnp)

    return {name: jax.jit(function) for name, function in (
        ("int32 matmul", int_matmul), ("f32 matmul", f32_matmul), ("bf16 arithmetic", bf16_arith),
        ("uint32 mix", int_mix))}


def known_answers(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    import ml_dtypes

    with np.errstate(over="ignore"):
        x = (a.astype(np.uint32) * np.uint32(2654435761)) ^ (b.astype(np.uint32) << np.uint32(7))
        mixed = mix32(x + np.arange(x.size, dtype=np.uint32).reshape(x.shape), np)
    return {
        "int32 matmul": (a @ b).astype(np.int32),
        "f32 matmul": (a @ b).astype(np.float32),
        "bf16 arithmetic": (a * b + a + b).astype(ml_dtypes.bfloat16),
        "uint32 mix": mixed,
    }


@functools.cache
def flip_program() -> Callable[[Any, Any], Any]:
    """Jitted (x, position) -> x with the lowest bit of element `position` flipped: the injected fault."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def flip(x: Any, position: Any) -> Any:
        bits = jnp.dtype(f"uint{8 * x.dtype.itemsize}")
        words = lax.bitcast_convert_type(x.reshape(-1), bits)
        words = words.at[position].set(words[position] ^ jnp.asarray(1, bits))
        return lax.bitcast_convert_type(words, x.dtype).reshape(x.shape)

    return jax.jit(flip)


def flip_bit(x: Any) -> Any:
    """One bit flipped in the middle of `x`, on the device that holds it."""
    import jax

    position = jax.device_put(np.int32(x.size // 2), next(iter(x.devices())))
    return flip_program()(x, position)


@functools.cache
def digest_program() -> Callable[[Any], Any]:
    import jax

    return jax.jit(device_digest_words)


def gemm_inputs(dtype: str, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The same inputs for every device: seeded, scaled so that no product overflows its type."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    if dtype == "int8":
        return (rng.integers(-127, 128, (size, size), dtype=np.int8),
                rng.integers(-127, 128, (size, size), dtype=np.int8))
    numpy_type = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    scale = 1.0 / np.sqrt(size)
    return ((rng.standard_normal((size, size)) * scale).astype(numpy_type),
            (rng.standard_normal((size, size)) * scale).astype(numpy_type))


# Exact GEMMs: every partial sum of a product is a small integer, exact in the dtype whatever the order of
# the reduction and the precision of the multiply (bf16 holds integers up to 256 exactly, f16 up to 2048; an
# f32 matmul at default precision may multiply in bf16, which holds inputs up to 256). Row i of A is nonzero
# only where (i + k) % STRIDE == 0, so a sum has size / STRIDE terms: their magnitudes add up to at most
# EXACT_BOUND[dtype], below what the dtype holds exactly.
EXACT_STRIDE = 8
EXACT_VALUES = {"f32": 16, "bf16": 2, "f16": 5, "int8": 127}  # inputs in -v..v


def exact_gemm_inputs(dtype: str, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, the exact product in the GEMM's output type), the same for every device and every run."""
    import ml_dtypes

    limit = EXACT_VALUES[dtype]
    rows, cols = np.indices((size, size))
    a = ((rows * 7 + cols * 3) % (2 * limit + 1) - limit) * ((rows + cols) % EXACT_STRIDE == 0)
    b = (rows * 5 + cols * 11 + 1) % (2 * limit + 1) - limit
    exact = a.astype(np.int64) @ b.astype(np.int64)
    if dtype == "int8":
        return a.astype(np.int8), b.astype(np.int8), exact.astype(np.int32)
    numpy_type = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[dtype]
    return a.astype(numpy_type), b.astype(numpy_type), exact.astype(numpy_type)


def exact_bound(dtype: str, size: int) -> int:
    """The largest sum of magnitudes of one output element's terms (below the dtype's exact integers)."""
    return (size // EXACT_STRIDE) * EXACT_VALUES[dtype] ** 2


@functools.cache
def gemm_program() -> Callable[[Any, Any], Any]:
    """Jitted (a, b) -> (product, digest of the product); int8 accumulates in int32."""
    import jax
    import jax.numpy as jnp

    def gemm(a: Any, b: Any) -> Any:
        if a.dtype == jnp.int8:
            product = jnp.matmul(a, b, preferred_element_type=jnp.int32)
        else:
            product = jnp.matmul(a, b)
        return product, device_digest_words(product)

    return jax.jit(gemm)


# Memory patterns, generated and checked on the device (32-bit words; i is the word's index).
def pattern_words(name: str, index: Any, seed: Any, xp: Any) -> Any:
    if name == "address":
        return index
    if name == "inverse-address":
        return ~index
    if name == "walking-ones":
        return xp.uint32(1) << (index % xp.uint32(32))
    if name == "walking-zeros":
        return ~(xp.uint32(1) << (index % xp.uint32(32)))
    if name == "checkerboard":  # neighbouring bits and words opposite
        return xp.where(index % xp.uint32(2) == 0, xp.uint32(0xAAAAAAAA), xp.uint32(0x55555555))
    if name == "inverse-random":
        return ~mix32(index ^ seed, xp)
    return mix32(index ^ seed, xp)


@functools.cache
def memory_programs(name: str, words: int) -> tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]:
    """(write, check): write(seed) -> the pattern buffer; check(buffer, seed) -> (wrong words, digest)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def write(seed: Any) -> Any:
        return pattern_words(name, lax.iota(jnp.uint32, words), seed, jnp)

    def check(buffer: Any, seed: Any) -> Any:
        expected = pattern_words(name, lax.iota(jnp.uint32, words), seed, jnp)
        wrong = jnp.sum(buffer != expected, dtype=jnp.uint32)
        return wrong, device_digest_words(buffer)

    # The patterns but random ignore the seed; kept, it places write on the seed's device (dropped, write would
    # run on the default device whichever device is under test).
    return jax.jit(write, keep_unused=True), jax.jit(check)


@functools.cache
def long_memory_programs(name: str, words: int) -> tuple[Callable[[Any, Any], Any], Callable[[Any, Any, Any], Any]]:
    """-r 4's chunks: write(seed, first) and check(buffer, seed, first) -> (wrong words, digest), where `first` is
    the chunk's first word index, so that one compiled program covers every chunk of the device's share."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def words_of(seed: Any, first: Any) -> Any:
        return pattern_words(name, lax.iota(jnp.uint32, words) + first, seed, jnp)

    def check(buffer: Any, seed: Any, first: Any) -> Any:
        wrong = jnp.sum(buffer != words_of(seed, first), dtype=jnp.uint32)
        return wrong, device_digest_words(buffer)

    return jax.jit(words_of, keep_unused=True), jax.jit(check)
