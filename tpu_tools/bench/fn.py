"""`fn`: a user's own function (MODULE:FUNCTION with --arg specs), timed as the built-in benchmarks are timed.

The function is compiled once, with one more (unused) argument that takes the previous call's output: the
calls then run back to back in order, as the built-in GEMM's do (`tpu_tools.bench.timing`). Its inputs are
random arrays of the --arg shapes on the first device. XLA's cost analysis of the compiled program gives the
FLOPs and bytes of a call; over the measured time per call they are the achieved FLOP/s and bytes/s, against
the device's peaks (% of peak) and the roofline: the best case a call could take (the larger of its FLOPs at the
compute peak and its bytes at the memory bandwidth) over the time it took, and which ceiling it is nearer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_tools.bench.context import BenchContext, cost_check
from tpu_tools.bench.figures import record_rate, record_times
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.timing import time_back_to_back, timed
from tpu_tools.errors import RuntimeFailure, first_line
from tpu_tools.userfn.roofline import ceilings, compute_dtype
from tpu_tools.userfn.specs import ArgSpec, argument_bytes, parse_arg_spec, random_arguments
from tpu_tools.userfn.target import check_arity, resolve_target


@dataclass(frozen=True)
class FnOptions:
    target: str = ""
    args: tuple[ArgSpec, ...] = ()


def plan(options: FnOptions) -> list[Case]:
    """One case: the target with its argument specs (their text is part of the case's id)."""
    texts = [spec.text for spec in options.args]
    return [Case("fn", f"{options.target} {','.join(texts)}".strip(), {"target": options.target, "args": texts})]


@dataclass(frozen=True)
class Placement:
    """Where a call sits against the device's ceilings, from its measured time and XLA's counts."""

    compute_percent: float | None  # achieved FLOP/s over the compute peak
    bandwidth_percent: float | None  # achieved bytes/s over the memory bandwidth
    predicted_bound: str | None  # "compute" or "memory": the ceiling XLA's counts say bounds it
    measured_bound: str | None  # the ceiling the measured rates are nearer
    best_case_us: float | None  # the larger of FLOPs at the peak and bytes at the bandwidth
    percent_of_roofline: float | None  # best case over the measured time

    def values(self) -> dict[str, Any]:
        return {"percent_of_peak": self.compute_percent, "percent_of_peak_bandwidth": self.bandwidth_percent,
                "roofline_bound": self.predicted_bound, "measured_bound": self.measured_bound,
                "roofline_best_case_us": self.best_case_us, "percent_of_roofline": self.percent_of_roofline}


def placement(seconds: float, flops: float | None, bytes_accessed: float | None, peak: float | None,
              bandwidth: float | None) -> Placement:
    compute = 100 * flops / seconds / peak if flops and peak and seconds > 0 else None
    memory = 100 * bytes_accessed / seconds / bandwidth if bytes_accessed and bandwidth and seconds > 0 else None
    limits = ceilings(flops, bytes_accessed, peak, bandwidth)
    measured = None
    if compute is not None and memory is not None:
        measured = "compute" if compute >= memory else "memory"
    best = limits.best_case_s
    return Placement(compute, memory, limits.bound, measured, best * 1e6 if best is not None else None,
                     100 * best / seconds if best is not None and seconds > 0 else None)


def run(ctx: BenchContext, case: Case) -> CaseResult:
    jax, jnp = ctx.jax, ctx.jax.numpy
    target = case.params["target"]
    specs = [parse_arg_spec(text) for text in case.params["args"]]
    function = resolve_target(target)
    check_arity(target, function, len(specs))
    device = ctx.devices[0]
    ctx.require_memory(argument_bytes(specs), f"the arguments of {target}")
    arguments = random_arguments(jax, specs, ctx.next_key(), device)
    try:
        outputs = jax.eval_shape(function, *arguments)
    except Exception as error:
        raise RuntimeFailure(f"tracing {target} with {', '.join(case.params['args']) or 'no arguments'} failed: "
                             f"{type(error).__name__}: {first_line(error, default='')}") from error
    output_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(outputs))
    ctx.require_memory(2 * output_bytes, f"two outputs of {target}")  # the one computed and the one chaining
    first = jax.tree_util.tree_map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype, device=device), outputs)

    def chained(*arguments_then_previous: Any) -> Any:
        # The last argument, the previous call's output, is unused: the runtime waits for it, which keeps
        # back-to-back calls in order. The arguments are passed flat, as a hand-written call passes them.
        return function(*arguments_then_previous[:-1])

    compiled, compile_s = timed(lambda: jax.jit(chained, keep_unused=True).lower(*arguments, first).compile())
    measurement = time_back_to_back(lambda previous: compiled(*arguments, previous), first, jax.block_until_ready,
                                    ctx.timing)
    flops = cost_check(compiled, "flops")
    accessed = cost_check(compiled, "bytes accessed")
    # Counts that leave out library calls (cuBLAS) would make rates of a part of the work: none are made.
    flop_count = None if flops.excluded else flops.xla
    byte_count = None if accessed.excluded else accessed.xla
    result = CaseResult(case, primary="time_us")
    record_times(result, measurement, "time_us", 1e6)
    if flop_count:
        record_rate(result, measurement, "throughput_tflops", flop_count, 1e-12)
        result.primary = "throughput_tflops"
    if byte_count:
        record_rate(result, measurement, "bandwidth_gbps", byte_count, 1e-9)
    dtype = compute_dtype([spec.dtype for spec in specs])
    peak, bandwidth = ctx.peak(dtype), ctx.peak_bandwidth
    seconds = result.stats["time_us"].median / 1e6
    result.values.update({
        "compile_ms": compile_s * 1e3,
        **flops.values("xla_flops_per_call"),
        **accessed.values("xla_bytes_per_call"),
        "peak_dtype": dtype,
        "peak_ops_per_s": peak,
        "peak_bandwidth_gbps": bandwidth / 1e9 if bandwidth else None,
        "arithmetic_intensity_flops_per_byte": flop_count / byte_count if flop_count and byte_count else None,
        **placement(seconds, flop_count, byte_count, peak, bandwidth).values(),
    })
    if flops.excluded:
        result.warn(f"XLA's cost analysis leaves out the work of library calls ({', '.join(flops.excluded)}): "
                    "no FLOP/s or bytes/s is reported from its counts")
    elif not flop_count:
        result.warn("XLA's cost analysis counts no FLOPs for this program: only its time is reported")
    return result
