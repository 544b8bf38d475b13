"""`memory`: on-device bandwidth, STREAM style: copy, scale, add, triad, in GB/s and % of peak.

Bytes count every read and every write (copy of N bytes moves 2N), as the
published HBM figures and STREAM do. XLA's own "bytes accessed" is the cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_tools.bench.context import BenchContext, cost_check, mismatch_warning
from tpu_tools.bench.figures import record_rate, record_times
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.timing import time_back_to_back, timed
from tpu_tools.units import format_bytes

ELEMENT_BYTES = 4  # float32 elements

# name -> (arrays read, arrays written)
OPERATIONS: dict[str, tuple[int, int]] = {
    "copy": (1, 1),  # c = a
    "scale": (1, 1),  # b = s * c
    "add": (2, 1),  # c = a + b
    "triad": (2, 1),  # a = b + s * c
}
DEFAULT_SIZE_BYTES = 64 << 20


@dataclass(frozen=True)
class MemoryOptions:
    sizes: tuple[int, ...] = (DEFAULT_SIZE_BYTES,)  # bytes per array
    operations: tuple[str, ...] = tuple(OPERATIONS)


def plan(options: MemoryOptions) -> list[Case]:
    return [Case("memory", f"{operation} {format_bytes(size).replace(' ', '')}",
                 {"operation": operation, "size_bytes": size})
            for size in options.sizes for operation in options.operations]


# Each kernel takes the previous call's output last, unused: the runtime waits for it, so back-to-back calls
# run one after another (see timing.py).
def _copy(a: Any, previous: Any) -> Any:
    return a.copy()


def _scale(a: Any, s: Any, previous: Any) -> Any:
    return s * a


def _add(a: Any, b: Any, previous: Any) -> Any:
    return a + b


def _triad(a: Any, b: Any, s: Any, previous: Any) -> Any:
    return a + s * b


_KERNELS = {"copy": _copy, "scale": _scale, "add": _add, "triad": _triad}


def run(ctx: BenchContext, case: Case) -> CaseResult:
    jax, jnp = ctx.jax, ctx.jax.numpy
    operation, size = case.params["operation"], case.params["size_bytes"]
    reads, writes = OPERATIONS[operation]
    elements = max(1, size // ELEMENT_BYTES)
    moved = (reads + writes) * elements * ELEMENT_BYTES
    ctx.require_memory(moved + elements * ELEMENT_BYTES, f"{operation} of {format_bytes(size)} arrays")
    device = ctx.devices[0]
    arrays = [jax.device_put(jax.random.normal(ctx.next_key(), (elements,), jnp.float32), device)
              for _ in range(reads)]
    if operation in ("scale", "triad"):
        arrays.append(jax.device_put(jnp.float32(3.0), device))  # an argument, so XLA cannot fold it
    first = jnp.zeros((elements,), jnp.float32, device=device)
    compiled, compile_s = timed(lambda: jax.jit(_KERNELS[operation], keep_unused=True).lower(*arrays, first)
                                .compile())
    measurement = time_back_to_back(lambda previous: compiled(*arrays, previous), first, jax.block_until_ready,
                                    ctx.timing)
    result = CaseResult(case, primary="bandwidth_gbps")
    record_times(result, measurement, "time_us", 1e6)
    record_rate(result, measurement, "bandwidth_gbps", moved, 1e-9)
    peak = ctx.peak_bandwidth
    accessed = cost_check(compiled, "bytes accessed")
    result.values.update({
        "compile_ms": compile_s * 1e3,
        "bytes_per_call": moved,
        **accessed.values("xla_bytes_per_call"),
        "peak_bandwidth_gbps": peak / 1e9 if peak else None,
        "percent_of_peak": 100 * result.stats["bandwidth_gbps"].median * 1e9 / peak if peak else None,
    })
    result.warn(mismatch_warning("bytes per call", moved, accessed.xla, accessed.excluded))
    return result
