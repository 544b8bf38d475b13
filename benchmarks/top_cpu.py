#!/usr/bin/env python3
"""tpu-top's own CPU cost at the default 1 s refresh, in a real terminal, next to real agent jobs.

Starts two JAX jobs with the agent, runs `tpu-top --interval 1` in a tmux pane
(80x24, then 200x60), lets it settle, then reads its CPU time (user + system,
its threads included) over a measured window and divides by the wall time:
the percentage of one core it uses. Target: < 2 %. It also reads libtpu's
metrics service every refresh: at localhost:8431, where nothing listens
here, or with --libtpu, the fixture service of the tests (a v5e host's
figures, `tests/libtpu_server.py`) answering on a free port.

    python benchmarks/top_cpu.py [--seconds 30] [--libtpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
from harness import script

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per terminal size (30)")
    parser.add_argument("--libtpu", action="store_true",
                        help="with the tests' fixture libtpu metrics service answering (--metrics-addr)")
    args = parser.parse_args()
    if not shutil.which("tmux"):
        print("tmux is not installed")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="ttbench", dir="/tmp"))
    rundir = workdir / "run"
    rundir.mkdir(mode=0o700)
    (workdir / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir))
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
    lifetime = str(2 * (args.seconds + 10) + 30)
    jobs = [subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", "--tag", f"tpubench{i}",
                              str(workdir / "job.py"), lifetime], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for i in range(2)]
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    failed = False
    try:
        time.sleep(5.0)
        for width, height in ((80, 24), (200, 60)):
            percent = measure(width, height, args.seconds, env, top, expect)
            verdict = "ok" if percent < 2.0 else "OVER TARGET"
            failed |= percent >= 2.0
            print(f"tpu-top --interval 1 at {width}x{height} with 2 agent jobs"
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
