#!/usr/bin/env python3
"""What a snapshot costs a job that holds many live arrays, asked 10 times a second.

The agent's snapshot counts the bytes and arrays on each device by walking every live array. A real model's
parameters and optimizer state are thousands of arrays, where the other benchmarks' jobs hold a handful. For
each count N, a job on the CPU platform (2 devices) holds N small arrays, half on one device and half sharded
over both, starts the agent and makes its snapshot 10 times a second, as a `tpu-monitor --period 0.1` polling
it would have it made, timing each with the thread's CPU clock. Reported per N: the CPU of a snapshot (median,
and the mean, which carries the walks that are not done every time); what the mean costs beyond that of the
first, smallest job, as a share of one core at 10 requests/s (target <= 0.25 %: the agent walks a job's arrays
again only once that keeps the walks within 0.25 % of a core, and at most once a second); and how old the
snapshots' live-array tally was (`runtime.live_arrays_age_s`). The rest of a request (waking, accepting,
sending) is `benchmarks/agent_overhead.py`'s.

    python benchmarks/agent_live_arrays.py [--arrays 100,1000,5000,20000] [--requests 100]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

JOB = textwrap.dedent("""
    import json, statistics, sys, time
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent
    n, requests = int(sys.argv[1]), int(sys.argv[2])
    mesh = jax.sharding.Mesh(jax.devices(), ("d",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    kept = [jnp.full((16,), i, dtype=jnp.float32) for i in range(n - n // 2)]
    kept += [jax.device_put(jnp.zeros((8, 4)), split) for _ in range(n // 2)]
    jax.block_until_ready(kept)
    agent.start(tag="arrays")
    for _ in range(3):  # the first snapshots import what a snapshot needs
        agent._agent.answer("snapshot")
    cpu, ages = [], []
    next_request = time.monotonic()
    for _ in range(requests):
        started = time.thread_time()
        snapshot = agent._agent.answer("snapshot")
        cpu.append(time.thread_time() - started)
        ages.append(snapshot["runtime"].get("live_arrays_age_s") or 0.0)
        next_request += 0.1
        time.sleep(max(0.0, next_request - time.monotonic()))
    agent.stop()
    print(json.dumps({"cpu_s": cpu, "ages_s": ages}))
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", default="100,1000,5000,20000", help="live array counts (100,1000,5000,20000)")
    parser.add_argument("--requests", type=int, default=100, help="snapshots per count, 10 a second (100)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ttarrays", dir="/tmp"))
    (workdir / "run").mkdir(mode=0o700)
    (workdir / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
               TPU_TOOLS_RUNTIME_DIR=str(workdir / "run"))
    print(f"$ python benchmarks/agent_live_arrays.py --arrays {args.arrays} --requests {args.requests}")
    reference, worst = None, 0.0
    try:
        for count in (int(text) for text in args.arrays.split(",")):
            result = subprocess.run([sys.executable, str(workdir / "job.py"), str(count), str(args.requests)],
                                    env=env, capture_output=True, text=True, check=True, timeout=600)
            document = json.loads(result.stdout.splitlines()[-1])
            cpu, ages = sorted(document["cpu_s"]), sorted(document["ages_s"])
            mean = sum(cpu) / len(cpu)
            reference = mean if reference is None else reference
            extra = (mean - reference) * 10 * 100  # % of one core at 10 requests/s
            worst = max(worst, extra)
            print(f"{count:>6} live arrays: a snapshot {cpu[len(cpu) // 2] * 1e3:.2f} ms of CPU (median), "
                  f"{mean * 1e3:.2f} ms (mean), {extra:+.2f}% of one core at 10 requests/s beyond the first; "
                  f"tally age median {ages[len(ages) // 2]:.2f} s, oldest {ages[-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"most beyond the first: {worst:.2f}% of one core (target <= 0.25%) "
          f"{'ok' if worst <= 0.25 else 'OVER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
