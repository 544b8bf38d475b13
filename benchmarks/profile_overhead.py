#!/usr/bin/env python3
"""What `tpu-profile run` costs a program, on the CPU platform.

A small training-like loop (jitted steps, a little Python around them) times
itself; it runs plain and under tpu-profile, interleaved, in one run (this
machine is shared and noisy, so only ratios of medians mean anything):
  loop time, traced with Python frames / plain          target <= 2x
  loop time, traced without Python frames / plain       target <= 2x
  whole command (start, trace export, summary) / plain  reported, no target

    python benchmarks/profile_overhead.py [--runs 5] [--steps 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from harness import script

WORKLOAD = """
    import sys
    import time
    import jax
    import jax.numpy as jnp


    @jax.jit
    def step(w, x):
        loss = jnp.tanh(x @ w).sum()
        return w - 1e-6 * loss, loss


    w = jnp.ones((256, 256)) / 256
    x = jnp.ones((64, 256))
    w, loss = step(w, x)
    loss.block_until_ready()
    start = time.perf_counter()
    for i in range(int(sys.argv[1])):
        w, loss = step(w, x)
        if i % 50 == 0:
            float(loss)
    loss.block_until_ready()
    print(time.perf_counter() - start)
"""


def _run(command: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(the loop time the program reports, the whole command's wall time)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=True)
    return float(done.stdout.strip().splitlines()[-1]), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "cpu"
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    with tempfile.TemporaryDirectory() as folder:
        program = Path(folder) / "workload.py"
        program.write_text(textwrap.dedent(WORKLOAD))
        steps = str(args.steps)
        variants = {
            "plain": lambda n: [sys.executable, str(program), steps],
            "traced": lambda n: [*script("tpu-profile"), "run", "--quiet", "--out", f"t{n}", "--", str(program),
                                 steps],
            "traced, no Python frames": lambda n: [*script("tpu-profile"), "run", "--quiet", "--no-python-trace",
                                                   "--out", f"p{n}", "--", str(program), steps],
        }
        loops: dict[str, list[float]] = {name: [] for name in variants}
        walls: dict[str, list[float]] = {name: [] for name in variants}
        for n in range(args.runs + 1):
            for name, command in variants.items():
                loop, wall = _run(command(n), env, folder)
                if n:  # the first round warms the page cache
                    loops[name].append(loop)
                    walls[name].append(wall)
    plain_loop, plain_wall = statistics.median(loops["plain"]), statistics.median(walls["plain"])
    failed = False
    for name, target in (("traced", 2.0), ("traced, no Python frames", 2.0)):
        loop = statistics.median(loops[name])
        ratio = loop / plain_loop
        failed |= ratio > target
        print(f"loop of {steps} steps, {name} / plain: {loop * 1e3:.0f} ms / {plain_loop * 1e3:.0f} ms = "
              f"{ratio:.2f}x (target <= {target}x) {'ok' if ratio <= target else 'OVER TARGET'}")
    for name in ("traced", "traced, no Python frames"):
        wall = statistics.median(walls[name])
        print(f"whole command, {name} / plain: {wall:.2f} s / {plain_wall:.2f} s = {wall / plain_wall:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
