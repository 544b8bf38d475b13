#!/usr/bin/env python3
"""The job's CPU for one agent answer, with the cold caches of a thread that wakes now and then.

One process per run: a JAX job computing without pause on the CPU platform, the agent started inside it,
and a client process that asks over one kept connection every 20 ms (the serving thread finds none of its
code or data in the caches, as under a polling monitor). The figure is the CPU time of the agent's serving
thread per request, from the scheduler (`/proc/self/task/TID/schedstat`), for a full snapshot and for the
one-line `ping` answer (waking, reading the request, sending: what every answer costs). Runs alternate
between the two requests; compare trees side by side, alternating, through PYTHONPATH.

    python benchmarks/agent_answer_cpu.py [--runs 3] [--requests 300]
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

CLIENT = textwrap.dedent("""
    import socket, sys, time
    path, line, count = sys.argv[1], sys.argv[2].encode() + b"\\n", int(sys.argv[3])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    for _ in range(count):
        sock.sendall(line)
        answer = b""
        while not answer.endswith(b"\\n"):
            answer += sock.recv(1 << 20)
        time.sleep(0.02)
""")

JOB = textwrap.dedent("""
    import json, os, subprocess, sys, threading, time
    request_name, requests, client_source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent
    from tpu_tools.metrics import wire

    info = agent.start(tag="bench")
    def compute():
        x, step = jnp.ones((1024, 1024)), jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)
        while True:
            x = step(x)
            x.block_until_ready()
    threading.Thread(target=compute, daemon=True).start()
    server = agent._agent.server
    def serving_cpu_ns():
        with open(f"/proc/self/task/{server.thread_id}/schedstat") as stat:
            return int(stat.read().split()[0])
    line = wire.encode_request(request_name, keep=True).decode().strip()
    client = subprocess.Popen([sys.executable, "-c", client_source, str(info.socket_path), line, str(requests)])
    deadline = time.monotonic() + 60
    while server.counters.served < 10 and time.monotonic() < deadline:  # connected and warm: count from here
        time.sleep(0.01)
    cpu, served = serving_cpu_ns(), server.counters.served
    client.wait()
    print(json.dumps({"cpu_ns": serving_cpu_ns() - cpu, "served": server.counters.served - served}))
    os._exit(0)
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each request, alternating (3)")
    parser.add_argument("--requests", type=int, default=300, help="requests per run (300)")
    args = parser.parse_args()
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    rundir = tempfile.mkdtemp(prefix="ttbench", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=rundir)
    per_request: dict[str, list[float]] = {"snapshot": [], "ping": []}
    for _ in range(args.runs):
        for name in per_request:
            result = subprocess.run([sys.executable, "-c", JOB, name, str(args.requests), CLIENT], env=env,
                                    capture_output=True, text=True, check=True, timeout=600)
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            per_request[name].append(figures["cpu_ns"] / figures["served"] / 1e3)
    for name, figures in per_request.items():
        runs = ", ".join(f"{f:.0f}" for f in figures)
        print(f"{name:8s} answer: {statistics.mean(figures):.0f} us of the serving thread's CPU a request "
              f"(runs: {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
