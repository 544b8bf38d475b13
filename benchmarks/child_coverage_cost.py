#!/usr/bin/env python3
"""What measuring one program the tests start costs it: coverage's own start-up against the suite's line recorder.

Each program runs plain, under coverage's subprocess start-up (COVERAGE_PROCESS_CONFIG, the suite's
configuration, the sysmon core) and under the recorder the suite gives its children (tests/child_lines.py),
interleaved; the figure is the median CPU time (user + system) of the program, from its wait status.

    python benchmarks/child_coverage_cost.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from harness import script

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import child_coverage  # noqa: E402  (tests/: installs the recorder as the suite does)
import child_lines  # noqa: E402


def cpu_ms(command: list[str], env: dict[str, str]) -> float:
    quiet = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    pid = os.posix_spawnp(command[0], command, env, file_actions=quiet)
    _, _, usage = os.wait4(pid, 0)
    return (usage.ru_utime + usage.ru_stime) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    if not child_coverage.install():
        print("the recorder cannot be installed into this interpreter's site-packages (or it is before 3.12)")
        return 1
    from coverage import Coverage

    plain = {k: v for k, v in os.environ.items()
             if not k.startswith(("COVERAGE_", "COV_CORE_")) and k != child_lines.RECORD_VARIABLE}
    directory = tempfile.mkdtemp(prefix="child-coverage-cost-")
    config = Coverage(config_file=str(REPO / "pyproject.toml"), data_file=os.path.join(directory, ".coverage")).config
    variants = {
        "plain": plain,
        "coverage": {**plain, "COVERAGE_CORE": "sysmon", "COVERAGE_PROCESS_CONFIG": config.serialize()},
        "recorder": {**plain, child_lines.RECORD_VARIABLE: directory + os.pathsep + str(REPO / "tpu_tools")},
    }
    programs = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "tpu-ls --no-runtime --json": [*script("tpu-ls"), "--no-runtime", "--json"],
        "tpu-top --help": [*script("tpu-top"), "--help"],
    }
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    try:
        for label, command in programs.items():
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for env in variants.values():
                cpu_ms(command, env)  # warm the page cache and the bytecode
            for _ in range(args.runs):
                for name, env in variants.items():
                    samples[name].append(cpu_ms(command, env))
            median = {name: statistics.median(values) for name, values in samples.items()}
            print(f"{label}: CPU {median['plain']:.0f} ms plain, {median['coverage']:.0f} ms under coverage "
                  f"(+{median['coverage'] - median['plain']:.0f}), {median['recorder']:.0f} ms under the recorder "
                  f"(+{median['recorder'] - median['plain']:.0f})")
    finally:
        for leftover in Path(directory).glob("*"):
            leftover.unlink()
        os.rmdir(directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
