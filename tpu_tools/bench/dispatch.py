"""`dispatch`: the latency of launching a tiny computation and waiting for it, in microseconds.

`compiled`: an already compiled one-element add, called directly (the floor of
op-by-op execution). `eager`: the same add as an eager `jax.numpy` call, which
also pays jax's dispatch path (cache lookup, argument handling).

`latency_us` is one call waited for, the round trip; `back_to_back_us` the time
per call when each call takes the previous result and only the last is waited
for, what a program that does not wait between operations pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_tools.bench.context import BenchContext
from tpu_tools.bench.figures import record_times
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.stats import summarize
from tpu_tools.bench.timing import time_back_to_back, time_calls, timed

MODES = ("compiled", "eager")


@dataclass(frozen=True)
class DispatchOptions:
    modes: tuple[str, ...] = MODES


def plan(options: DispatchOptions) -> list[Case]:
    return [Case("dispatch", mode, {"mode": mode}) for mode in options.modes]


def run(ctx: BenchContext, case: Case) -> CaseResult:
    jax, jnp = ctx.jax, ctx.jax.numpy
    x = jax.device_put(jax.random.normal(ctx.next_key(), (1,), jnp.float32), ctx.devices[0])
    result = CaseResult(case, primary="latency_us")
    if case.params["mode"] == "compiled":
        compiled, compile_s = timed(lambda: jax.jit(lambda v: v + 1.0).lower(x).compile())
        call = compiled
        result.values["compile_ms"] = compile_s * 1e3
    else:
        def call(v: Any) -> Any:
            return jnp.add(v, 1.0)
    seconds = time_calls(lambda _: call(x).block_until_ready(), ctx.timing)
    result.stats["latency_us"] = summarize([s * 1e6 for s in seconds])
    result.values["timing"] = "per_call"  # the headline; back_to_back_us is the secondary figure
    record_times(result, time_back_to_back(call, x, jax.block_until_ready, ctx.timing), "back_to_back_us", 1e6,
                 headline=False)
    return result
