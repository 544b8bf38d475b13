#!/usr/bin/env python3
"""tpu-top's own CPU cost at the default 1 s refresh, in a real terminal, next to real agent jobs,
and the memory its history takes after an hour.

Starts 20 jobs with the agent (two JAX jobs, the others light Python loops
that mark steps, so that 20 jobs fit on a small machine), runs
`tpu-top --interval 1` in a tmux pane (80x24, then 200x60) with its history
on (as always in the live view), lets it settle, then reads its CPU time
(user + system, its collector thread included) over a measured window and
divides by the wall time: the percentage of one core it uses. Target: < 2 %.
It also reads libtpu's metrics service every refresh: at localhost:8431,
where nothing listens here, or with --libtpu, the fixture service of the
tests (a v5e host's figures, `tests/libtpu_server.py`) answering on a free
port.

Then it feeds tpu-top's History an hour of simulated one-second samples
(8 devices, the same number of jobs, a tenth of them replaced every few
minutes) and reports the memory the history holds: bounded by the window,
not by how long tpu-top runs.

`--socket` runs the jobs with the snapshot file off (`TPU_TOOLS_SNAPSHOT_FILE=0`):
tpu-top then asks every agent on its socket, the design before the file; run
with and without it in turn to compare the two.

    python benchmarks/top_cpu.py [--seconds 30] [--jobs 20] [--libtpu] [--history-only] [--socket]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
from harness import private_workdir, script

LIGHT_JOB = textwrap.dedent("""
    import sys, time
    import tpu_tools.agent as agent
    agent.start(tag=sys.argv[2])
    deadline = time.time() + float(sys.argv[1])
    while time.time() < deadline:
        time.sleep(0.01)
        agent.step()
""")

JOB = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent
    f = jax.jit(lambda w, x: jnp.tanh(x @ w))
    w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
    deadline = time.time() + float(sys.argv[1])
    while time.time() < deadline:
        with agent.step_context():
            f(w, x).block_until_ready()
        time.sleep(0.01)
""")


def start_jobs(count: int, workdir: Path, env: dict[str, str], lifetime_s: float) -> list[subprocess.Popen[bytes]]:
    """`count` agent jobs running for `lifetime_s` (two of them JAX jobs, the others light loops), from `workdir`."""
    (workdir / "job.py").write_text(JOB)
    (workdir / "light.py").write_text(LIGHT_JOB)
    heavy = min(2, count)
    jobs = [subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", "--tag", f"tpubench{i}",
                              str(workdir / "job.py"), str(lifetime_s)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for i in range(heavy)]
    jobs += [subprocess.Popen([sys.executable, str(workdir / "light.py"), str(lifetime_s), f"tpubench{i}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(heavy, count)]
    return jobs


def wait_for_agents(rundir: Path, count: int) -> None:
    """Until `count` agents have their sockets in `rundir` (at most two minutes), and a little longer: their first
    snapshots are published and the start-up is not what is measured."""
    deadline = time.monotonic() + 120
    while len(list(rundir.glob("agent-*.sock"))) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3.0)


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout


def measure(width: int, height: int, seconds: float, env: dict[str, str], top: str, expect: str) -> float:
    socket = f"ttbench-{uuid.uuid4().hex[:8]}"
    _tmux(socket, "new-session", "-d", "-s", "b", "-x", str(width), "-y", str(height),
          "-e", f"TPU_TOOLS_RUNTIME_DIR={env['TPU_TOOLS_RUNTIME_DIR']}", top)
    try:
        pane_pid = int(_tmux(socket, "display-message", "-p", "-t", "b", "#{pane_pid}").strip())
        time.sleep(3.0)  # start-up (imports, first report) is not the steady cost
        process = psutil.Process(pane_pid)
        if "tpu-top" not in " ".join(process.cmdline()):  # a shell in between: measure its tpu-top child
            process = next(p for p in process.children(recursive=True) if "tpu-top" in " ".join(p.cmdline()))
        start_cpu = sum(process.cpu_times()[:2])
        start = time.monotonic()
        time.sleep(seconds)
        used = sum(process.cpu_times()[:2]) - start_cpu
        elapsed = time.monotonic() - start
        screen = _tmux(socket, "capture-pane", "-p", "-t", "b")
        if "tpubench" not in screen or expect not in screen:
            raise SystemExit(f"tpu-top did not show the jobs and {expect!r}:\n{screen}")
        return 100.0 * used / elapsed
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)


def history_memory(jobs: int, devices: int = 8, hours: float = 1.0) -> tuple[int, int, int]:
    """(ring bytes, bytes allocated by the history as Python sees them, samples) after `hours` of 1 s samples."""
    import tracemalloc

    from harness import monitor_report

    from tpu_tools.top.history import History
    from tpu_tools.top.model import rows_from_report

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    history = History(interval_s=1.0)
    samples = int(hours * 3600)
    for n in range(samples):
        generation = n // 300  # every five minutes a tenth of the jobs are new processes
        pids = [10_000 + i + (generation * 1000 if i < max(1, jobs // 10) else 0) for i in range(jobs)]
        report = monitor_report({
            "hostname": "bench", "sequence": n, "time_unix_s": float(n),
            "devices": {"devices": [{"key": f"tpu:{d}", "utilization_percent": float((n + d) % 100),
                                     "memory_used_bytes": (n % 16) << 30, "memory_total_bytes": 16 << 30}
                                    for d in range(devices)]},
            "processes": {"holders": [], "agents": [
                {"pid": pid, "tag": f"job{pid}", "cpu_percent": 12.5, "rss_bytes": 1 << 30,
                 "device_memory_used_bytes": 1 << 30, "steps": {"steps_per_second": 10.0 + n % 7,
                                                                 "last_step_time_s": 0.1}, "compiles": {}}
                for pid in pids]},
        })
        history.record(report, rows_from_report(report))
    after = tracemalloc.take_snapshot()
    allocated = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                    if "tpu_tools/top/history.py" in stat.traceback[0].filename)
    tracemalloc.stop()
    return history.nbytes(), allocated, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per terminal size (30)")
    parser.add_argument("--jobs", type=int, default=20, help="agent jobs running (20; two of them JAX jobs)")
    parser.add_argument("--libtpu", action="store_true",
                        help="with the tests' fixture libtpu metrics service answering (--metrics-addr)")
    parser.add_argument("--history-only", action="store_true", help="only the history memory figure")
    parser.add_argument("--socket", action="store_true",
                        help="the jobs' agents publish no snapshot file: tpu-top asks each on its socket, as before "
                             "the file (TPU_TOOLS_SNAPSHOT_FILE=0)")
    args = parser.parse_args()
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    rings, allocated, samples = history_memory(args.jobs)
    print(f"tpu-top history after {samples / 3600:g} h of 1 s samples, 8 devices and {args.jobs} jobs (a tenth "
          f"replaced every 5 min): {rings / 2**20:.2f} MiB of samples, {allocated / 2**20:.2f} MiB allocated in all",
          flush=True)
    if args.history_only:
        return 0
    if not shutil.which("tmux"):
        print("tmux is not installed")
        return 2
    workdir, rundir = private_workdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir),
               TPU_TOOLS_SNAPSHOT_FILE="0" if args.socket else "1")
    top = " ".join([*script("tpu-top"), "--interval", "1"])
    service = None
    expect = "libtpu: no metrics service"
    if args.libtpu:
        server = Path(__file__).resolve().parent.parent / "tests" / "libtpu_server.py"
        service = subprocess.Popen([sys.executable, str(server), "v5e", "--seconds", str(4 * args.seconds + 60)],
                                   stdout=subprocess.PIPE, text=True)
        address = service.stdout.readline().strip()
        top += f" --metrics-addr {address}"
        expect = f"libtpu {address}"
    jobs = start_jobs(args.jobs, workdir, env, 2 * (args.seconds + 10) + 60)
    failed = False
    try:
        wait_for_agents(rundir, args.jobs)
        for width, height in ((80, 24), (200, 60)):
            percent = measure(width, height, args.seconds, env, top, expect)
            verdict = "ok" if percent < 2.0 else "OVER TARGET"
            failed |= percent >= 2.0
            print(f"tpu-top --interval 1 at {width}x{height} with {args.jobs} agent jobs and history"
                  f"{', a libtpu service answering' if service else ''}: {percent:.2f}% of one core "
                  f"over {args.seconds:g} s (target < 2%) {verdict}", flush=True)
    finally:
        if service is not None:
            service.kill()
            service.wait(timeout=30)
        for job in jobs:
            job.kill()
            job.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
