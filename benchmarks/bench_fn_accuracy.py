#!/usr/bin/env python3
"""Does `tpu-bench fn` report what a hand-timed loop of the same jitted function measures? (target: within 10 %)

A user's function (`tanh(a @ b)` in a module this script writes, f32 on the CPU platform and bf16 on an
accelerator, or --target/--arg of your own) is measured in rounds. Each round runs, each in a fresh process:
  - the hand loop: `jax.jit(function)` on random inputs of the same shapes, 3 warm-up calls, then samples of
    calls issued back to back with one block at the end (50 calls on an accelerator, about 50 ms of them on the
    CPU platform) for --min-time seconds, the rate of the median sample with XLA's FLOP count of the same
    compiled program; beside each sample one call blocked on its own, whose rate is shown too (on the CPU
    runtime the two differ: see benchmarks/README.md);
  - `tpu-bench fn TARGET --arg ... --json -`, its median GFLOP/s.
The order alternates round by round (hand first, then tpu-bench first), so that neither side always runs on a
machine the other has just warmed or loaded. The figure is the median over rounds of the ratio within a round.

    PYTHONPATH=. python benchmarks/bench_fn_accuracy.py [--rounds 8] [--size N] [--platform cpu] [--min-time 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import script

REPO = Path(__file__).resolve().parent.parent

USER_MODULE = """
import jax.numpy as jnp


def gemm(a, b):
    return jnp.tanh(a @ b)
"""

HAND_LOOP = r"""
import json, statistics, sys, time
sys.path.insert(0, ".")
from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax
from tpu_tools.userfn.specs import parse_arg_spec, random_arguments
from tpu_tools.userfn.target import resolve_target
platform, target, specs, min_time = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
jax = import_jax(RuntimePolicy(platform=platform))
device = jax.local_devices()[0]
arguments = random_arguments(jax, [parse_arg_spec(s) for s in specs], jax.random.key(7), device)
compiled = jax.jit(resolve_target(target)).lower(*arguments).compile()
cost = compiled.cost_analysis()
cost = cost[0] if isinstance(cost, (list, tuple)) else cost
flops = float(cost["flops"])
def loop(calls):
    start = time.perf_counter()
    for _ in range(calls):
        out = compiled(*arguments)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls
for _ in range(3):
    jax.block_until_ready(compiled(*arguments))
single = statistics.median(loop(1) for _ in range(3))
calls = 50 if device.platform != "cpu" else max(1, round(0.05 / single))  # CPU: samples of about 50 ms
back_to_back, blocked = [], []  # seconds per call, in alternating samples
spent = 0.0
while spent < min_time or len(back_to_back) < 5:
    back_to_back.append(loop(calls))
    blocked.append(loop(1))
    spent += back_to_back[-1] * calls + blocked[-1]
print(json.dumps({"gflops": flops / statistics.median(back_to_back) / 1e9,
                  "blocked_gflops": flops / statistics.median(blocked) / 1e9, "calls": calls,
                  "device": device.device_kind, "platform": device.platform}))
"""


def hand(args: argparse.Namespace, workdir: str, specs: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", HAND_LOOP, args.platform, args.target, json.dumps(specs),
                            str(args.min_time)], capture_output=True, text=True, cwd=workdir, env=env, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def tool(args: argparse.Namespace, workdir: str, specs: list[str]) -> dict:
    words = [word for spec in specs for word in ("--arg", spec)]
    child = subprocess.run([*script("tpu-bench"), "fn", args.target, *words, "--platform", args.platform,
                            "--min-time", str(args.min_time), "--json", "-"], capture_output=True, text=True,
                           cwd=workdir, check=False)
    if child.returncode != 0:
        raise SystemExit(f"tpu-bench fn failed: {child.stderr.strip()}")
    (case,) = json.loads(child.stdout)["results"]
    return case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of both sides, order alternating")
    parser.add_argument("--size", type=int, default=None, help="N of the N x N GEMM (1024 on CPU, 8192 else)")
    parser.add_argument("--platform", default="cpu", help="cpu, cuda, tpu or auto")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds of samples per side and round")
    parser.add_argument("--target", default="fnaccuracy:gemm", help="MODULE:FUNCTION (default: the written GEMM)")
    parser.add_argument("--arg", action="append", default=None, help="argument specs of --target (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, "fnaccuracy.py").write_text(USER_MODULE)
        if args.arg:
            specs = args.arg
        else:
            n = args.size or (1024 if args.platform == "cpu" else 8192)
            dtype = "f32" if args.platform == "cpu" else "bf16"
            specs = [f"{dtype}[{n},{n}]"] * 2
        rounds = []  # (tool, hand, noisy)
        device = None
        for index in range(args.rounds):
            if index % 2 == 0:
                hand_figure = hand(args, workdir, specs)
                case = tool(args, workdir, specs)
            else:
                case = tool(args, workdir, specs)
                hand_figure = hand(args, workdir, specs)
            device = hand_figure["device"]
            rounds.append((case["stats"]["throughput_tflops"]["median"] * 1e3, hand_figure["gflops"],
                           bool(case["values"].get("noisy")), hand_figure["blocked_gflops"]))
    ratio = statistics.median(r[0] / r[1] for r in rounds)
    ok = abs(ratio - 1) <= 0.10
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device {device} ({args.platform}), {args.target} {' '.join(specs)}, {len(rounds)} rounds, each side "
          "a fresh process, order alternating")
    print(f"tpu-bench fn / hand-timed loop = {ratio:.3f} (median of the rounds' ratios; target 0.90..1.10) "
          f"{'ok' if ok else 'OUT OF TARGET'}")
    print(f"    medians over the rounds: tpu-bench fn {statistics.median(r[0] for r in rounds):.4g} GFLOP/s, "
          f"hand loop {statistics.median(r[1] for r in rounds):.4g} GFLOP/s")
    print(f"    one blocked call at a time (hand): {statistics.median(r[3] for r in rounds):.4g} GFLOP/s, "
          f"tpu-bench / that = {statistics.median(r[0] / r[3] for r in rounds):.3f}")
    print(f"    tpu-bench flagged the case noisy in {sum(r[2] for r in rounds)} of {len(rounds)} rounds")
    print("    rounds (tpu-bench / hand): " + ", ".join(f"{r[0]:.4g}/{r[1]:.4g}" for r in rounds))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
