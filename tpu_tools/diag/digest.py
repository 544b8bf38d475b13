"""A bitwise digest of an array, the same on the host (numpy) and on a device (jax).

Every element is viewed as 32-bit words. The digest is two words: a position-mixed sum (order matters: a
swapped pair changes it) and the exclusive-or of all words (any single flipped bit changes it). Both use
only wrapping 32-bit integer arithmetic, which every platform computes exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GOLDEN = 0x9E3779B9
MIX = 0x85EBCA6B


def host_words(array: np.ndarray) -> np.ndarray:
    """The array's bits as a flat uint32 vector (narrower types widened, wider ones split)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    size = flat.dtype.itemsize
    if size == 4:
        return flat.view(np.uint32)
    if size == 8:
        return flat.view(np.uint32)
    return flat.view(np.dtype(f"u{size}")).astype(np.uint32)


def host_digest(array: np.ndarray) -> str:
    words = host_words(array)
    index = np.arange(words.size, dtype=np.uint32)
    with np.errstate(over="ignore"):
        mixed = (words ^ (index * np.uint32(GOLDEN))) * np.uint32(MIX)
        mixed ^= mixed >> np.uint32(13)
        total = int(np.sum(mixed, dtype=np.uint32))
    xor = int(np.bitwise_xor.reduce(words)) if words.size else 0
    return f"{total:08x}{xor:08x}"


def device_words(x: Any) -> Any:
    import jax.numpy as jnp
    from jax import lax

    size = x.dtype.itemsize
    flat = x.reshape(-1)
    if size == 4:
        return lax.bitcast_convert_type(flat, jnp.uint32)
    if size == 8:
        return lax.bitcast_convert_type(flat, jnp.uint32).reshape(-1)
    return lax.bitcast_convert_type(flat, jnp.dtype(f"uint{8 * size}")).astype(jnp.uint32)


def device_digest_words(x: Any) -> Any:
    """Inside a jitted program: the digest as a uint32[2] array (read it with `digest_text`)."""
    import jax.numpy as jnp
    from jax import lax

    words = device_words(x)
    index = lax.iota(jnp.uint32, words.shape[0])
    mixed = (words ^ (index * jnp.uint32(GOLDEN))) * jnp.uint32(MIX)
    mixed = mixed ^ (mixed >> jnp.uint32(13))
    total = jnp.sum(mixed, dtype=jnp.uint32)
    xor = lax.reduce(words, jnp.uint32(0), lax.bitwise_xor, (0,))
    return jnp.stack([total, xor])


def digest_text(words: Any) -> str:
    total, xor = (int(v) for v in np.asarray(words).reshape(-1)[:2])
    return f"{total:08x}{xor:08x}"
