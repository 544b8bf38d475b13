#!/usr/bin/env python3
"""Does `tpu-collectives-test` report the bandwidth a hand-written psum loop measures?

Side by side in one run, interleaved (this machine is shared and noisy, so only
ratios of medians mean anything), on the CPU platform with 8 devices:
  tpu-collectives-test all-reduce -b S -e S --json -     its reported busbw, S = 1, 16 and 64 MiB
  a plain loop over the same psum (shard_map over 8 devices), each call to block_until_ready,
  its mean time turned into busbw with the same formula, 2(n-1)/n
each in its own process, one size of each side by side, --repeats times; the median of the pairs' ratios
is compared (also the same from each run's p50 iteration time, less sensitive to a busy machine).
Target: the two within 10 % at every size.

    python benchmarks/collectives_busbw.py [--repeats 7] [--iters N] [--warmup 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SIZES_MIB = (1, 16, 64)
# Iterations per size (both sides alike): about a second of timed work each, so that one
# scheduling hiccup on a busy machine moves the mean little.
ITERS = {1: 1500, 16: 60, 64: 15}
DEVICES = 8
TOLERANCE = 0.10


def _script(name: str) -> list[str]:
    candidate = Path(sys.executable).parent / name
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "tpu_tools", name.removeprefix("tpu-")]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    # The same runtime set-up on both sides: what `--host-devices 8` makes of the environment.
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    env["JAX_NUM_CPU_DEVICES"] = str(DEVICES)
    return env


def tool_busbw(size: int, iters: int, warmup: int) -> tuple[float, float]:
    """The busbw the tool reports (from the mean time) and the one from its p50 time."""
    command = [*_script("tpu-collectives-test"), "all-reduce", "-b", str(size), "-e", str(size),
               "-n", str(iters), "-w", str(warmup), "--host-devices", str(DEVICES), "--stats", "p50",
               "--json", "-"]
    result = subprocess.run(command, capture_output=True, text=True, env=_env(), check=True)
    (row,) = json.loads(result.stdout)["tests"][0]["results"]
    return row["busbw_gbps"], row["busbw_gbps"] * row["time_us"] / row["stats_us"]["p50"]


def reference_busbw(size: int, iters: int, warmup: int) -> tuple[float, float]:
    command = [sys.executable, __file__, "--reference", str(size), "--iters", str(iters), "--warmup", str(warmup)]
    result = subprocess.run(command, capture_output=True, text=True, env=_env(), check=True)
    mean, median = result.stdout.split()
    return float(mean), float(median)


def _reference(size: int, iters: int, warmup: int) -> None:
    """The hand-written timing: what a user would type to measure one psum."""
    import time

    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("x",))
    psum = jax.jit(jax.shard_map(lambda a: lax.psum(a, "x"), mesh=mesh, in_specs=P("x", None),
                                 out_specs=P("x", None)))
    ranks = len(devices)
    x = jax.device_put(np.ones((ranks, size // 4), np.float32), NamedSharding(mesh, P("x", None)))
    psum(x).block_until_ready()
    for _ in range(warmup):
        psum(x).block_until_ready()
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        psum(x).block_until_ready()
        times.append(time.perf_counter() - started)
    factor = 2 * (ranks - 1) / ranks
    print(size / statistics.fmean(times) / 1e9 * factor, size / statistics.median(times) / 1e9 * factor)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=None, help="timed iterations (default: per size)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reference", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference is not None:
        _reference(args.reference, args.iters, args.warmup)
        return 0
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    ours: dict[int, list[tuple[float, float]]] = {}
    theirs: dict[int, list[tuple[float, float]]] = {}
    for repeat in range(args.repeats):
        for mib in SIZES_MIB:
            # One size of ours next to the same size of the loop, in alternating order: a pair shares
            # the machine's load of the moment, so the pair's ratio is what gets compared.
            size, iters = mib << 20, args.iters or ITERS[mib]
            pair = [("ours", tool_busbw), ("loop", reference_busbw)]
            for name, measure in pair if repeat % 2 == 0 else reversed(pair):
                (ours if name == "ours" else theirs).setdefault(size, []).append(measure(size, iters, args.warmup))
    failed = False
    for mib in SIZES_MIB:
        size = mib << 20
        reported = statistics.median(m for m, _ in ours[size])
        measured = statistics.median(m for m, _ in theirs[size])
        ratio = statistics.median(o[0] / t[0] for o, t in zip(ours[size], theirs[size]))
        by_p50 = statistics.median(o[1] / t[1] for o, t in zip(ours[size], theirs[size]))
        ok = abs(ratio - 1) <= TOLERANCE
        failed |= not ok
        spread = (f"ours {min(m for m, _ in ours[size]):.3f}-{max(m for m, _ in ours[size]):.3f}, loop "
                  f"{min(m for m, _ in theirs[size]):.3f}-{max(m for m, _ in theirs[size]):.3f}")
        print(f"all-reduce {mib:>2} MiB busbw: tpu-collectives-test {reported:.3f} GB/s, plain psum loop "
              f"{measured:.3f} GB/s; median ratio of {args.repeats} pairs {ratio:.3f} (target within "
              f"{TOLERANCE:.0%}) {'ok' if ok else 'OFF TARGET'}  [from p50 times: {by_p50:.3f}; range: {spread}]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
