#!/usr/bin/env python3
"""What joining each live array to the line that made it costs the agent's `arrays` read.

In one process on the CPU platform, with N small live arrays, interleaved, medians of several rounds
(this machine is shared and noisy, so only the ratio means anything):
  the agent's walk over live arrays with the source line  vs  without it   target <= 2.0x
  (and, for the record, with the traceback's formatted frames instead of its raw frames)

    python benchmarks/arrays_read.py [--arrays 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp

    from tpu_tools.agent.arrays import array_source, largest_arrays

    kept = [jnp.full((4,), i) for i in range(args.arrays)]

    live = jax.local_devices()[0].client.live_arrays()

    def walk(source: Callable[[Any], str]) -> None:  # the agent's walk: shape, dtype, sharding, size
        groups: dict[tuple[str, str, str, str], int] = {}
        seen: dict[Any, str] = {}
        for array in live:
            devices = array.sharding.addressable_devices
            key = (str(tuple(array.shape)), str(array.dtype), type(array.sharding).__name__, source(array, seen))
            groups[key] = groups.get(key, 0) + int(math.prod(array.shape) * array.dtype.itemsize) * len(devices)

    def formatted(array: Any, seen: dict[Any, str]) -> str:  # the traceback's formatted frames instead
        return next(str(frame) for frame in array.traceback.frames if "site-packages" not in frame.file_name)

    ways = {"none": lambda array, seen: "", "raw": array_source, "formatted": formatted}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            walk(way)
            times[name].append(time.perf_counter() - started)
    none, raw, slow = (statistics.median(times[name]) for name in ways)
    ratio = raw / none
    print(f"$ python benchmarks/arrays_read.py --arrays {args.arrays} --rounds {args.rounds}")
    print(f"walk of {len(kept)} live arrays with the source line / without: {raw * 1e3:.0f} ms / {none * 1e3:.0f} ms"
          f" = {ratio:.2f}x (target <= 2.0x) {'ok' if ratio <= 2.0 else 'MISSED'}")
    print(f"with the traceback's formatted frames instead of its raw frames / without: {slow * 1e3:.0f} ms / "
          f"{none * 1e3:.0f} ms = {slow / none:.2f}x")
    print(f"largest_arrays of {len(kept)} arrays: {largest_arrays(jax, budget_s=60.0)['elapsed_s'] * 1e3:.0f} ms "
          "(with the device memory profile)")
    return 0 if ratio <= 2.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
