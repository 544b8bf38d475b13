#!/usr/bin/env python3
"""How long the exporter takes to answer a scrape on a busy node: 8 TPU chips (or GPUs) and 20 agent jobs.

Builds the node as the tests do: a v5e sysroot (8 chips held by a process), the fixture libtpu metrics
service (tests/libtpu_server.py) and 20 light jobs running the agent, then starts
`tpu-monitor --prometheus PORT -q` and times GET /metrics (connection included) many times.
With --gpus N the node is an NVIDIA host with N GPUs instead, read through the stand-in libnvidia-ml.so.1
(tests/fake_nvml, built with gcc), every job a process on one of them; --xid-storm RATE has its driver send
XID events without end. Target: under 100 ms.

    python benchmarks/exporter_scrape.py [--jobs 20] [--scrapes 200] [--gpus 8 [--xid-storm 10000]]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import sysroot  # noqa: E402
from agentjobs import agent_env, make_rundir, remove_rundir, start_job  # noqa: E402
from harness import script  # noqa: E402
from libtpu_server import FakeMetricsService, v5e_host  # noqa: E402
from promstack import free_port  # noqa: E402


def _fake_nvml(root: Path) -> Path:
    """The stand-in libnvidia-ml.so.1, built as tests/fakenvml.py builds it, in a directory next to `root`."""
    directory = root.parent / (root.name + "-nvml")
    directory.mkdir(exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                    str(directory / "libnvidia-ml.so.1"), str(REPO / "tests" / "fake_nvml" / "fake_nvml.c")],
                   check=True)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=0, help="an NVIDIA host with this many GPUs (1 to 8)")
    parser.add_argument("--xid-storm", type=int, default=0, metavar="RATE",
                        help="with --gpus: the driver sends this many XID events a second the whole time")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="scrape"))
    service = None
    if args.gpus:
        sysroot.nvidia_host(root, count=args.gpus)
    else:
        sysroot.v5e_host(root, holders={3001: list(range(8))})
        service = FakeMetricsService(v5e_host()).start()
    rundir = make_rundir()
    jobs = [start_job(rundir, light=True, tag=f"job{i}", lifetime_s=600) for i in range(args.jobs)]
    exporter = None
    try:
        for job in jobs:
            job.wait_ready()
        port = free_port()
        command = [*script("tpu-monitor"), "--prometheus", f"127.0.0.1:{port}", "-q", "--period", "1s"]
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(root))
        if service is not None:
            command += ["--metrics-addr", service.address]
        else:
            env.pop("TPU_TOOLS_NVML", None)
            processes = ";".join(f"{i % args.gpus}:{job.pid}:{(i + 1) << 30}" for i, job in enumerate(jobs))
            env.update(LD_LIBRARY_PATH=str(_fake_nvml(root)), FAKE_NVML_COUNT=str(args.gpus),
                       FAKE_NVML_PROCS=processes, FAKE_NVML_XID_STORM=str(args.xid_storm))
        exporter = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ready = ("tpu_tools_gpu_up{", args.gpus) if args.gpus else ("tpu_tools_libtpu_duty", 1)
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        while True:  # until the report has every job and the libtpu figures
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
                if text.count("tpu_tools_process_steps_total{") == args.jobs and text.count(ready[0]) >= ready[1]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the exporter did not report every job within 60 s")
            time.sleep(0.2)
        times = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            body = urllib.request.urlopen(url, timeout=5).read()
            times.append(time.perf_counter() - started)
            time.sleep(0.01)
        times.sort()
        lines = body.count(b"\n")
        node = f"{args.gpus} GPUs" if args.gpus else "8 chips"
        node += f", {args.xid_storm} XID events/s" if args.xid_storm else ""
        print(f"# {' '.join(command)}  ({node}, {args.jobs} agent jobs, {len(body)} bytes, {lines} lines)")
        print(f"scrape time over {args.scrapes} scrapes: median {statistics.median(times) * 1e3:.1f} ms, "
              f"p95 {times[int(0.95 * len(times))] * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms (target < 100 ms)")
    finally:
        if exporter is not None:
            exporter.terminate()
            exporter.wait(timeout=20)
        for job in jobs:
            job.stop()
        if service is not None:
            service.stop()
        remove_rundir(rundir)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root.parent / (root.name + "-nvml"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
