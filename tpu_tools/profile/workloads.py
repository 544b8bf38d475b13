"""Built-in targets of `tpu-profile hlo`: the model steps `tpu-bench` times.

`train` is one optimizer step of the benchmark transformer (embedding,
attention, MLP, loss, gradients, AdamW update); `infer` is its forward pass.
Their arguments are abstract (shapes and dtypes only), so nothing is
allocated or run: the step is lowered and compiled for analysis.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_tools.errors import UsageError

WORKLOADS = {
    "train": "one training step of the tpu-bench transformer (forward, loss, gradients, AdamW update)",
    "infer": "the forward pass of the tpu-bench transformer",
}


@dataclass(frozen=True)
class Workload:
    target: str  # e.g. "train[tiny, batch 8]"
    function: Callable[..., Any]
    arguments: list[Any]  # pytrees of jax.ShapeDtypeStruct
    model_flops: int  # analytic, as tpu-bench counts them


def workload_config(name: str, preset: str) -> Any:
    """The transformer configuration of a built-in workload; cheap (no jax), so bad names are told at once."""
    from tpu_tools.workloads import transformer

    if name not in WORKLOADS:
        raise UsageError(f"unknown workload {name!r}: choose {', '.join(WORKLOADS)}, or name MODULE:FUNCTION")
    try:
        return transformer.config_for(preset)
    except KeyError:
        raise UsageError(f"unknown preset {preset!r}: choose {', '.join(transformer.PRESETS)}") from None


def builtin_workload(name: str, preset: str, batch: int | None) -> Workload:
    config = workload_config(name, preset)
    import jax

    from tpu_tools.workloads import transformer

    batch = batch or config.batch_per_device
    key = jax.random.PRNGKey(0)
    tokens = jax.ShapeDtypeStruct((batch, config.seq_len + 1), jax.numpy.int32)
    if name == "train":
        state = jax.eval_shape(functools.partial(transformer.init_train_state, config), key)
        function = functools.partial(transformer.train_step, config=config)
        arguments, flops = [state, tokens], transformer.train_step_flops(config, batch)
    else:
        params = jax.eval_shape(functools.partial(transformer.init_params, config), key)
        function = functools.partial(transformer.forward, config=config)
        tokens = jax.ShapeDtypeStruct((batch, config.seq_len), jax.numpy.int32)
        arguments, flops = [params, tokens], transformer.forward_flops(config, batch)
    return Workload(f"{name}[{preset}, batch {batch}]", function, arguments, flops)
