#!/usr/bin/env python3
"""What the agent's work costs a stepping job in CPU: a step marked, and a publication of its snapshot file.

A training process (the MLP of `agent_overhead.py`, jitted, on the CPU platform, on one CPU so that each step
leaves the caches as a job's steps do) runs `--steps` steps with the agent started and nobody reading it. It
reads the CPU time of its own thread around each `tpu_tools.agent.step()` (the median is the figure: what the
training thread pays per step), and the CPU time of the agent's publishing thread from the scheduler, divided
by the publications it made (building the snapshot, encoding it and writing the file, with its waking). With
`--against DIR` (a tree of tpu_tools, e.g. `git archive <commit> tpu_tools | tar -x -C DIR`) the processes
alternate between that tree (through PYTHONPATH) and this one, and the ratios of the medians are printed.

    python benchmarks/publication_cpu.py [--steps 600] [--processes 3] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from agent_overhead import JAX_STEP
from harness import private_workdir

MEASURED = textwrap.dedent("""
    import json, os, statistics, sys, time
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # before the runtime starts its threads
    steps = int(sys.argv[1])
""") + JAX_STEP + textwrap.dedent("""
    def publisher_cpu_s():
        tid = agent._agent.publisher._thread.native_id
        with open(f"/proc/self/task/{tid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9

    agent.start(tag="publication")
    for _ in range(20):  # the agent's first snapshots and the job log's start are once in a job's life
        one_step(True)
    marking = []
    published, cpu = agent._agent.publisher.published, publisher_cpu_s()
    for _ in range(steps):
        one_step(False)
        started = time.thread_time()
        agent.step()
        marking.append(time.thread_time() - started)
    publications = agent._agent.publisher.published - published
    print(json.dumps({"step_s": statistics.median(marking),
                      "publication_s": (publisher_cpu_s() - cpu) / max(1, publications),
                      "publications": publications}))
    agent.stop()
""")


def measure(script: Path, steps: int, env: dict[str, str]) -> dict[str, float]:
    result = subprocess.run([sys.executable, str(script), str(steps)], env=env, capture_output=True, text=True,
                            check=True, timeout=900)
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps measured per process (600)")
    parser.add_argument("--processes", type=int, default=3, help="processes per tree (3)")
    parser.add_argument("--against", type=Path, help="a tree of tpu_tools to alternate with")
    args = parser.parse_args()
    workdir, rundir = private_workdir("ttpub")
    script = workdir / "measured.py"
    script.write_text(MEASURED)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "TPU_TOOLS_TAG",
                                                             "TPU_TOOLS_JOB", "TPU_TOOLS_SNAPSHOT_FILE")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir))
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"this tree": {**env, "PYTHONPATH": here}}
    if args.against is not None:
        trees = {"against": {**env, "PYTHONPATH": str(args.against.resolve())}, **trees}
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        for _ in range(args.processes):
            for name, tree_env in trees.items():
                runs[name].append(measure(script, args.steps, tree_env))
                last = runs[name][-1]
                print(f"{name}: agent.step() {last['step_s'] * 1e6:.1f} us, a publication "
                      f"{last['publication_s'] * 1e6:.1f} us of CPU ({last['publications']:.0f} publications)",
                      flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {name: {key: statistics.median(run[key] for run in found) for key in ("step_s", "publication_s")}
               for name, found in runs.items()}
    for name, figures in medians.items():
        print(f"{name}, medians of {args.processes} processes: agent.step() {figures['step_s'] * 1e6:.1f} us, "
              f"a publication {figures['publication_s'] * 1e6:.1f} us of CPU")
    if "against" in medians:
        this, against = medians["this tree"], medians["against"]
        print(f"this tree / against: agent.step() {this['step_s'] / against['step_s']:.2f}, a publication "
              f"{this['publication_s'] / against['publication_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
