#!/usr/bin/env python3
"""Cold and warm compiles of the reference transformer through a JAX persistent compilation cache.

For each workload, `tpu-profile cache warm` compiles it into a fresh cache in one process (cold: every lookup
misses and XLA compiles) and then starts a fresh process that must hit (warm: the compile time JAX reports is
the time to load the entry). Both are JAX's `backend_compile_duration`, summed over the process's compiles.
The runs of one workload alternate with the others', each in its own empty directory; the figure is the
median over the runs of warm / cold. Target, for one training step of the tiny transformer (the reference
step): warm <= 10 % of cold.

    python benchmarks/cache_warm.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from harness import script

WORKLOADS = [("train", "tiny"), ("train", "small"), ("infer", "tiny")]
TARGET = 0.10


def _warm(workload: str, preset: str, folder: Path, env: dict[str, str]) -> dict:
    command = [*script("tpu-profile"), "cache", "warm", str(folder), workload, "--preset", preset, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    results: dict[tuple[str, str], list[dict]] = {w: [] for w in WORKLOADS}
    scratch = Path(tempfile.mkdtemp(prefix="cache-warm-bench-"))
    try:
        for run in range(options.runs):
            for workload, preset in WORKLOADS:
                folder = scratch / f"{workload}-{preset}-{run}"
                results[(workload, preset)].append(_warm(workload, preset, folder, env))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"$ python benchmarks/cache_warm.py --runs {options.runs}   "
          f"(each run: tpu-profile cache warm DIR WORKLOAD --preset PRESET --json, JAX_PLATFORMS=cpu)")
    print("| workload | cold compile (median) | warm compile (median) | warm / cold (median of runs) | "
          "entries | proven |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for (workload, preset), runs in results.items():
        cold = statistics.median(r["warming"]["compile_time_s"] for r in runs)
        warm = statistics.median(r["fresh_start"]["compile_time_s"] for r in runs)
        ratio = statistics.median(r["warm_to_cold_ratio"] for r in runs)
        entries = runs[0]["warming"]["entries_written"]
        proven = all(r["proven"] for r in runs)
        verdict = ""
        if (workload, preset) == WORKLOADS[0]:
            verdict = f" (target <= {TARGET:.0%}: {'ok' if ratio <= TARGET else 'OVER TARGET'})"
        print(f"| {workload} [{preset}] | {cold:.3f} s | {warm:.3f} s | {ratio:.1%}{verdict} | {entries} | "
              f"{'yes' if proven else 'NO'} |")


if __name__ == "__main__":
    main()
