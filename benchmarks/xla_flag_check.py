#!/usr/bin/env python3
"""What checking the user's XLA flags costs a command (tpu_tools.pjrt.runtime.check_xla_flags).

XLA aborts the process on a flag it does not know, so before an in-process runtime starts, a command that
was given flags (XLA_FLAGS or --xla-flag) starts XLA's CPU client on them in a child. This prints the wall
time of that check (a fresh process each time, so nothing is cached), median over --repeat runs, for a
known flag and for an unknown one, and the time of the same process without flags, for scale.

    python benchmarks/xla_flag_check.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CHECK = ("from tpu_tools.pjrt.runtime import RuntimePolicy, check_xla_flags\n"
         "try:\n    check_xla_flags(RuntimePolicy(platform='cpu', xla_flags=({flag!r},)))\n"
         "except Exception as error:\n    print(error)\n")


def timed(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    baseline = statistics.median(timed("import tpu_tools.pjrt.runtime") for _ in range(args.repeat))
    print(f"command: python benchmarks/xla_flag_check.py --repeat {args.repeat}")
    print(f"process without a check: {baseline:.2f} s")
    for flag in ("--xla_cpu_enable_fast_math=false", "--bogus"):
        seconds = statistics.median(timed(CHECK.format(flag=flag)) for _ in range(args.repeat))
        print(f"check of {flag}: {seconds:.2f} s ({seconds - baseline:+.2f} s)")


if __name__ == "__main__":
    main()
