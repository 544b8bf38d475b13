#!/usr/bin/env python3
"""What `tpu-ls` costs over the least a user could run, on the CPU platform (or the host's own).

Measured side by side, interleaved, in one run (this machine is shared and
noisy, so only ratios of medians mean anything):
  tpu-ls --json            vs  python -c "import jax; jax.devices()"   target <= 1.3x
  tpu-ls --no-runtime      vs  python -c pass                           target <  6x

    python benchmarks/ls_overhead.py [--runs 21] [--host-platform]

--host-platform leaves the platform to JAX, as a plain `tpu-ls` does on a GPU machine or a TPU VM: there the
bare jax.devices() starts the accelerator's runtime, and tpu-ls reads the driver instead where it can.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from harness import script, time_run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--host-platform", action="store_true",
                        help="leave the platform to JAX (the host's accelerator) instead of the CPU platform")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_TOOLS_SYSROOT")}
    if not args.host_platform:
        env["JAX_PLATFORMS"] = "cpu"
    pairs = {
        "tpu-ls --json / import jax; jax.devices()": (
            [*script("tpu-ls"), "--json"], [sys.executable, "-c", "import jax; jax.devices()"], 1.3),
        "tpu-ls --no-runtime / python -c pass": (
            [*script("tpu-ls"), "--no-runtime"], [sys.executable, "-c", "pass"], 6.0),
    }
    failed = False
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    for label, (ours, reference, target) in pairs.items():
        time_run(ours, env), time_run(reference, env)  # warm the page cache
        ours_s, reference_s = [], []
        for _ in range(args.runs):
            ours_s.append(time_run(ours, env))
            reference_s.append(time_run(reference, env))
        ratio = statistics.median(ours_s) / statistics.median(reference_s)
        verdict = "ok" if ratio <= target else "OVER TARGET"
        failed |= ratio > target
        print(f"{label}: {statistics.median(ours_s) * 1e3:.0f} ms / {statistics.median(reference_s) * 1e3:.0f} ms"
              f" = {ratio:.2f}x (target {'<=' if target < 2 else '<'} {target}x) {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
