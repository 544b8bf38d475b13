#!/usr/bin/env python3
"""Does this host's CPU speed itself move, with no XLA in the process? A reference for the CPU platform's noise.

Times a single-threaded numpy f32 GEMM (BLAS limited to one thread) pinned to one
CPU, in windows of `--window` seconds for `--seconds`: first alone on CPU 0, then
one such process on every usable CPU at once. Each window prints its GFLOP/s; the
summary gives min, median and max and the max/min ratio per process. On a
dedicated host the windows agree within a few per cent; on a shared VM (other
guests on the same physical cores, frequency changes) they move in steps no
counter in the guest shows: no steal, no other process, the CPU fully used. What
moves here moves `tpu-bench` on the CPU platform too, whatever XLA's threads do.

    python3 benchmarks/host_speed.py [--seconds 8] [--window 0.2] [--size 512]
"""

from __future__ import annotations

import argparse
import json
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--window", type=float, default=0.2)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# single-threaded numpy f32 GEMM {args.size}, pinned, {args.window * 1e3:.0f} ms windows for "
          f"{args.seconds:g} s; usable CPUs {cpus}")
    _report(f"alone on cpu{cpus[0]}", _start(cpus[0], args))
    together = [(cpu, _start(cpu, args)) for cpu in cpus]
    for cpu, process in together:
        _report(f"one per CPU, cpu{cpu}", process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
