"""Runs inside a fresh child process (see `tpu_tools.pjrt.isolate`): compile the reference train step.

The child points jax's persistent compilation cache at the given directory,
builds the model, then times `lower().compile()` of the data-parallel train
step while counting the cache's hit and miss events, so the parent can tell a
cold compile from one served by the cache.
"""

from __future__ import annotations

import os
import time
from typing import Any

TARGET = "tpu_tools.bench.compile_child:compile_train_step"


def _entries(cache_dir: str) -> int:
    try:
        return sum(1 for name in os.listdir(cache_dir) if not name.startswith("."))
    except OSError:
        return 0


def compile_train_step(config: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    entries_at_start = _entries(cache_dir)
    import jax

    # Cache every entry, however quick its compile or small its executable.
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    from jax import monitoring

    from tpu_tools.workloads.transformer import (
        TransformerConfig,
        data_parallel_train_step,
        init_train_state,
        random_tokens,
    )

    model = TransformerConfig(**config)
    devices = jax.local_devices()
    step, state_sharding, batch_sharding = data_parallel_train_step(model, devices)
    state = jax.device_put(init_train_state(model, jax.random.key(0)), state_sharding)
    tokens = jax.device_put(random_tokens(model, model.batch_per_device * len(devices), jax.random.key(1)),
                            batch_sharding)
    jax.block_until_ready((state, tokens))

    events: dict[str, int] = {}
    durations: dict[str, float] = {}

    def on_event(event: str, **_: Any) -> None:
        events[event] = events.get(event, 0) + 1

    def on_duration(event: str, duration_secs: float, **_: Any) -> None:
        durations[event] = durations.get(event, 0.0) + duration_secs

    entries_before_step = _entries(cache_dir)  # set-up above compiled (and cached) small programs
    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    start = time.perf_counter()
    step.lower(state, tokens).compile()
    compile_s = time.perf_counter() - start
    return {
        "compile_s": compile_s,
        "backend_compile_s": durations.get("/jax/core/compile/backend_compile_duration"),
        "cache_hits": events.get("/jax/compilation_cache/cache_hits", 0),
        "cache_misses": events.get("/jax/compilation_cache/cache_misses", 0),
        "cache_entries_at_start": entries_at_start,
        "cache_entries_written": _entries(cache_dir) - entries_before_step,
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }
