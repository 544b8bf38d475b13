#!/usr/bin/env python3
"""Does this host's CPU speed itself move, and does it move the CPU platform's GEMM? A reference for its noise.

Part 1 times a single-threaded numpy f32 GEMM (BLAS limited to one thread) pinned
to one CPU, in windows of `--window` seconds for `--seconds`: first alone on CPU 0,
then one such process on every usable CPU at once. Each window prints its GFLOP/s;
the summary gives min, median and max and the max/min ratio per process. On a
dedicated host the windows agree within a few per cent; on a shared VM (other
guests on the same physical cores, frequency changes) they move in steps no
counter in the guest shows.

Part 2 (`--xla`) alternates, in one process, a window of XLA's 1024 f32 GEMM on the
CPU platform (the case `tpu-bench matmul --size 1024 --dtype f32` runs) with a short
single-threaded numpy reference before and after it, and prints the correlation of
the two rates over the windows: near 1 where the host's speed drives the GEMM's
variation, near 0 where something inside the process (how the runtime's threads
share the CPUs) does.

    python3 benchmarks/host_speed.py [--seconds 8] [--window 0.2] [--size 512] [--xla]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time, statistics
import numpy as np
size, seconds, window = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
a = np.random.rand(size, size).astype(np.float32)
b = np.random.rand(size, size).astype(np.float32)
for _ in range(3):
    a @ b
rates, started = [], time.perf_counter()
while time.perf_counter() - started < seconds:
    calls, opened = [], time.perf_counter()
    while time.perf_counter() - opened < window:
        t = time.perf_counter()
        a @ b
        calls.append(time.perf_counter() - t)
    rates.append(2 * size ** 3 / statistics.median(calls) / 1e9)
print(json.dumps(rates))
"""

_XLA_CHILD = r"""
import json, math, statistics, sys, time
import numpy as np
import jax
seconds, window = float(sys.argv[1]), float(sys.argv[2])
a = jax.random.normal(jax.random.key(1), (1024, 1024))
b = jax.random.normal(jax.random.key(2), (1024, 1024))
gemm = jax.jit(lambda x, y: x @ y).lower(a, b).compile()
for _ in range(3):
    gemm(a, b).block_until_ready()
small = np.random.rand(192, 192).astype(np.float32)
def reference():
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        x = small
        for _ in range(4):
            x = small @ x
        best = min(best, time.perf_counter() - started)
    return 4 * 2 * 192 ** 3 / best / 1e9
pairs, began = [], time.perf_counter()
while time.perf_counter() - began < seconds:
    before, calls, opened = reference(), [], time.perf_counter()
    while time.perf_counter() - opened < window:
        t = time.perf_counter()
        gemm(a, b).block_until_ready()
        calls.append(time.perf_counter() - t)
    pairs.append((2 * 1024 ** 3 / statistics.median(calls) / 1e9, (before + reference()) / 2))
print(json.dumps(pairs))
"""

ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def _start(cpu: int, args: argparse.Namespace) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", _CHILD, str(args.size),
                             str(args.seconds), str(args.window)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, **ONE_THREAD))


def _report(label: str, process: subprocess.Popen) -> None:
    out, _ = process.communicate(timeout=600)
    rates = json.loads(out.strip().splitlines()[-1])
    print(f"{label}: min {min(rates):.1f}, median {statistics.median(rates):.1f}, max {max(rates):.1f} GFLOP/s; "
          f"max/min {max(rates) / min(rates):.2f}")
    print("    windows: " + " ".join(f"{rate:.0f}" for rate in rates))


def _correlation(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = math.sqrt(sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys))
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


def _xla_part(args: argparse.Namespace) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **ONE_THREAD)
    out = subprocess.run([sys.executable, "-c", _XLA_CHILD, str(args.seconds), str(args.window)], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    pairs = json.loads(out.strip().splitlines()[-1])
    gemm, reference = [p[0] for p in pairs], [p[1] for p in pairs]
    print(f"XLA f32 GEMM 1024 in {args.window * 1e3:.0f} ms windows: min {min(gemm):.1f}, median "
          f"{statistics.median(gemm):.1f}, max {max(gemm):.1f} GFLOP/s; max/min {max(gemm) / min(gemm):.2f}")
    print(f"single-threaded reference around each window: min {min(reference):.1f}, median "
          f"{statistics.median(reference):.1f}, max {max(reference):.1f} GFLOP/s; "
          f"max/min {max(reference) / min(reference):.2f}")
    print(f"correlation of the two over {len(pairs)} windows: {_correlation(gemm, reference):.2f}")
    slow = sorted(pairs)[: max(1, len(pairs) // 10)]
    print("the slowest tenth of the GEMM's windows (GEMM/reference): "
          + " ".join(f"{g:.0f}/{r:.0f}" for g, r in slow))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=0.2)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--xla", action="store_true", help="part 2 instead: XLA's GEMM against the reference")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    if args.xla:
        _xla_part(args)
        return 0
    print(f"# single-threaded numpy f32 GEMM {args.size}, pinned, {args.window * 1e3:.0f} ms windows for "
          f"{args.seconds:g} s; usable CPUs {cpus}")
    _report(f"alone on cpu{cpus[0]}", _start(cpus[0], args))
    together = [(cpu, _start(cpu, args)) for cpu in cpus]
    for cpu, process in together:
        _report(f"one per CPU, cpu{cpu}", process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
