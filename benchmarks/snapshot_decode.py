#!/usr/bin/env python3
"""What a monitor pays to decode one agent snapshot: the bytes an agent answers, to what the monitor reads.

- before: orjson.loads (json for NaN) and the hand-written validators into a checked copy of dicts, the path the
  monitor took until snapshots became typed records (read from git history, `--before`);
- after: `msgspec.json.decode(payload, type=AgentSnapshot)` (tpu_tools.metrics.agent_snapshot.decode_snapshot).

The snapshot is one a real job answered on the CPU platform (8 host devices, jitted functions compiled and
recompiled for several shapes, steps with FLOPs and samples, goodput, a persistent compilation cache, published
metrics), saved as tests/agent_snapshot_cpu.json; `--record` makes it again from a fresh job. Both paths are
timed alternately in each of several processes (this machine's speed moves); the figure is the ratio of their
medians in each process.

    python benchmarks/snapshot_decode.py [--processes 5] [--rounds 2000]
    python benchmarks/snapshot_decode.py --record tests/agent_snapshot_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "agent_snapshot_cpu.json"

# A job that gives a snapshot every part of it: functions compiled for several shapes (recompiles with their
# reasons), steps with FLOPs and samples (goodput, MFU), a persistent compilation cache, a global metric.
JOB = textwrap.dedent("""
    import os, sys, time
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent

    agent.start(tag="train", explain_recompiles=True, price_per_hour=1.2, peak_flops_per_s=1e12)

    @jax.jit
    def train_step(w, x):
        return w - 0.001 * (x.T @ (x @ w)) / x.shape[0]

    @jax.jit
    def evaluate(w, x):
        return jnp.mean((x @ w) ** 2)

    mesh = jax.sharding.Mesh(jax.devices(), ("d",))
    data = jax.device_put(jnp.ones((len(jax.devices()) * 64, 256), jnp.float32),
                          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    w = jnp.ones((64, 64))
    for rows in (8, 16, 32, 64):  # a recompile for each new input shape
        train_step(w, jnp.ones((rows, 64))).block_until_ready()
        evaluate(w, jnp.ones((rows, 64))).block_until_ready()
    x = jnp.ones((64, 64))
    for index in range(200):
        with agent.step_context(flops=2 * 64 * 64 * 64 * 2, samples=64):
            w = train_step(w, x).block_until_ready()
        agent.metric("loss", float(evaluate(w, x)), scope="global")
        time.sleep(0.01)
    print(os.getpid(), flush=True)
    sys.stdin.read()  # until the recorder has the snapshot
""")


def record(path: Path) -> None:
    """Run the job and save its agent's answer to a snapshot request, as the agent wrote it."""
    from tpu_tools.metrics import wire
    from tpu_tools.metrics.rundir import socket_path

    with tempfile.TemporaryDirectory() as rundir, tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TPU_TOOLS_RUNTIME_DIR": rundir, "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_COMPILATION_CACHE_DIR": cache,
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
        job = subprocess.Popen([sys.executable, "-c", JOB], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
        try:
            assert job.stdout is not None and job.stdin is not None
            pid = int(job.stdout.readline())
            import socket

            with socket.socket(socket.AF_UNIX) as connection:
                connection.connect(str(socket_path(pid, Path(rundir))))
                connection.sendall(wire.encode_request(wire.REQUEST_SNAPSHOT))
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = connection.recv(1 << 20)
                    if not chunk:
                        break
                    answer += chunk
            job.stdin.close()
        finally:
            job.wait(timeout=60)
    path.write_text(json.dumps(json.loads(answer), indent=1) + "\n")
    print(f"{path}: {len(answer)} bytes")


# The tree before snapshots became records: its validators (tpu_tools/records.py) and its snapshot spec
# (tpu_tools/metrics/agent_snapshot.py), read from git history rather than kept twice.
BEFORE = "c8267b22e13ceabb18ac13c0337164e230b5cbaa"


def _module(name: str, revision: str, path: str) -> Any:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], capture_output=True, text=True,
                            check=True).stdout
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"{revision[:7]}:{path}", "exec"), module.__dict__)  # noqa: S102 - this repository's code
    return module


def _parse_before(revision: str) -> Any:
    """`parse_snapshot` of `revision`: the validators building a checked copy of dicts."""
    _module("tpu_tools.records", revision, "tpu_tools/records.py")  # what its agent_snapshot imports
    return _module("agent_snapshot_before", revision, "tpu_tools/metrics/agent_snapshot.py").parse_snapshot


def _timed(function: Any, rounds: int) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        function()
    return (time.perf_counter() - started) / rounds


def measure(rounds: int, pairs: int, revision: str) -> None:
    """One process: both paths, alternating, `pairs` times; prints the medians (microseconds per snapshot)."""
    from tpu_tools.metrics import wire
    from tpu_tools.metrics.agent_snapshot import decode_snapshot

    payload = json.dumps(json.loads(FIXTURE.read_text()), separators=(",", ":")).encode() + b"\n"
    parse_snapshot = _parse_before(revision)

    def before() -> Any:
        return parse_snapshot(wire.decode_response(payload))

    def after() -> Any:
        return decode_snapshot(payload)

    old, new = [], []
    for _ in range(pairs):
        old.append(_timed(before, rounds))
        new.append(_timed(after, rounds))
    print(json.dumps({"bytes": len(payload), "before_us": statistics.median(old) * 1e6,
                      "after_us": statistics.median(new) * 1e6}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2000, help="decodes per timing")
    parser.add_argument("--pairs", type=int, default=9, help="alternating timings of each path per process")
    parser.add_argument("--before", default=BEFORE, metavar="REVISION",
                        help="the git revision whose validators are the path before")
    parser.add_argument("--record", type=Path, metavar="PATH", help="save a fresh job's snapshot to PATH and exit")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one process of the run
    args = parser.parse_args()
    if args.record:
        record(args.record)
        return
    if args.measure:
        measure(args.rounds, args.pairs, args.before)
        return
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    ratios = []
    for index in range(args.processes):
        command = [sys.executable, __file__, "--measure", "--rounds", str(args.rounds), "--pairs", str(args.pairs),
                   "--before", args.before]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        figures = json.loads(output.strip().splitlines()[-1])
        ratio = figures["before_us"] / figures["after_us"]
        ratios.append(ratio)
        print(f"process {index + 1}: {figures['bytes']} bytes; before (orjson + validators) "
              f"{figures['before_us']:.1f} us, after (msgspec into AgentSnapshot) {figures['after_us']:.1f} us: "
              f"{ratio:.2f}x faster")
    print(f"median over {args.processes} processes: decode of a real CPU-platform snapshot "
          f"{statistics.median(ratios):.2f}x faster with msgspec records")


if __name__ == "__main__":
    main()
