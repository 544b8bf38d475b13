"""Per-device memory of this process: what the platform reports, and the live arrays on each device.

Read on request only, and never initialises a backend: the workload decides
when its runtime starts (`jax.distributed.initialize()` must come first, and
on a TPU the first client takes the chips). Until then there are no devices.
"""

from __future__ import annotations

import math
import socket
import sys
from typing import Any


def backends_ready(jax_module: Any) -> bool:
    """Whether jax has already started its PJRT backends (asking for devices before would start them)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # a jax without this helper: do not risk initialising
        return False


def shard_footprint(array: Any) -> tuple[int, Any]:
    """(bytes of one shard, the addressable devices that hold a shard) of a live jax array; may raise for an
    array deleted meanwhile or an exotic sharding."""
    sharding = array.sharding
    devices = sharding.addressable_devices
    shape = array.shape if len(devices) == 1 else sharding.shard_shape(array.shape)
    return int(math.prod(shape) * array.dtype.itemsize), devices


def _live_array_usage(backend: Any) -> dict[int, list[int]]:
    """Device id -> [bytes, count] of the live arrays with a shard on it."""
    usage: dict[int, list[int]] = {}
    for array in backend.live_arrays():
        try:
            if array.is_deleted():
                continue
            per_shard, devices = shard_footprint(array)
            for device in devices:
                entry = usage.setdefault(device.id, [0, 0])
                entry[0] += per_shard
                entry[1] += 1
        except Exception:  # an array deleted while we looked, or an exotic sharding
            continue
    return usage


def device_memory(jax_module: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(runtime summary or None, one dict per local device of the default backend).

    Only the default backend (the job's accelerator): the host CPU backend that
    JAX also starts beside a TPU or GPU is not a device a user watches.
    """
    if "jax" not in sys.modules or not backends_ready(jax_module):
        return None, []
    from tpu_tools.pjrt.devices import device_record

    host = socket.gethostname()
    backend = jax_module.local_devices()[0].client
    usage = _live_array_usage(backend)
    devices: list[dict[str, Any]] = []
    for device in jax_module.local_devices():
        record = dict(vars(device_record(device, host)))  # a flat record: no need for asdict's deep copy
        bytes_, count = usage.get(device.id, (0, 0))
        record["live_array_bytes"] = bytes_
        record["live_array_count"] = count
        devices.append(record)
    runtime = {
        "platform": backend.platform,
        "platform_version": str(backend.platform_version),
        "process_index": int(jax_module.process_index()),
        "process_count": int(jax_module.process_count()),
    }
    return runtime, devices
