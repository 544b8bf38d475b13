#!/usr/bin/env python3
"""Wall time of `tpu-diag -r 1`, `-r 2` and `-r 4` with --host-devices 8 on the CPU platform.

Each level runs `--runs` times (interleaved, so a change in the host's load hits them alike); the script
prints the command, each wall time, the median against the budget (30 s for -r 1, 2 minutes for -r 2; -r 4
has none: its time grows with the memory it covers, and the run says it up front), and the share of the run
spent per test (from the JSON's per-check times). -r 4 runs with `--duration` of sustained load and
`--memory-fraction` of free memory (most of it, 0.8, is tpu-diag's default; the benchmark's default is
smaller, for a machine that others share).

    python3 benchmarks/diag_time.py [--runs 1] [--platform cpu] [--host-devices 8] [--levels 1,2,4]
                                    [--duration 30s] [--memory-fraction 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

BUDGET_S = {1: 30.0, 2: 120.0}


def command(level: int, platform: str, host_devices: int | None, duration: str, fraction: str) -> list[str]:
    script = Path(sys.executable).parent / "tpu-diag"
    program = [str(script)] if script.exists() else [sys.executable, "-m", "tpu_tools.cli.diag"]
    extra = ["--host-devices", str(host_devices)] if host_devices else []
    if level >= 3:
        extra += ["--duration", duration, "--memory-fraction", fraction]
    return [*program, "-r", str(level), "--platform", platform, *extra, "--json"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--host-devices", type=int, default=8)
    parser.add_argument("--levels", default="1,2,4")
    parser.add_argument("--duration", default="30s", help="-r 4's sustained load")
    parser.add_argument("--memory-fraction", default="0.05", help="-r 4's share of free memory")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    host_devices = args.host_devices if args.platform == "cpu" else None
    rundir = tempfile.mkdtemp(prefix="diag-time-")
    env = {**os.environ, "TPU_TOOLS_RUNTIME_DIR": rundir}
    times: dict[int, list[float]] = defaultdict(list)
    shares: dict[int, dict[str, float]] = {}
    failed = False
    try:
        for _ in range(args.runs):
            for level in levels:
                argv = command(level, args.platform, host_devices, args.duration, args.memory_fraction)
                started = time.perf_counter()
                result = subprocess.run(argv, capture_output=True, text=True, env=env)
                elapsed = time.perf_counter() - started
                times[level].append(elapsed)
                document = json.loads(result.stdout) if result.stdout.strip() else {}
                per_test: dict[str, float] = defaultdict(float)
                for check in document.get("checks", []):
                    per_test[check["test"].split(" ")[0]] += check["duration_s"]
                shares[level] = per_test
                status = document.get("status", f"exit {result.returncode}")
                failed |= result.returncode not in (0, 3)
                estimate = next((n for n in document.get("notes", []) if n.startswith("-r 4 ")), None)
                print(f"$ {' '.join(['tpu-diag', *argv[argv.index('-r'):]])}\n  wall {elapsed:.1f} s, "
                      f"status {status}, exit {result.returncode}" + (f"\n  said up front: {estimate}" if estimate
                                                                      else ""))
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    for level in levels:
        median = statistics.median(times[level])
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in sorted(shares[level].items(),
                                                                                  key=lambda kv: -kv[1]))
        if level in BUDGET_S:
            verdict = "ok" if median <= BUDGET_S[level] else "over budget"
            print(f"tpu-diag -r {level}: median {median:.1f} s over {len(times[level])} run(s) / budget "
                  f"{BUDGET_S[level]:.0f} s = {median / BUDGET_S[level]:.2f} {verdict}")
        else:
            print(f"tpu-diag -r {level}: median {median:.1f} s over {len(times[level])} run(s)")
        print(f"  time in tests (the rest is starting Python, jax and the runtime): {parts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
