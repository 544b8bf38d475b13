"""Per-device memory of this process: what the platform reports, and the live arrays on each device.

Read on request only, and never initialises a backend: the workload decides
when its runtime starts (`jax.distributed.initialize()` must come first, and
on a TPU the first client takes the chips). Until then there are no devices.
"""

from __future__ import annotations

import functools
import math
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from tpu_tools.pjrt.devices import device_record, memory_figures


@functools.cache
def _initialized_probe() -> Callable[[], bool] | None:
    """jax's own test of whether its backends have started, looked up once (an import statement on every
    request cost the job more than the test itself)."""
    try:
        from jax._src import xla_bridge

        return xla_bridge.backends_are_initialized
    except Exception:  # noqa: BLE001 a jax without this helper: do not risk initialising
        return None


def backends_ready(jax_module: Any) -> bool:
    """Whether jax has already started its PJRT backends (asking for devices before would start them)."""
    probe = _initialized_probe()
    try:
        return probe is not None and bool(probe())
    except Exception:  # noqa: BLE001 a jax whose probe fails: do not risk initialising
        return False


def shard_footprint(array: Any) -> tuple[int, Any]:
    """(bytes of one shard, the addressable devices that hold a shard) of a live jax array; may raise for an
    array deleted meanwhile or an exotic sharding."""
    sharding = array.sharding
    devices = sharding.addressable_devices
    shape = array.shape if len(devices) == 1 else sharding.shard_shape(array.shape)
    return int(math.prod(shape) * array.dtype.itemsize), devices


def live_array_usage(backend: Any) -> dict[int, list[int]]:
    """Device id -> [bytes, count] of the live arrays with a shard on it.

    The arrays are counted by kind (sharding, shape, dtype) in one pass, and each kind is sized once: a job
    holds thousands of arrays but few kinds (5,000 arrays: 2.1 ms here, against 4.1 ms sizing each one).
    """
    kinds: dict[tuple[int, Any, Any], list[Any]] = {}  # kind -> [count, one array of that kind]
    for array in backend.live_arrays():  # the list holds every array, so their shardings' ids stay unique
        try:
            if array.is_deleted():
                continue
            kind = (id(array.sharding), array.shape, array.dtype)
        except Exception:  # noqa: BLE001 an array deleted while we looked
            continue
        seen = kinds.get(kind)
        if seen is None:
            kinds[kind] = [1, array]
        else:
            seen[0] += 1
    usage: dict[int, list[int]] = {}
    for count, example in kinds.values():
        try:
            per_shard, devices = shard_footprint(example)
        except Exception:  # noqa: BLE001 an exotic sharding
            continue
        for device in devices:
            entry = usage.setdefault(device.id, [0, 0])
            entry[0] += per_shard * count
            entry[1] += count
    return usage


class LiveArrayTally:
    """`live_array_usage`, walked again only once the time since the last walk is at least `min_interval_s` and at
    least that walk's CPU time divided by `cpu_share` (400 times it by default). A job with a few hundred arrays
    is walked once a second even when a monitor polls 10 times a second; one with 20,000 (about 40 ms of CPU a
    walk here, with cold caches) every 17 s or so, rather than at 40 % of a core. The age of the tally goes with
    it."""

    def __init__(self, cpu_share: float = 0.0025, min_interval_s: float = 1.0):
        self._cpu_share = cpu_share
        self._min_interval_s = min_interval_s
        self._usage: dict[int, list[int]] | None = None
        self._walked_at = 0.0
        self._cost_s = 0.0

    def read(self, backend: Any) -> tuple[dict[int, list[int]], float]:
        """(device id -> [bytes, count], the age of that tally in seconds)."""
        now = time.monotonic()
        wait_s = max(self._min_interval_s, self._cost_s / self._cpu_share)
        if self._usage is None or now - self._walked_at >= wait_s:
            started = time.thread_time()
            self._usage = live_array_usage(backend)
            self._cost_s = time.thread_time() - started
            self._walked_at = now
        return self._usage, now - self._walked_at


class DeviceMemory:
    """Per-device memory of this process for each snapshot: what the platform reports now, and the live arrays.

    What a device is (its id, kind, coordinates) and what the runtime is do not change while the same devices
    exist: they are read once per set of devices, so that a request reads only the memory figures (a snapshot
    runs on the job's cores, 10 times a second under a polling monitor). `tally` keeps the live arrays' figures
    between requests.

    Only the default backend (the job's accelerator): the host CPU backend that JAX also starts beside a TPU or
    GPU is not a device a user watches.
    """

    def __init__(self, tally: LiveArrayTally | None = None):
        self.tally = tally if tally is not None else LiveArrayTally()
        self._devices: list[Any] = []  # the devices the records below describe (kept: their ids stay theirs)
        self._records: list[dict[str, Any]] = []
        self._runtime: dict[str, Any] = {}
        # False for a device set whose platform keeps no memory statistics (the CPU platform): not asked again
        # while the same devices exist, their records keep the fields' None.
        self._asks_memory = True
        self._shown: list[dict[str, Any]] = []  # the records of the last read
        self._shown_usage: dict[int, list[int]] | None = None  # the live-array tally they show
        self._client: Any = None  # the devices' backend

    def read(self, jax_module: Any, refresh: bool = True) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """(runtime summary or None, one dict per local device of the default backend). refresh=False (the
        publisher between changes): the devices are those of the last read rather than asked of jax again. The
        records are shared with earlier answers while nothing in them changed (a platform without memory
        figures, the same live-array tally): read them, do not change them."""
        devices = self._devices
        if refresh or not devices:
            if "jax" not in sys.modules or not backends_ready(jax_module):
                return None, []
            devices = jax_module.local_devices()
            if len(devices) != len(self._devices) or any(a is not b for a, b in zip(devices, self._devices)):
                self._describe(jax_module, devices)
        usage, age_s = self.tally.read(self._client)
        if self._asks_memory or usage is not self._shown_usage:
            records = []
            for device, described in zip(devices, self._records):
                record = {**described, **memory_figures(device)} if self._asks_memory else dict(described)
                record["live_array_bytes"], record["live_array_count"] = usage.get(device.id, (0, 0))
                records.append(record)
            self._shown, self._shown_usage = records, usage
        return {**self._runtime, "live_arrays_age_s": round(age_s, 3)}, self._shown

    def _describe(self, jax_module: Any, devices: list[Any]) -> None:
        host = socket.gethostname()
        self._records = [dict(vars(device_record(device, host, addressable=False))) for device in devices]
        self._asks_memory = any(v is not None for device in devices for v in memory_figures(device).values())
        backend = self._client = devices[0].client
        self._runtime = {
            "platform": backend.platform,
            "platform_version": str(backend.platform_version),
            "process_index": int(jax_module.process_index()),
            "process_count": int(jax_module.process_count()),
        }
        self._devices = list(devices)
        self._shown_usage = None  # the records of other devices: made again
