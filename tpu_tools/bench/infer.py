"""`infer`: the training model's forward pass at batch sizes 1..N on one device.

Latency percentiles and throughput per batch size, compile time per size, and
the cost of 1M samples at a given hourly price.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpu_tools.bench.context import BenchContext, cost_check, mismatch_warning
from tpu_tools.bench.model import LIMITS, ModelChoice, activation_bytes, model_name, peak_dtype, throughput_result
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.stats import summarize
from tpu_tools.bench.timing import time_back_to_back, time_calls, timed
from tpu_tools.workloads.transformer import TransformerConfig

DEFAULT_MAX_BATCH = 8
MAX_BATCH = LIMITS["batch_per_device"]  # larger is a usage error, not an out-of-memory


def batch_sizes_up_to(maximum: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `maximum`, which is always included."""
    sizes, size = [], 1
    while size < maximum:
        sizes.append(size)
        size *= 2
    return (*sizes, maximum)


@dataclass(frozen=True)
class InferOptions:
    model: ModelChoice = ModelChoice("tiny")
    batch_sizes: tuple[int, ...] = batch_sizes_up_to(DEFAULT_MAX_BATCH)
    price_per_hour: float | None = None


def plan(options: InferOptions) -> list[Case]:
    config = options.model.config()
    name = model_name(options.model, config)
    return [Case("infer", f"{name} batch{size}", {"config": config.to_dict(), "batch_size": size,
                                                 "price_per_hour": options.price_per_hour})
            for size in options.batch_sizes]


def run(ctx: BenchContext, case: Case) -> CaseResult:
    from tpu_tools.workloads.transformer import forward_flops, forward_step, init_params, parameter_count

    jax, jnp = ctx.jax, ctx.jax.numpy
    config = TransformerConfig(**case.params["config"])
    batch = case.params["batch_size"]
    parameters = parameter_count(config)
    ctx.require_memory(4 * parameters + activation_bytes(config, batch, training=False), f"inference {case.name}")
    device = ctx.devices[0]
    params = jax.device_put(init_params(config, ctx.next_key()), device)
    tokens = jax.device_put(
        jax.random.randint(ctx.next_key(), (batch, config.seq_len), 0, config.vocab_size, jnp.int32), device)
    forward = forward_step(config)
    # The forward pass with the previous call's output as an unused argument: back-to-back calls chain (timing.py).
    step = jax.jit(lambda p, t, previous: forward(p, t), keep_unused=True)
    shape = jax.eval_shape(forward, params, tokens)
    first = jnp.zeros(shape.shape, shape.dtype, device=device)
    compiled, compile_s = timed(lambda: step.lower(params, tokens, first).compile())
    half = replace(ctx.timing, min_time_s=ctx.timing.min_time_s / 2)  # the two measurements share the budget
    # Throughput: calls back to back, one wait per sample.
    measurement = time_back_to_back(lambda previous: compiled(params, tokens, previous), first,
                                    jax.block_until_ready, half)
    # Latency: one call at a time, each waited for, as a server answering one request at a time sees it.
    latency = time_calls(lambda _: compiled(params, tokens, first).block_until_ready(), half)

    flops = forward_flops(config, batch)
    counted = cost_check(compiled, "flops")
    result = throughput_result(case, "time_per_call_ms", measurement, batch, config, flops,
                               ctx.peak(peak_dtype(config)))
    result.stats["latency_ms"] = summarize([s * 1e3 for s in latency])
    result.values.update({
        "compile_ms": compile_s * 1e3,
        "batch_size": batch,
        "parameters": parameters,
        "model_flops_per_call": flops,
        **counted.values("xla_flops_per_call"),
    })
    result.warn(mismatch_warning("FLOPs per call", flops, counted.xla, counted.excluded))
    return result
