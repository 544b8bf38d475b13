#!/usr/bin/env python3
"""GPU truth on a real NVIDIA GPU: tpu-tools beside nvidia-smi while a JAX job holds and works the GPU.

Runs from a source tree without installing anything (needs jax with a CUDA plugin, nvidia-ml-py and
the runtime dependencies):

    PYTHONPATH=. python3 benchmarks/gpu_truth.py [--job-seconds 60] [--runs 11] [--fraction 0.75] [--size 8192]

1. Starts a JAX job that preallocates XLA_PYTHON_CLIENT_MEM_FRACTION of the GPU and runs bf16 matmuls
   for --job-seconds.
2. Prints, one after the other: nvidia-smi --query-gpu=..., tpu-ls, tpu-ls --json, tpu-top --once and
   tpu-monitor --count 1, and compares memory used (must agree within 1 %), utilization, temperature
   and power with nvidia-smi's.
3. Watches NVML's process list while each tpu-tools command runs: a new process there is a CUDA
   context the command created (tpu-ls must create none).
4. Times tpu-ls against a bare nvidia-ml-py script querying the same fields, nvidia-smi,
   nvidia-smi -L and python -c pass (medians of --runs interleaved runs). Targets: tpu-ls < 0.5 s and
   <= 2.5x the bare script.
Exit status: 0 when every check passes, 3 when one fails, 1 when the host has no usable GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUERY = "memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw"

JOB = r"""
import sys, time
import jax, jax.numpy as jnp
seconds, size = float(sys.argv[1]), int(sys.argv[2])
a = jnp.ones((size, size), jnp.bfloat16)
step = jax.jit(lambda x: (x @ x) * 0.5)
a = step(a); a.block_until_ready()
print("ready", flush=True)
end = time.time() + seconds
while time.time() < end:
    for _ in range(20):
        a = step(a)
    a.block_until_ready()
"""

# The same fields tpu-ls shows, read with nothing but nvidia-ml-py: what tpu-ls is timed against.
BARE = r"""
import pynvml as n
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    n.nvmlDeviceGetName(h); n.nvmlDeviceGetUUID(h); n.nvmlDeviceGetPciInfo(h)
    n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2); n.nvmlDeviceGetUtilizationRates(h)
    n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU); n.nvmlDeviceGetPowerUsage(h)
    n.nvmlDeviceGetEnforcedPowerLimit(h); n.nvmlDeviceGetComputeRunningProcesses(h)
n.nvmlShutdown()
"""


def tool(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpu_tools", *args]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in ("TPU_TOOLS_NVML", "CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "TPU_TOOLS_SYSROOT"):
        env.pop(name, None)
    return env


class ProcessWatch:
    """Polls NVML's compute process list (every GPU) in a thread; `new` are PIDs that were not there before."""

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.before = self._pids()
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _pids(self) -> set[int]:
        n = self.nvml
        pids = set()
        for i in range(n.nvmlDeviceGetCount()):
            handle = n.nvmlDeviceGetHandleByIndex(i)
            pids.update(p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(handle))
        return pids

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.seen |= self._pids()
            time.sleep(0.01)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def new(self) -> set[int]:
        return self.seen - self.before


def run(command: list[str], env: dict[str, str], title: str) -> tuple[str, set[int]]:
    print(f"\n$ {' '.join(command[2:]) if command[:2] == [sys.executable, '-m'] else ' '.join(command)}  # {title}")
    with ProcessWatch() as watch:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    print(done.stdout.rstrip())
    if done.stderr.strip():
        print("stderr: " + done.stderr.strip())
    if done.returncode != 0:
        print(f"exit status {done.returncode}")
    return done.stdout, watch.new


def smi_figures(env: dict[str, str]) -> list[dict[str, float]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, env=env, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        used, total, util, temp, power = (float(v) for v in line.split(","))
        rows.append({"used_mib": used, "total_mib": total, "util": util, "temp": temp, "power": power})
    return rows


def median_time(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--fraction", default="0.75", help="XLA_PYTHON_CLIENT_MEM_FRACTION of the job")
    parser.add_argument("--size", type=int, default=8192, help="side of the job's bf16 matrices")
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi is not installed: this benchmark needs an NVIDIA GPU host", file=sys.stderr)
        return 1
    env = environment()
    failures: list[str] = []

    job_env = {**env, "XLA_PYTHON_CLIENT_MEM_FRACTION": args.fraction, "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    job = subprocess.Popen([sys.executable, "-c", JOB, str(args.job_seconds), str(args.size)], env=job_env,
                           stdout=subprocess.PIPE, text=True)
    try:
        if job.stdout is None or job.stdout.readline().strip() != "ready":
            print("the JAX job did not start on the GPU", file=sys.stderr)
            return 1
        time.sleep(3)  # let utilization and power settle
        print(f"JAX job pid {job.pid}, holding XLA_PYTHON_CLIENT_MEM_FRACTION={args.fraction} of the GPU, busy")
        print(f"\n$ nvidia-smi --query-gpu={QUERY} --format=csv")
        print(subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"], capture_output=True,
                             text=True, env=env).stdout.rstrip())
        smi = smi_figures(env)
        _, new = run(tool("ls"), env, "tpu-ls")
        if new:
            failures.append(f"tpu-ls created a CUDA context: new NVML processes {sorted(new)}")
        print(f"NVML processes that appeared while tpu-ls ran: {sorted(new) or 'none'}")
        text, _ = run(tool("ls", "--json"), env, "tpu-ls --json")
        document = json.loads(text)
        smi_after = smi_figures(env)
        _, new = run(tool("top", "--once"), env, "tpu-top --once")
        if new:
            failures.append(f"tpu-top created a CUDA context: {sorted(new)}")
        text, new = run(tool("monitor", "--count", "1"), env, "tpu-monitor --count 1")
        if new:
            failures.append(f"tpu-monitor created a CUDA context: {sorted(new)}")

        print("\n# tpu-ls --json against nvidia-smi (taken just before and after it)")
        gpus = (document.get("nvml") or {}).get("gpus") or []
        if len(gpus) != len(smi):
            failures.append(f"tpu-ls lists {len(gpus)} GPUs through NVML, nvidia-smi {len(smi)}")
        for gpu, before, after in zip(gpus, smi, smi_after, strict=False):
            used = (gpu.get("memory_used_bytes") or 0) / 2**20
            total = (gpu.get("memory_total_bytes") or 0) / 2**20
            reference = (before["used_mib"] + after["used_mib"]) / 2
            drift = abs(used - reference) / reference if reference else abs(used)
            print(f"GPU {gpu['index']}: memory used {used:.0f} / {total:.0f} MiB (nvidia-smi {before['used_mib']:.0f}"
                  f"..{after['used_mib']:.0f} / {before['total_mib']:.0f}) {drift:.2%} apart; "
                  f"util {gpu.get('utilization_gpu_percent')} % (nvidia-smi {before['util']:.0f}..{after['util']:.0f});"
                  f" temp {gpu.get('temperature_celsius')} C ({before['temp']:.0f}..{after['temp']:.0f}); "
                  f"power {gpu.get('power_draw_watts')} W ({before['power']:.0f}..{after['power']:.0f})")
            if drift > 0.01:
                failures.append(f"GPU {gpu['index']}: memory used differs from nvidia-smi by {drift:.2%} (> 1 %)")
            if abs(total - before["total_mib"]) > 1:
                failures.append(f"GPU {gpu['index']}: memory total {total:.0f} MiB, nvidia-smi {before['total_mib']}")
            pids = {p["pid"] for p in gpu.get("processes") or []}
            print(f"  processes: {sorted(pids)} (the job is {job.pid})")

        commands = {
            "tpu-ls": tool("ls"),
            "bare nvidia-ml-py script": [sys.executable, "-c", BARE],
            "nvidia-smi": ["nvidia-smi"],
            "nvidia-smi -L": ["nvidia-smi", "-L"],
            "python -c pass": [sys.executable, "-c", "pass"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved, so drift on the host hits every command alike
            for name, command in commands.items():
                times[name].append(median_time(command, env))
        medians = {name: statistics.median(values) for name, values in times.items()}
        print(f"\n# wall time, median of {args.runs} interleaved runs (python {sys.executable}, GPU busy)")
        for name, value in medians.items():
            print(f"{name:26s} {value:.3f} s")
        ratio = medians["tpu-ls"] / medians["bare nvidia-ml-py script"]
        print(f"tpu-ls / bare script: {ratio:.2f}x (target <= 2.5x); tpu-ls {medians['tpu-ls']:.3f} s (target < 0.5 s)")
        if ratio > 2.5:
            failures.append(f"tpu-ls takes {ratio:.2f}x the bare nvidia-ml-py script (target <= 2.5x)")
        if medians["tpu-ls"] >= 0.5:
            failures.append(f"tpu-ls takes {medians['tpu-ls']:.3f} s (target < 0.5 s)")
        print(f"command: PYTHONPATH=. python3 benchmarks/gpu_truth.py --job-seconds {args.job_seconds:g} "
              f"--runs {args.runs} --fraction {args.fraction} --size {args.size}")
    finally:
        job.kill()
        job.wait()
    print("\n" + ("\n".join(f"FAIL: {f}" for f in failures) if failures else "PASS: every check"))
    return 3 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
