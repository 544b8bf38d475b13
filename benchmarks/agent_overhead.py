#!/usr/bin/env python3
"""What the agent costs a training job while a monitor polls it 10 times a second.

A reference training loop (an MLP: forward, loss, gradients, SGD update, jitted,
on the CPU platform) runs in blocks of steps. Blocks alternate, in ABBA order,
between the agent running (its server answering a `tpu-monitor --period 0.1`
that polls all the time, and `tpu_tools.agent.step()` marking every step) and
no agent at all (server stopped, no step marking). Interleaving blocks inside
the same processes keeps the machine's drift (this box is shared and noisy)
out of the comparison; the monitor runs throughout, so both kinds of block
share the machine with it. Every block starts at a random phase of the monitor's
0.1 s poll: a block that began right after the monitor was answered (the agent
blocks did, waiting for the monitor's first request) would overlap the monitor
digesting that answer on the same cores. Where a block starts or stops the
agent, a few untimed steps run first: the agent's start (its threads, socket,
first snapshot, the job log's start event) and its stop are once in a job's
life, not the cost of a step. The figure is the median step time over all agent
blocks divided by that over all no-agent blocks (the per-pair ratios are
printed too, with their spread). Target: <= 1.01. To show where a difference
comes from it also reports the CPU time of building one snapshot, the serving
thread's CPU per request (waking, accepting, answering, sending), and the
agent's steps split into those during which it answered a request and the
others.
It also draws the block pairs again with replacement, 1,000 times, and prints where 90 % of
those figures fall: how much one run's figure owes to which pairs it happened to get.
`--no-monitor` runs the same blocks with nothing polling: what the agent costs
by being there (its thread asleep, step marking, JAX's monitoring callbacks).
`--ping-only` has the agent answer the monitor's snapshot requests with its
one-line `ping` reply (pid and tag): the floor of being polled at all, a thread
of the job woken to read a line and send one, and the monitor's round with an
agent in it, whatever the answer holds.

`--monitors 1,4,16` compares the two designs side by side: blocks of no agent, of
the agent answering every poll on its socket (`TPU_TOOLS_SNAPSHOT_FILE=0`, the
design before the snapshot file) and of the agent publishing its snapshot file,
in turn (off, socket, file, file, socket, off), under N pollers that each read
every agent 10 times a second through the monitors' client (`query_agents` with
kept connections, as tpu-monitor does, without the rest of tpu-monitor's round so
that 16 of them fit beside the job); per N, each design's figure as above, and
the CPU the agent's own threads (serving, publishing) took per step: what the
job pays, apart from the pollers' own CPU, which on a 2-core machine competes
with the job's threads whatever the design; that is printed too, per poll while
each kind of block ran (each poller's figure from the scheduler, read by the
training process as each block starts and ends).
Target: the file design at most 1.005 with 16 monitors.
`--pin` puts the job on half of the CPUs and the pollers on the other half, as on a
host with cores to spare for its monitors (a TPU VM has dozens): the pollers' own
CPU then no longer competes with the job's threads, and what remains is what the
agent costs the job, by design, for each number of monitors: the socket design's
serving thread wakes inside the job for every poll, the file design's does not.
Without it, on a machine whose every core the job fills (this 2-core one), each
figure also holds the pollers' CPU taken from the job.

    python benchmarks/agent_overhead.py [--processes 3] [--blocks 120] [--steps 10] [--no-monitor | --ping-only]
    python benchmarks/agent_overhead.py --monitors 1,4,16 [--pin] [--processes 2] [--blocks 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from harness import private_workdir, script

# The training process: PREAMBLE, then a frontend's part (its model and `one_step(on)`, one timed step, marked
# with the agent when `on`), then HARNESS (the blocks, their timing and the agent's answers).
PREAMBLE = textwrap.dedent("""
    import json, os, random, statistics, sys, time
    if os.environ.get("TTBENCH_JOB_CPUS"):  # before the runtime starts its threads, which inherit it
        os.sched_setaffinity(0, {int(cpu) for cpu in os.environ["TTBENCH_JOB_CPUS"].split(",")})
    blocks, steps, polled = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4] == "polled"
    schedule = sys.argv[3].split(",")  # the kind of each block, in turn: off, socket, file
    ping_only = sys.argv[5] == "ping-only"
""")

JAX_STEP = textwrap.dedent("""
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent
    from tpu_tools.metrics import wire

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        h = jnp.tanh(h @ params["w2"] + params["b2"])
        return jnp.mean((h @ params["w3"] - y) ** 2)

    @jax.jit
    def train_step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    k1, k2, k3, kx, ky = jax.random.split(jax.random.PRNGKey(0), 5)
    params = {"w1": jax.random.normal(k1, (512, 1024)) * 0.03, "b1": jnp.zeros(1024),
              "w2": jax.random.normal(k2, (1024, 1024)) * 0.03, "b2": jnp.zeros(1024),
              "w3": jax.random.normal(k3, (1024, 64)) * 0.03}
    x, y = jax.random.normal(kx, (256, 512)), jax.random.normal(ky, (256, 64))
    for _ in range(10):  # compile and warm up
        params, value = train_step(params, x, y)
        value.block_until_ready()

    def one_step(on):
        global params
        params, value = train_step(params, x, y)
        value.block_until_ready()
        if on:
            agent.step()
""")

HARNESS = textwrap.dedent("""
    def server_cpu_s():
        # CPU time of the agent's serving thread, in ns from the scheduler (Linux; else 0).
        try:
            tid = agent._agent.server.thread_id
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                return int(stat.read().split()[0]) / 1e9
        except (OSError, AttributeError):
            return 0.0

    def publisher_cpu_s():
        # CPU time of the agent's publishing thread (building and writing the snapshot file; 0 without it).
        try:
            tid = agent._agent.publisher._thread.native_id
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                return int(stat.read().split()[0]) / 1e9
        except (OSError, AttributeError):
            return 0.0

    pollers = [int(pid) for pid in os.environ.get("TTBENCH_POLLERS", "").split(",") if pid]

    def pollers_cpu_s():
        # CPU time of the benchmark's pollers (the readers), in ns from the scheduler; 0 for one that is gone.
        total = 0
        for pid in pollers:
            try:
                with open(f"/proc/{pid}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return total / 1e9

    SETTLE_STEPS = 5  # untimed, after the agent was started or stopped: its threads and first writes settle
    answered = []  # (start, end) of every answer, to tell the steps a request landed in from the others

    def record_answers():
        server = agent._agent.server
        inner = server._answer
        def timed(request):
            started = time.perf_counter()
            try:
                return inner(wire.REQUEST_PING if ping_only and request == wire.REQUEST_SNAPSHOT else request)
            finally:
                answered.append((started, time.perf_counter()))
        server._answer = timed

    def start_agent(kind):
        # "socket": the agent answers every poll (no snapshot file); "file": monitors read the file it publishes
        os.environ["TPU_TOOLS_SNAPSHOT_FILE"] = "0" if kind == "socket" else "1"
        agent.start(tag="bench")
        record_answers()

    result, running = [], None
    for block in range(blocks):
        kind = schedule[block % len(schedule)]
        on = kind != "off"
        if running != kind:
            agent.stop()
            if on:
                start_agent(kind)
            running = kind
            for _ in range(SETTLE_STEPS):  # starting or stopping the agent is not the cost of a step
                one_step(on)
        if on and kind == "socket":
            served = agent._agent.server.counters
            deadline = time.monotonic() + 1.0
            while polled and served.served == 0 and time.monotonic() < deadline:  # until the monitor is polling it
                time.sleep(0.005)
        if polled:  # start at a random phase of the monitor's poll, never in step with it (see the docstring)
            time.sleep(random.uniform(0.0, 0.1))
        times, spans = [], []
        readers_before, block_start = pollers_cpu_s(), time.perf_counter()
        if on:
            cpu_before, served_before = server_cpu_s(), agent._agent.server.counters.served
            published_before = publisher_cpu_s()
        for _ in range(steps):
            start = time.perf_counter()
            one_step(on)
            end = time.perf_counter()
            times.append(end - start)
            spans.append((start, end))
        record = {"on": on, "kind": kind, "median_step_s": statistics.median(times), "step_s": times,
                  "pollers_cpu_s": pollers_cpu_s() - readers_before, "block_s": time.perf_counter() - block_start}
        if on:
            record["server_cpu_s"] = server_cpu_s() - cpu_before
            record["publisher_cpu_s"] = publisher_cpu_s() - published_before
            record["served"] = agent._agent.server.counters.served - served_before
            record["answered_in_step"] = [any(a < e and b > s for a, b in answered) for s, e in spans]
        result.append(record)
    agent.stop()
    agent.start(tag="bench")
    # CPU cost of answering one snapshot request in this process (what each poll costs the job).
    cpu = time.process_time()
    for _ in range(200):
        agent._agent.answer("snapshot")
    snapshot_cpu_s = (time.process_time() - cpu) / 200
    agent.stop()
    print(json.dumps({"blocks": result, "snapshot_cpu_s": snapshot_cpu_s}))
""")

TRAIN = PREAMBLE + JAX_STEP + HARNESS


RESAMPLES = 1000


def resampled_interval(pairs: list[tuple[list[float], list[float]]]) -> tuple[float, float]:
    """5th and 95th percentiles of the figure over the block pairs drawn again with replacement (a bootstrap):
    how far the figure moves with which pairs this run happened to get, the noise a single run carries."""
    draw = random.Random(0)
    figures = []
    for _ in range(RESAMPLES):
        chosen = [pairs[draw.randrange(len(pairs))] for _ in pairs]
        on = [t for steps, _ in chosen for t in steps]
        off = [t for _, steps in chosen for t in steps]
        figures.append(statistics.median(on) / statistics.median(off))
    cuts = statistics.quantiles(figures, n=20)
    return cuts[0], cuts[-1]


POLLER = textwrap.dedent("""
    import random, time
    from tpu_tools.metrics.agent_client import AgentConnections, query_agents
    connections = AgentConnections()  # as tpu-monitor keeps them
    next_at = time.monotonic() + random.uniform(0.0, 0.1)
    while True:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += 0.1
        query_agents(1.0, connections=connections)
""")

# Blocks in turn: no agent, the agent answering on its socket, the agent publishing its file (and the mirror
# image, so drift weighs the same on each kind).
DESIGNS_SCHEDULE = ["off", "socket", "file", "file", "socket", "off"]


@dataclass(frozen=True)
class Placement:
    """The CPUs the job runs on and those the pollers run on, apart (--pin)."""

    job_cpus: frozenset[int]
    poller_cpus: frozenset[int]


def pinned_placement() -> Placement:
    """The job on the upper half of this process's CPUs, the pollers on the lower half (at least one each)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least two CPUs: the job on some, the pollers on the others")
    half = len(cpus) // 2
    return Placement(job_cpus=frozenset(cpus[half:]), poller_cpus=frozenset(cpus[:half]))


def start_pollers(count: int, poller: Path, env: dict[str, str],
                  placement: Placement | None) -> list[subprocess.Popen[bytes]]:
    """`count` poller processes, on the pollers' CPUs of `placement` when given."""
    pollers = [subprocess.Popen([sys.executable, str(poller)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for _ in range(count)]
    if placement is not None:
        for process in pollers:
            os.sched_setaffinity(process.pid, placement.poller_cpus)
    return pollers


def compare_designs(counts: list[int], processes: int, blocks: int, steps: int, train_text: str, python: str,
                    env_extra: dict[str, str], placement: Placement | None = None) -> int:
    """Per count of pollers: the median step of each design's blocks over that of the no-agent blocks; with
    `placement`, the job and the pollers each on CPUs of their own."""
    workdir, rundir = private_workdir()
    train, poller = workdir / "train.py", workdir / "poller.py"
    train.write_text(train_text)
    poller.write_text(POLLER)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir), **env_extra)
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    if placement is not None:
        print(f"# the job on CPUs {sorted(placement.job_cpus)}, the pollers on CPUs {sorted(placement.poller_cpus)}")
    worst = 0.0
    try:
        for count in counts:
            pollers = start_pollers(count, poller, env, placement)
            steps_of: dict[str, list[float]] = {"off": [], "socket": [], "file": []}
            served = {"socket": 0, "file": 0}
            agent_cpu_s = {"socket": 0.0, "file": 0.0}  # the agent's threads: serving and publishing
            readers_cpu_s = {"off": 0.0, "socket": 0.0, "file": 0.0}  # the pollers', while each kind of block ran
            block_s = {"off": 0.0, "socket": 0.0, "file": 0.0}
            env_run = {**env, "TTBENCH_POLLERS": ",".join(str(process.pid) for process in pollers)}
            if placement is not None:
                env_run["TTBENCH_JOB_CPUS"] = ",".join(str(cpu) for cpu in sorted(placement.job_cpus))
            pairs: dict[str, list[tuple[list[float], list[float]]]] = {"socket": [], "file": []}
            try:
                for index in range(processes):
                    shift = (index * 3) % len(DESIGNS_SCHEDULE)
                    schedule = ",".join(DESIGNS_SCHEDULE[shift:] + DESIGNS_SCHEDULE[:shift])
                    command = [python, str(train), str(blocks), str(steps), schedule, "polled", "snapshot"]
                    result = subprocess.run(command, env=env_run, capture_output=True, text=True, check=True,
                                            timeout=900)
                    records = json.loads(result.stdout.strip().splitlines()[-1])["blocks"]
                    for record in records:
                        steps_of[record["kind"]] += record["step_s"]
                        readers_cpu_s[record["kind"]] += record["pollers_cpu_s"]
                        block_s[record["kind"]] += record["block_s"]
                        served[record["kind"]] = served.get(record["kind"], 0) + record.get("served", 0)
                        if record["kind"] in agent_cpu_s:
                            agent_cpu_s[record["kind"]] += record["server_cpu_s"] + record["publisher_cpu_s"]
                    for cycle in range(0, len(records) - len(DESIGNS_SCHEDULE) + 1, len(DESIGNS_SCHEDULE)):
                        group = records[cycle:cycle + len(DESIGNS_SCHEDULE)]
                        off = [t for r in group if r["kind"] == "off" for t in r["step_s"]]
                        for kind in pairs:
                            pairs[kind].append(([t for r in group if r["kind"] == kind for t in r["step_s"]], off))
            finally:
                for process in pollers:
                    process.terminate()
                for process in pollers:
                    process.wait(timeout=30)
            off_median = statistics.median(steps_of["off"])
            polls = {kind: block_s[kind] * 10 * count for kind in block_s}  # each poller polls 10 times a second
            if count:
                print(f"{count:2d} monitors at 10 Hz, the pollers' CPU per poll: no agent "
                      f"{readers_cpu_s['off'] / polls['off'] * 1e3:.3f} ms, socket "
                      f"{readers_cpu_s['socket'] / polls['socket'] * 1e3:.3f} ms, file "
                      f"{readers_cpu_s['file'] / polls['file'] * 1e3:.3f} ms; all of them, in % of one core: "
                      + ", ".join(f"{kind} {readers_cpu_s[kind] / block_s[kind] * 100:.1f}%" for kind in block_s),
                      flush=True)
            for kind in ("socket", "file"):
                ratio = statistics.median(steps_of[kind]) / off_median
                low, high = resampled_interval(pairs[kind])
                if kind == "file":
                    worst = max(worst, ratio)
                print(f"{count:2d} monitors at 10 Hz, {kind:6s}: {statistics.median(steps_of[kind]) * 1e3:.3f} ms / "
                      f"{off_median * 1e3:.3f} ms = {ratio:.4f} (90% of resamples {low:.4f} .. {high:.4f}); "
                      f"requests the job served: {served[kind]}; the agent's threads took "
                      f"{agent_cpu_s[kind] / len(steps_of[kind]) * 1e3:.3f} ms of CPU per step "
                      f"({agent_cpu_s[kind] / sum(steps_of[kind]) * 100:.2f}% of the steps' time)", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    verdict = "ok" if worst <= 1.005 else "OVER TARGET"
    print(f"the snapshot file, worst over {counts} monitors: {worst:.4f} (target <= 1.005) {verdict}")
    return 0 if worst <= 1.005 else 1


def main(train_text: str = TRAIN, description: str | None = None, python: str | None = None,
         env_extra: dict[str, str] | None = None) -> int:
    """Run the benchmark with `train_text` as the training process (it takes the same arguments and prints the
    same JSON line); `python` runs it (default: this interpreter, or --python)."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3, help="training processes, one after another (3)")
    parser.add_argument("--python", default=python or sys.executable,
                        help="the interpreter of the training processes (default: %(default)s)")
    parser.add_argument("--blocks", type=int, default=120, help="blocks of steps per process, a multiple of 4 (120)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per block (10)")
    answers = parser.add_mutually_exclusive_group()
    answers.add_argument("--no-monitor", action="store_true", help="nothing polls the agent")
    answers.add_argument("--ping-only", action="store_true",
                         help="the agent answers snapshot requests with its one-line ping reply")
    answers.add_argument("--monitors", metavar="N,N,...",
                         help="compare the two designs under N pollers at 10 Hz each (e.g. 1,4,16)")
    parser.add_argument("--pin", action="store_true",
                        help="with --monitors: the job on half of the CPUs, the pollers on the other half, as on a "
                             "host whose monitors do not share the job's cores")
    args = parser.parse_args()
    if args.pin and not args.monitors:
        parser.error("--pin goes with --monitors")
    if args.monitors:
        return compare_designs([int(n) for n in args.monitors.split(",")], args.processes, args.blocks, args.steps,
                               train_text, args.python, env_extra or {},
                               pinned_placement() if args.pin else None)
    workdir, rundir = private_workdir()
    train = workdir / "train.py"
    train.write_text(train_text)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir), **(env_extra or {}))
    monitor_out = workdir / "monitor.jsonl"
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    ratios, on_s, off_s, snapshot_s = [], [], [], []
    pairs: list[tuple[list[float], list[float]]] = []  # (agent block's steps, no-agent block's steps)
    served, server_cpu_s = 0, 0.0
    hit_s, clean_s = [], []  # agent steps during which it answered a request, and the others
    monitor = None
    with open(monitor_out, "w") as sink:
        if not args.no_monitor:
            monitor = subprocess.Popen([*script("tpu-monitor"), "--period", "0.1"], env=env, stdout=sink,
                                       stderr=subprocess.DEVNULL)
    polling = "unpolled" if args.no_monitor else "polled"
    try:
        for index in range(args.processes):
            agent_kind = "socket" if args.ping_only else "file"  # ping-only: the socket's floor
            abba = [agent_kind, "off", "off", agent_kind]
            schedule = ",".join(abba if index % 2 == 0 else abba[2:] + abba[:2])
            command = [args.python, str(train), str(args.blocks), str(args.steps), schedule, polling,
                       "ping-only" if args.ping_only else "snapshot"]
            result = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=900)
            document = json.loads(result.stdout.strip().splitlines()[-1])
            blocks = document["blocks"]
            snapshot_s.append(document["snapshot_cpu_s"])
            for a, b in zip(blocks[0::2], blocks[1::2]):
                on, off = (a, b) if a["on"] else (b, a)
                ratios.append(on["median_step_s"] / off["median_step_s"])
                pairs.append((on["step_s"], off["step_s"]))
            served += sum(b["served"] for b in blocks if b["on"])
            server_cpu_s += sum(b["server_cpu_s"] for b in blocks if b["on"])
            on_s += [t for b in blocks if b["on"] for t in b["step_s"]]
            for b in (b for b in blocks if b["on"]):
                for t, hit in zip(b["step_s"], b["answered_in_step"]):
                    (hit_s if hit else clean_s).append(t)
            off_s += [t for b in blocks if not b["on"] for t in b["step_s"]]
            print(f"process {index + 1}: {len(blocks) // 2} pairs, median ratio "
                  f"{statistics.median(ratios[-(len(blocks) // 2):]):.4f}", flush=True)
    finally:
        if monitor is not None:
            monitor.terminate()
            monitor.wait(timeout=30)
    polled = sum(1 for line in monitor_out.read_text().splitlines() if '"tag":"bench"' in line)
    reports = len(monitor_out.read_text().splitlines())
    shutil.rmtree(workdir, ignore_errors=True)
    # The figure: median step time of all agent steps over that of all no-agent steps, the steps coming
    # from interleaved blocks. Per-pair ratios are shown too: on a shared machine they spread widely.
    ratio = statistics.median(on_s) / statistics.median(off_s)
    verdict = "ok" if ratio <= 1.01 else "OVER TARGET"
    quartiles = statistics.quantiles(ratios, n=4)
    polling_text = ("nothing polling" if args.no_monitor
                    else f"monitor reports: {reports}, with the agent in them: {polled}")
    if args.ping_only:
        polling_text += " (its one-line ping reply to each)"
    print(f"{polling_text}; "
          f"one snapshot costs the job {statistics.median(snapshot_s) * 1e3:.2f} ms of CPU "
          f"({statistics.median(snapshot_s) * 10 * 100:.2f}% of one core at 10 requests/s)")
    if served and server_cpu_s:
        print(f"the agent's thread, while the job ran: {served} requests, {server_cpu_s / served * 1e3:.2f} ms of its "
              "CPU each (waking, accepting, answering, sending)")
    if hit_s and clean_s:
        print(f"agent steps during which it answered a request: {len(hit_s)}, median "
              f"{statistics.median(hit_s) * 1e3:.3f} ms; the other agent steps: {len(clean_s)}, median "
              f"{statistics.median(clean_s) * 1e3:.3f} ms; no-agent steps: median "
              f"{statistics.median(off_s) * 1e3:.3f} ms")
    print(f"per-pair ratios (agent block / no-agent block medians), {len(ratios)} pairs: median "
          f"{statistics.median(ratios):.4f}, quartiles {quartiles[0]:.4f} .. {quartiles[2]:.4f}")
    low, high = resampled_interval(pairs)
    print(f"the figure over block pairs drawn again with replacement ({RESAMPLES} times): 90% of them between "
          f"{low:.4f} and {high:.4f}")
    print(f"median step time over {len(on_s)} agent steps / {len(off_s)} no-agent steps, interleaved: "
          f"{statistics.median(on_s) * 1e3:.3f} ms / {statistics.median(off_s) * 1e3:.3f} ms = {ratio:.4f} "
          f"(target <= 1.01) {verdict}")
    return 0 if ratio <= 1.01 else 1


if __name__ == "__main__":
    sys.exit(main())
