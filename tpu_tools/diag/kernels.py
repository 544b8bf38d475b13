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


GEMM_DTYPES = ("f32", "bf16", "f16", "int8")


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
MEMORY_PATTERNS = ("address", "walking-ones", "walking-zeros", "random")


def pattern_words(name: str, index: Any, seed: Any, xp: Any) -> Any:
    if name == "address":
        return index
    if name == "walking-ones":
        return xp.uint32(1) << (index % xp.uint32(32))
    if name == "walking-zeros":
        return ~(xp.uint32(1) << (index % xp.uint32(32)))
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
