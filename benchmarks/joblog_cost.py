"""What a job's log costs its steps: a loop of steps of pure-Python work (which holds the interpreter's lock, so the
writing thread's time is taken from the steps) with the agent, with and without a job log, side by side.

    python benchmarks/joblog_cost.py [--pairs 4] [--steps 3000] [--heartbeat 1]

Each pair runs one process with the log and one without, in alternating order; the figure is the median over pairs
of the ratio of their median step times. --heartbeat 0.05 writes the last step twenty times a second, the most
$TPU_TOOLS_JOB_HEARTBEAT_S allows.
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

JOB = """
import json, sys, time
import tpu_tools.agent as agent
agent.start()
steps = int(sys.argv[1])
times = []
for index in range(steps):
    start = time.perf_counter()
    sum(i * i for i in range(20000))  # about 1 ms of work that holds the interpreter's lock
    agent.step()
    if index and index % 500 == 0:
        agent.checkpoint_saved(index)
    times.append(time.perf_counter() - start)
kept = times[100:]
print(json.dumps([sorted(kept)[len(kept) // 2], sum(kept) / len(kept)]))
"""


def run(steps: int, job: bool, heartbeat: str, directory: str) -> tuple[float, float]:
    """(median, mean) step time of one process; the mean counts the rare step the writing thread delayed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_TOOLS_")}
    rundir = tempfile.mkdtemp(prefix="tt", dir="/tmp")
    # The snapshot file is off in both: its publishing thread builds a snapshot every 100 ms, and its cost, the
    # same in both, would drown the one measured here in noise.
    env.update(TPU_TOOLS_RUNTIME_DIR=rundir, TPU_TOOLS_JOB_DIR=directory, TPU_TOOLS_JOB_HEARTBEAT_S=heartbeat,
               TPU_TOOLS_SNAPSHOT_FILE="0")
    if job:
        env["TPU_TOOLS_JOB"] = "bench"
    try:
        result = subprocess.run([sys.executable, "-c", JOB, str(steps)], env=env, capture_output=True, text=True,
                                check=True)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    median, mean = json.loads(result.stdout.strip().splitlines()[-1])
    return float(median), float(mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--heartbeat", default="1")
    options = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="joblog")
    print(f"$ python benchmarks/joblog_cost.py --pairs {options.pairs} --steps {options.steps} "
          f"--heartbeat {options.heartbeat}")
    ratios: dict[str, list[float]] = {"median": [], "mean": []}
    for pair in range(options.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        figures = {job: run(options.steps, job, options.heartbeat, directory) for job in order}
        for index, kind in enumerate(ratios):
            ratios[kind].append(figures[True][index] / figures[False][index])
        print(f"pair {pair + 1}: step with the log / without: median {figures[True][0] * 1e3:.3f} / "
              f"{figures[False][0] * 1e3:.3f} ms, mean {figures[True][1] * 1e3:.3f} / {figures[False][1] * 1e3:.3f} ms")
    size = os.path.getsize(os.path.join(directory, "bench.log"))
    print(f"step time with the job log / without, {options.pairs} pairs of processes, heartbeat {options.heartbeat} "
          f"s: median ratio of medians {statistics.median(ratios['median']):.4f}, of means "
          f"{statistics.median(ratios['mean']):.4f} (target <= 1.01); the log: {size} bytes")
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
