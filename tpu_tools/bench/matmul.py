"""`matmul`: GEMM throughput over sizes, dtypes and precisions, in TFLOP/s (TOP/s for integers) and % of peak.

The precision is JAX's (`default`, `high`, `highest`); each case records what
its f32 GEMM ran as on the platform (TF32 on NVIDIA at `default`, one bf16 pass
on a TPU) and takes that arithmetic's peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_tools.accelerators import PRECISIONS
from tpu_tools.bench.context import BenchContext, cost_check, mismatch_warning
from tpu_tools.bench.environment import matmul_arithmetic
from tpu_tools.bench.failures import Unsupported, classify
from tpu_tools.bench.figures import record_rate, record_times
from tpu_tools.bench.records import UNSUPPORTED, Case, CaseResult
from tpu_tools.bench.timing import time_back_to_back, timed
from tpu_tools.parsing import parse_number


@dataclass(frozen=True)
class MatmulDtype:
    name: str  # what users type and what results show
    jax_name: str  # jax.numpy dtype name
    result: str | None  # preferred_element_type: integers accumulate in int32
    integer: bool = False

    @property
    def itemsize_bits(self) -> int:
        return 4 if self.jax_name == "int4" else 8 if "8" in self.jax_name else 16 if "16" in self.jax_name else 32


DTYPES: dict[str, MatmulDtype] = {
    "f32": MatmulDtype("f32", "float32", None),
    "bf16": MatmulDtype("bf16", "bfloat16", None),
    "f16": MatmulDtype("f16", "float16", None),
    "int8": MatmulDtype("int8", "int8", "int32", integer=True),
    "fp8": MatmulDtype("fp8", "float8_e4m3fn", "float32"),
    "int4": MatmulDtype("int4", "int4", "int32", integer=True),
}
ALIASES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "i8": "int8", "s8": "int8",
           "float8": "fp8", "f8": "fp8", "float8_e4m3fn": "fp8", "i4": "int4", "s4": "int4"}
DEFAULT_DTYPES = ("f32", "bf16", "f16", "int8")
MAX_DIMENSION = 1 << 20  # larger is no matrix any device holds: a usage error, not an out-of-memory


def dtype_named(text: str) -> MatmulDtype:
    """Raises KeyError for an unknown name."""
    key = text.strip().lower()
    return DTYPES[ALIASES.get(key, key)]


@dataclass(frozen=True)
class Shape:
    m: int
    k: int
    n: int

    @property
    def label(self) -> str:
        """"4096" for a square problem, else "MxKxN"."""
        return str(self.m) if self.m == self.k == self.n else f"{self.m}x{self.k}x{self.n}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


def parse_shape(text: str) -> Shape:
    """"4096" (square) or "MxKxN". Raises ValueError with the reason."""
    parts = text.strip().lower().split("x")
    if len(parts) not in (1, 3):
        raise ValueError(f"{text!r} is not a matrix size (use N or MxKxN, e.g. 4096 or 8192x1024x8192)")
    values = []
    for part in parts:
        try:  # ASCII digits only: int() takes "١" and "1_0"
            value = int(parse_number(part, "matrix size", integer=True))
        except ValueError:
            raise ValueError(f"{text!r} is not a matrix size (use N or MxKxN, e.g. 4096)") from None
        if value < 1:
            raise ValueError(f"matrix size {text!r} must be at least 1")
        if value > MAX_DIMENSION:
            raise ValueError(f"matrix size {text!r} is absurdly large (at most {MAX_DIMENSION} per dimension)")
        values.append(value)
    return Shape(*(values * 3 if len(values) == 1 else values))


@dataclass(frozen=True)
class MatmulOptions:
    shapes: tuple[Shape, ...] = (Shape(1024, 1024, 1024),)
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    precisions: tuple[str, ...] = ("default",)


def plan(options: MatmulOptions) -> list[Case]:
    """One case per dtype, shape and precision; a non-default precision is part of the name (and the id)."""
    return [Case("matmul", f"{dtype} {shape.label}" + ("" if precision == "default" else f" {precision}"),
                 {"dtype": dtype, "m": shape.m, "k": shape.k, "n": shape.n, "precision": precision})
            for precision in options.precisions for dtype in options.dtypes for shape in options.shapes]


def _operand(ctx: BenchContext, dtype: MatmulDtype, shape: tuple[int, int]) -> Any:
    jax, jnp = ctx.jax, ctx.jax.numpy
    device = ctx.devices[0]
    key = ctx.next_key()
    if dtype.integer:
        low, high = (-8, 8) if dtype.jax_name == "int4" else (-128, 128)
        values = jax.random.randint(key, shape, low, high, jnp.int32).astype(jnp.int8)
    else:
        values = jax.random.normal(key, shape, jnp.float32)
    return jax.device_put(values, device).astype(getattr(jnp, dtype.jax_name))


def run(ctx: BenchContext, case: Case) -> CaseResult:
    jax, jnp = ctx.jax, ctx.jax.numpy
    dtype = DTYPES[case.params["dtype"]]
    shape = Shape(case.params["m"], case.params["k"], case.params["n"])
    precision = case.params.get("precision", "default")
    if precision not in PRECISIONS:
        raise Unsupported(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    result_bits = 32 if dtype.result else dtype.itemsize_bits
    # Two results live at once: the one being computed and the previous one, which chains the calls.
    ctx.require_memory((shape.m * shape.k + shape.k * shape.n) * dtype.itemsize_bits // 8
                       + 2 * shape.m * shape.n * result_bits // 8, f"a {dtype.name} {shape.label} matmul")
    preferred = getattr(jnp, dtype.result) if dtype.result else None

    def gemm(a: Any, b: Any, previous: Any) -> Any:
        # `previous` is unused: the runtime waits for it, which keeps back-to-back calls in order.
        return jnp.matmul(a, b, preferred_element_type=preferred, precision=precision)

    try:
        a = _operand(ctx, dtype, (shape.m, shape.k))
        b = _operand(ctx, dtype, (shape.k, shape.n))
        first = jnp.zeros((shape.m, shape.n), preferred or a.dtype, device=ctx.devices[0])
        compiled, compile_s = timed(lambda: jax.jit(gemm, keep_unused=True).lower(a, b, first).compile())
    except Exception as error:
        if classify(error, ctx.platform)[0] == UNSUPPORTED:
            what = dtype.name if precision == "default" else f"{dtype.name} at precision {precision}"
            raise Unsupported(f"{what} matmul is unsupported on {ctx.platform}") from error
        raise

    measurement = time_back_to_back(lambda previous: compiled(a, b, previous), first, jax.block_until_ready,
                                    ctx.timing)
    unit = "tops" if dtype.integer else "tflops"
    result = CaseResult(case, primary=f"throughput_{unit}")
    record_times(result, measurement, "time_us", 1e6)
    record_rate(result, measurement, f"throughput_{unit}", shape.flops, 1e-12)
    flops = cost_check(compiled, "flops")
    peak = ctx.peak(dtype.name, precision)
    median_rate = result.stats[f"throughput_{unit}"].median * 1e12
    result.values.update({
        "compile_ms": compile_s * 1e3,
        "precision": precision,
        "arithmetic": matmul_arithmetic(ctx.device, dtype.name, precision),
        "flops_per_call": shape.flops,
        **flops.values("xla_flops_per_call"),
        "peak_ops_per_s": peak,
        "percent_of_peak": 100 * median_rate / peak if peak else None,
    })
    result.warn(mismatch_warning("FLOPs per call", shape.flops, flops.xla, flops.excluded))
    return result
