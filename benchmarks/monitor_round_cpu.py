#!/usr/bin/env python3
"""What one round of `tpu-monitor --period 0.1` costs in CPU, with no agent and with one.

On a training host the monitor shares the cores with the job: every millisecond of its CPU per round is,
10 times a second, a millisecond the job's threads wait for. This runs the real monitor for `--seconds`
against an empty runtime directory, then against one with an idle JAX job that has the agent started,
and prints the monitor process's CPU time (user + system, all its threads, from /proc) per report.
Runs alternate between the two cases, `--runs` of each; the medians are printed.

    python benchmarks/monitor_round_cpu.py [--runs 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import script

JOB = ("import sys, jax.numpy as jnp, tpu_tools.agent as agent; agent.start(tag='bench'); "
       "jnp.ones(4).block_until_ready(); print('ready', flush=True); sys.stdin.readline()")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a whole process (every thread, living or ended)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(with_agent: bool, seconds: float) -> float:
    """The monitor's CPU milliseconds per report over `seconds`."""
    rundir = Path(tempfile.mkdtemp(prefix="ttmon", dir="/tmp"))
    rundir.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir))
    job = None
    try:
        if with_agent:
            job = subprocess.Popen([sys.executable, "-c", JOB], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
            assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        monitor = subprocess.Popen([*script("tpu-monitor"), "--period", "0.1"], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        assert monitor.stdout is not None
        try:
            for _ in range(5):  # past the first reports (imports, the first discovery)
                monitor.stdout.readline()
            before, started, reports = process_cpu_s(monitor.pid), time.monotonic(), 0
            while time.monotonic() - started < seconds:
                line = monitor.stdout.readline()
                if not line:
                    raise RuntimeError("tpu-monitor stopped")
                reports += 1
            return (process_cpu_s(monitor.pid) - before) / reports * 1e3
        finally:
            monitor.terminate()
            monitor.wait(timeout=30)
    finally:
        if job is not None:
            assert job.stdin is not None
            job.stdin.close()
            job.wait(timeout=30)
        shutil.rmtree(rundir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each case, alternating (3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each run measures (10)")
    args = parser.parse_args()
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    figures: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.runs):
        for with_agent in (False, True):
            figures[with_agent].append(one_run(with_agent, args.seconds))
    for with_agent, name in ((False, "no agent"), (True, "one agent")):
        runs = ", ".join(f"{ms:.2f}" for ms in figures[with_agent])
        print(f"tpu-monitor --period 0.1, {name}: {statistics.median(figures[with_agent]):.2f} ms of CPU per report "
              f"(runs: {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
