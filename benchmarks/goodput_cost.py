#!/usr/bin/env python3
"""What the goodput ledger costs per step: the job's loop with the agent's marks against the same loop without.

Each step of the marked loop does what an instrumented training loop does around its work: a
`phase("data")` block, a `step_context(samples=..., flops=...)` block, and a bare `step()` every
other step. The plain loop runs the same Python with `contextlib.nullcontext()` blocks instead.
Blocks of steps alternate ABBA inside one process (this machine is shared and noisy); the figure
is the median over blocks of (marked - plain) / steps, in microseconds. Target: <= 50 us per step.
Also printed: the ratio of the two medians.

    python benchmarks/goodput_cost.py [--blocks 40] [--steps 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import tpu_tools.agent as agent

TARGET_US = 50.0


def marked(steps: int) -> float:
    start = time.perf_counter()
    for index in range(steps):
        with agent.phase("data"):
            pass
        with agent.step_context(samples=32, flops=1e9):
            pass
        if index % 2:
            agent.step(samples=32)
    return time.perf_counter() - start


def plain(steps: int) -> float:
    start = time.perf_counter()
    for index in range(steps):
        with contextlib.nullcontext():
            pass
        with contextlib.nullcontext():
            pass
        if index % 2:
            len("x")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    marked(100), plain(100)  # warm both paths
    costs, marked_times, plain_times = [], [], []
    for block in range(args.blocks):
        order = (marked, plain) if block % 4 in (0, 3) else (plain, marked)
        seconds = {fn.__name__: fn(args.steps) for fn in order}
        marked_times.append(seconds["marked"])
        plain_times.append(seconds["plain"])
        costs.append((seconds["marked"] - seconds["plain"]) / args.steps * 1e6)
    cost = statistics.median(costs)
    ratio = statistics.median(marked_times) / statistics.median(plain_times)
    print(f"$ python benchmarks/goodput_cost.py --blocks {args.blocks} --steps {args.steps}")
    print(f"goodput marks per step (phase + step_context + step every other step) - plain loop: "
          f"{cost:.1f} us (p10 {statistics.quantiles(costs, n=10)[0]:.1f}, "
          f"p90 {statistics.quantiles(costs, n=10)[-1]:.1f}) (target <= {TARGET_US:.0f} us) "
          f"{'ok' if cost <= TARGET_US else 'MISSED'}")
    print(f"marked loop / plain loop: {statistics.median(marked_times) * 1e3:.1f} ms / "
          f"{statistics.median(plain_times) * 1e3:.1f} ms = {ratio:.1f}x for {args.steps} steps")
    return 0 if cost <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
