#!/usr/bin/env python3
"""Why an f32 GEMM on the CPU platform runs at one of two speeds from one process to the next.

Starts `--processes` fresh processes one after another; each times a jitted
N x N f32 GEMM (calls one at a time, `--seconds` long) and reads, from
/proc/self/task, how much CPU each thread used while it ran and on which CPU it
last ran. The table shows, per process, the rate beside the busy threads
(XLA's Eigen intra-op pool is `tf_XLAEigen`; the runtime's executor threads
inherit the name `python`), so a slow mode can be matched to the threads that
did (or did not) work. Other processes' CPU share during each process is shown
too: on a shared host it explains much of the variation.

`--variant` runs the same under a candidate remedy:
  flags:single   XLA_FLAGS=--xla_cpu_multi_thread_eigen=false (meant to make one thread do the dot; with
                 jax 0.10.2 the Eigen pool still works under it)
  pin            the Eigen threads pinned one per usable CPU after start-up

    PYTHONPATH=. python3 benchmarks/cpu_modes.py [--processes 8] [--size 1024] [--seconds 1.5] [--variant none]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, os, sys, time, statistics
size, seconds, variant = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
import jax, jax.numpy as jnp
import psutil

def tasks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[36]))
    return out

a = jax.random.normal(jax.random.key(1), (size, size))
b = jax.random.normal(jax.random.key(2), (size, size))
gemm = jax.jit(lambda x, y: x @ y).lower(a, b).compile()
for _ in range(3):
    gemm(a, b).block_until_ready()
if variant == "pin":
    cpus = sorted(os.sched_getaffinity(0))
    eigen = [int(t) for t, (name, _, _) in tasks().items() if name == "tf_XLAEigen"]
    for i, tid in enumerate(eigen):
        os.sched_setaffinity(tid, {cpus[i % len(cpus)]})
before, host_before, own_before = tasks(), psutil.cpu_times(), psutil.Process().cpu_times()
start, samples = time.perf_counter(), []
while time.perf_counter() - start < seconds:
    t = time.perf_counter()
    gemm(a, b).block_until_ready()
    samples.append(time.perf_counter() - t)
wall = time.perf_counter() - start
after, host_after, own_after = tasks(), psutil.cpu_times(), psutil.Process().cpu_times()
busy = lambda t: t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
others = (busy(host_after) - busy(host_before)) - ((own_after.user + own_after.system)
                                                    - (own_before.user + own_before.system))
threads = sorted(((after[k][1] - before[k][1]) / wall, after[k][0], after[k][2]) for k in after if k in before)
print(json.dumps({"gflops": 2 * size ** 3 / statistics.median(samples) / 1e9,
                  "threads": [t for t in threads[::-1] if t[0] > 0.02],
                  "others_percent": 100 * max(0.0, others) / (wall * (os.cpu_count() or 1)),
                  "eigen_threads": sum(1 for _, name, _ in threads if name == "tf_XLAEigen")}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--variant", choices=("none", "flags:single", "pin"), default="none")
    args = parser.parse_args()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    if args.variant == "flags:single":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# {args.processes} fresh processes, f32 GEMM {args.size}, variant {args.variant}, "
          f"{os.cpu_count()} CPUs; threads as CPU share of one core while timed, @ the CPU they last ran on")
    rates = []
    for index in range(args.processes):
        child = subprocess.run([sys.executable, "-c", _CHILD, str(args.size), str(args.seconds), args.variant],
                               capture_output=True, text=True, env=env, timeout=300)
        if child.returncode != 0:
            print(f"process {index}: failed: {(child.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        report = json.loads(child.stdout.strip().splitlines()[-1])
        rates.append(report["gflops"])
        threads = ", ".join(f"{name}@cpu{cpu} {share:.2f}" for share, name, cpu in report["threads"])
        print(f"process {index}: {report['gflops']:7.1f} GFLOP/s  others {report['others_percent']:4.0f}%  "
              f"eigen pool {report['eigen_threads']}  busy: {threads}")
    if rates:
        print(f"min {min(rates):.1f}, median {statistics.median(rates):.1f}, max {max(rates):.1f} GFLOP/s; "
              f"max/min {max(rates) / min(rates):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
