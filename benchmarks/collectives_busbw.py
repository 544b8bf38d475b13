#!/usr/bin/env python3
"""Does `tpu-collectives-test` report the bandwidth a hand-written psum loop measures?

Side by side in one run, on the CPU platform with 8 devices, at 1, 16 and 64 MiB:
  tpu-collectives-test all-reduce -b S -e S --json FILE   its reported busbw (the command itself, run
                                                          through its click entry point)
  a plain loop over the same psum (shard_map over 8 devices), each call to block_until_ready, its mean
  time turned into busbw with the same formula, 2(n-1)/n.

Each pair runs in one worker process, one side after the other in alternating order. Why one process:
on this platform the same loop measured in separate processes varies far more than the 10 % being
tested (at 16 MiB, 8 fresh processes running the identical loop gave medians from 13 to 22 ms: where
the runtime's threads and buffers land is decided per process), while within one process the two sides
see the same runtime. Each size runs in --workers fresh processes of --pairs pairs each; the median of all
pairs' ratios is compared. Also printed: the same ratio from p50 iteration times, and the spread of the
per-process ratios. Target: within 10 % at every size.

    python benchmarks/collectives_busbw.py [--workers 5] [--pairs 2] [--iters N] [--warmup 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES_MIB = (1, 16, 64)
# Iterations per size (both sides alike): about a second of timed work each, so that one
# scheduling hiccup on a busy machine moves the mean little.
ITERS = {1: 1500, 16: 60, 64: 15}
DEVICES = 8
TOLERANCE = 0.10


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    # What `--host-devices 8` makes of the environment, set before the worker imports jax, so that the
    # tool's runtime policy and the plain loop agree on it.
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    env["JAX_NUM_CPU_DEVICES"] = str(DEVICES)
    return env


def _tool_busbw(size: int, iters: int, warmup: int, folder: Path) -> tuple[float, float]:
    """The busbw the command reports (from its mean time) and the one from its p50 time."""
    from tpu_tools.cli.collectives import collectives_command

    path = folder / f"run-{time.monotonic_ns()}.json"
    args = ["all-reduce", "-b", str(size), "-e", str(size), "-n", str(iters), "-w", str(warmup),
            "--host-devices", str(DEVICES), "--stats", "p50", "--json", str(path)]
    code = collectives_command.main(args, prog_name="tpu-collectives-test", standalone_mode=False)
    if code:
        raise SystemExit(f"tpu-collectives-test exited {code}")
    (row,) = json.loads(path.read_text())["tests"][0]["results"]
    return row["busbw_gbps"], row["busbw_gbps"] * row["time_us"] / row["stats_us"]["p50"]


class PlainLoop:
    """The hand-written timing: what a user would type to measure one psum."""

    def __init__(self) -> None:
        import jax
        import numpy as np
        from jax import lax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.jax, self.np = jax, np
        self.mesh = Mesh(np.array(jax.devices()), ("x",))
        self.sharding = NamedSharding(self.mesh, P("x", None))
        self.psum = jax.jit(jax.shard_map(lambda a: lax.psum(a, "x"), mesh=self.mesh, in_specs=P("x", None),
                                          out_specs=P("x", None)))
        self.ranks = len(jax.devices())

    def busbw(self, size: int, iters: int, warmup: int) -> tuple[float, float]:
        x = self.jax.device_put(self.np.ones((self.ranks, size // 4), self.np.float32), self.sharding)
        self.psum(x).block_until_ready()
        for _ in range(warmup):
            self.psum(x).block_until_ready()
        times = []
        for _ in range(iters):
            started = time.perf_counter()
            self.psum(x).block_until_ready()
            times.append(time.perf_counter() - started)
        factor = 2 * (self.ranks - 1) / self.ranks
        return size / statistics.fmean(times) / 1e9 * factor, size / statistics.median(times) / 1e9 * factor


def _worker(size: int, pairs: int, iters: int, warmup: int, tool_first: bool) -> None:
    """Print [[ours_mean, ours_p50, loop_mean, loop_p50], ...] for `pairs` pairs in this process."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        _tool_busbw(size, iters, warmup, Path(folder))  # the tool's policy sets the runtime up first
        loop = PlainLoop()
        for index in range(pairs):
            order = ("ours", "loop") if (index % 2 == 0) == tool_first else ("loop", "ours")
            measured = {}
            for side in order:
                measured[side] = (_tool_busbw(size, iters, warmup, Path(folder)) if side == "ours"
                                  else loop.busbw(size, iters, warmup))
            results.append([*measured["ours"], *measured["loop"]])
    sys.stdout.write(json.dumps(results) + "\n")


def _run_worker(mib: int, pairs: int, iters: int, warmup: int, tool_first: bool) -> list[list[float]]:
    command = [sys.executable, __file__, "--worker", str(mib << 20), "--pairs", str(pairs), "--iters", str(iters),
               "--warmup", str(warmup)] + (["--tool-first"] if tool_first else [])
    result = subprocess.run(command, capture_output=True, text=True, env=_env())
    if result.returncode:
        raise SystemExit(f"worker for {mib} MiB failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=5, help="fresh processes per size")
    parser.add_argument("--pairs", type=int, default=2, help="pairs measured in each process")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations (default: per size)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tool-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.pairs, args.iters, args.warmup, args.tool_first)
        return 0
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    pairs: dict[int, list[list[float]]] = {mib: [] for mib in SIZES_MIB}
    per_process: dict[int, list[float]] = {mib: [] for mib in SIZES_MIB}
    for worker in range(args.workers):
        for mib in SIZES_MIB:
            measured = _run_worker(mib, args.pairs, args.iters or ITERS[mib], args.warmup, worker % 2 == 0)
            pairs[mib].extend(measured)
            per_process[mib].append(statistics.median(p[0] / p[2] for p in measured))
    failed = False
    for mib in SIZES_MIB:
        rows = pairs[mib]
        ratio = statistics.median(p[0] / p[2] for p in rows)
        by_p50 = statistics.median(p[1] / p[3] for p in rows)
        ok = abs(ratio - 1) <= TOLERANCE
        failed |= not ok
        print(f"all-reduce {mib:>2} MiB busbw: tpu-collectives-test {statistics.median(p[0] for p in rows):.3f} GB/s, "
              f"plain psum loop {statistics.median(p[2] for p in rows):.3f} GB/s; median ratio of {len(rows)} "
              f"pairs {ratio:.3f} (target within {TOLERANCE:.0%}) {'ok' if ok else 'OFF TARGET'}  "
              f"[from p50 times: {by_p50:.3f}; per process: {min(per_process[mib]):.3f}-{max(per_process[mib]):.3f}]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
