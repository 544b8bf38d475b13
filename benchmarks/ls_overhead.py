#!/usr/bin/env python3
"""What `tpu-ls` costs over the least a user could run, on the CPU platform.

Measured side by side, interleaved, in one run (this machine is shared and
noisy, so only ratios of medians mean anything):
  tpu-ls --json            vs  python -c "import jax; jax.devices()"   target <= 1.3x
  tpu-ls --no-runtime      vs  python -c pass                           target <  6x

    python benchmarks/ls_overhead.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _script(name: str) -> list[str]:
    candidate = Path(sys.executable).parent / name
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "tpu_tools", name.removeprefix("tpu-")]


def _time(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_TOOLS_SYSROOT")}
    env["JAX_PLATFORMS"] = "cpu"
    pairs = {
        "tpu-ls --json / import jax; jax.devices()": (
            [*_script("tpu-ls"), "--json"], [sys.executable, "-c", "import jax; jax.devices()"], 1.3),
        "tpu-ls --no-runtime / python -c pass": (
            [*_script("tpu-ls"), "--no-runtime"], [sys.executable, "-c", "pass"], 6.0),
    }
    failed = False
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    for label, (ours, reference, target) in pairs.items():
        _time(ours, env), _time(reference, env)  # warm the page cache
        ours_s, reference_s = [], []
        for _ in range(args.runs):
            ours_s.append(_time(ours, env))
            reference_s.append(_time(reference, env))
        ratio = statistics.median(ours_s) / statistics.median(reference_s)
        verdict = "ok" if ratio <= target else "OVER TARGET"
        failed |= ratio > target
        print(f"{label}: {statistics.median(ours_s) * 1e3:.0f} ms / {statistics.median(reference_s) * 1e3:.0f} ms"
              f" = {ratio:.2f}x (target {'<=' if target < 2 else '<'} {target}x) {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
