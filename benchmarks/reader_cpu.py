#!/usr/bin/env python3
"""What one poller of the agent-overhead benchmark costs per poll, in CPU: the readers' side of reading a job.

On a host whose cores a job's threads fill, a monitor's CPU is taken from the job whatever the agent does:
the sixteen pollers of `agent_overhead.py --monitors 16` are sixteen such readers. This starts `--jobs`
light agent jobs (a Python loop marking a step every 10 ms; each agent publishes its snapshot file, about
every 100 ms), then runs pollers one after another, each reading every agent 10 times a second through the
monitors' client for `--polls` polls (`query_agents` with kept connections, exactly as the benchmark's
pollers and tpu-monitor do), and reads each poller's CPU (user + system, from the kernel) per poll. With
`--against DIR` (a tree of tpu_tools, e.g. `git archive <commit> tpu_tools | tar -x -C DIR`) the pollers
alternate between that tree (through PYTHONPATH) and this one, side by side in one run; `--jobs 0` gives
the cost of a poll that finds no agent.

    python benchmarks/reader_cpu.py [--jobs 1] [--polls 100] [--rounds 4] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from harness import private_workdir

LIGHT_JOB = textwrap.dedent("""
    import sys, time
    import tpu_tools.agent as agent
    agent.start(tag="readercpu")
    deadline = time.time() + float(sys.argv[1])
    while time.time() < deadline:
        time.sleep(0.01)
        agent.step()
""")

POLLER = textwrap.dedent("""
    import sys, time
    from tpu_tools.metrics.agent_client import AgentConnections, query_agents
    connections, polls, expected = AgentConnections(), int(sys.argv[1]), int(sys.argv[2])
    for _ in range(3):  # the first rounds open what later rounds keep
        query_agents(1.0, connections=connections)
    cpu, next_at, seen = time.process_time(), time.monotonic(), set()
    for _ in range(polls):
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += 0.1
        seen.add(sum(1 for r in query_agents(1.0, connections=connections).results if r.snapshot is not None))
    print((time.process_time() - cpu) / polls, min(seen))
""")


def poll_cpu_s(script: Path, polls: int, jobs: int, env: dict[str, str]) -> float:
    result = subprocess.run([sys.executable, str(script), str(polls), str(jobs)], env=env, capture_output=True,
                            text=True, check=True, timeout=polls + 120)
    per_poll, read = result.stdout.split()
    if int(read) != jobs:
        raise SystemExit(f"a poll read {read} of the {jobs} agents' snapshots")
    return float(per_poll)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="light agent jobs to read (1; 0: a poll that finds none)")
    parser.add_argument("--polls", type=int, default=100, help="polls at 10 Hz per poller (100)")
    parser.add_argument("--rounds", type=int, default=4, help="pollers per tree, alternating (4)")
    parser.add_argument("--against", metavar="DIR", help="a tree of tpu_tools to compare with, alternating")
    args = parser.parse_args()
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    workdir, rundir = private_workdir()
    job, poller = workdir / "job.py", workdir / "poller.py"
    job.write_text(LIGHT_JOB)
    poller.write_text(POLLER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_TOOLS_TAG", "TPU_TOOLS_SNAPSHOT_FILE")}
    env.update(TPU_TOOLS_RUNTIME_DIR=str(rundir))
    trees = {"this tree": env}
    if args.against:
        trees = {"against": {**env, "PYTHONPATH": str(Path(args.against).resolve())}, **trees}
    seconds = args.rounds * len(trees) * (args.polls / 10 + 15) + 60
    jobs = [subprocess.Popen([sys.executable, str(job), str(seconds)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(args.jobs)]
    figures: dict[str, list[float]] = {name: [] for name in trees}
    try:
        deadline = time.monotonic() + 60
        while len(list(rundir.glob("agent-*.snap"))) < args.jobs:
            if time.monotonic() > deadline:
                raise SystemExit("the jobs did not publish their snapshot files within 60 s")
            time.sleep(0.1)
        for round_index in range(args.rounds):
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for name in order:
                figures[name].append(poll_cpu_s(poller, args.polls, args.jobs, trees[name]))
            print("  ".join(f"{name}: {figures[name][-1] * 1e3:.3f} ms" for name in trees), flush=True)
    finally:
        for process in jobs:
            process.terminate()
        for process in jobs:
            process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    summary = ", ".join(f"{name} {value * 1e3:.3f} ms" for name, value in medians.items())
    print(f"a poller's CPU per poll at 10 Hz reading {args.jobs} agents' snapshot files, median of "
          f"{args.rounds} pollers of {args.polls} polls: {summary}", end="")
    if args.against:
        print(f" (this tree / against = {medians['this tree'] / medians['against']:.2f})")
    else:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
