"""`train`: a transformer training step, data parallel over all local devices.

Samples/s, tokens/s, step time percentiles, compile time, model FLOPs per step
(analytic, cross-checked with XLA), MFU where the peak is known, and the cost of
1M samples at a given hourly price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpu_tools.bench.context import BenchContext, cost_check, mismatch_warning
from tpu_tools.bench.failures import CaseSkipped
from tpu_tools.bench.model import ModelChoice, activation_bytes, model_name, peak_dtype, state_bytes, throughput_result
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.timing import time_back_to_back, timed
from tpu_tools.workloads.transformer import TransformerConfig


@dataclass(frozen=True)
class TrainOptions:
    models: tuple[ModelChoice, ...] = (ModelChoice("tiny"),)
    price_per_hour: float | None = None


def plan(options: TrainOptions) -> list[Case]:
    cases = []
    for choice in options.models:
        config = choice.config()
        cases.append(Case("train", model_name(choice, config),
                          {"config": config.to_dict(), "price_per_hour": options.price_per_hour}))
    return cases


def run(ctx: BenchContext, case: Case) -> CaseResult:
    from tpu_tools.workloads.transformer import (
        data_parallel_train_step,
        init_train_state,
        parameter_count,
        random_tokens,
        train_step_flops,
    )

    jax = ctx.jax
    config = TransformerConfig(**case.params["config"])
    devices = ctx.devices
    batch = config.batch_per_device * len(devices)
    parameters = parameter_count(config)
    ctx.require_memory(state_bytes(parameters) + activation_bytes(config, config.batch_per_device, training=True),
                       f"training {case.name}")
    step, state_sharding, batch_sharding = data_parallel_train_step(config, devices)
    state = jax.device_put(init_train_state(config, ctx.next_key()), state_sharding)
    tokens = jax.device_put(random_tokens(config, batch, ctx.next_key()), batch_sharding)
    compiled, compile_s = timed(lambda: step.lower(state, tokens).compile())

    # Each step takes the previous step's state (donated): the steps chain by their data, back to back.
    measurement = time_back_to_back(lambda previous: compiled(previous[0], tokens), (state, None),
                                    jax.block_until_ready, ctx.timing)
    loss = float(measurement.last[1])
    if not math.isfinite(loss):
        raise CaseSkipped(f"the training loss is {loss} after {measurement.calls} steps")

    model_flops = train_step_flops(config, batch)
    flops = cost_check(compiled, "flops", len(devices))  # XLA counts per device
    peak = ctx.peak(peak_dtype(config))
    result = throughput_result(case, "step_time_ms", measurement, batch, config, model_flops,
                               peak * len(devices) if peak else None)
    result.values.update({
        "compile_ms": compile_s * 1e3,
        "devices": len(devices),
        "global_batch": batch,
        "parameters": parameters,
        "model_flops_per_step": model_flops,
        **flops.values("xla_flops_per_step"),
        "final_loss": loss,
    })
    result.warn(mismatch_warning("FLOPs per step", model_flops, flops.xla, flops.excluded))
    return result
