#!/usr/bin/env python3
"""Does `tpu-bench` report what a plain hand-timed loop measures? Target: within 5 %.

In one run, interleaved in rounds (the machine is shared and noisy, so only
ratios of figures taken side by side mean anything):
  - this script times the same jitted GEMM and the same copy itself: a plain
    loop of calls, each followed by `block_until_ready` and timed on its own;
    the rate of the median call (what tpu-bench reports), and total work over
    total time of the loop for reference;
  - `tpu-bench matmul` and `tpu-bench memory --op copy` measure the same
    programs (same size, dtype and byte count) and report their medians.
Each round runs the hand loop, then tpu-bench; the figure is the median over
rounds of the ratio within a round.

    python benchmarks/bench_accuracy.py [--rounds 5] [--size 1024] [--copy-bytes 64M] [--platform cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _tpu_bench(*args: str) -> dict:
    script = Path(sys.executable).parent / "tpu-bench"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tpu_tools", "bench"]
    result = subprocess.run([*command, *args, "--json", "-"], capture_output=True, text=True, check=True)
    (case,) = json.loads(result.stdout)["results"]
    return case


def main() -> int:
    from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax
    from tpu_tools.render.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=1024, help="GEMM size N (N x N x N, float32)")
    parser.add_argument("--copy-bytes", default="64M", help="bytes per array of the copy")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement, both sides")
    parser.add_argument("--platform", default="cpu")
    args = parser.parse_args()
    copy_bytes = parse_size(args.copy_bytes)

    jax = import_jax(RuntimePolicy(platform=args.platform))
    jnp = jax.numpy
    device = jax.local_devices()[0]
    n = args.size
    a = jax.device_put(jax.random.normal(jax.random.key(1), (n, n), jnp.float32), device)
    b = jax.device_put(jax.random.normal(jax.random.key(2), (n, n), jnp.float32), device)
    gemm = jax.jit(lambda x, y: jnp.matmul(x, y)).lower(a, b).compile()
    x = jax.device_put(jax.random.normal(jax.random.key(3), (copy_bytes // 4,), jnp.float32), device)
    copy = jax.jit(lambda v: v.copy()).lower(x).compile()

    def hand_rates(call, work: float) -> tuple[float, float]:
        """(rate of the median call, rate over the whole loop)."""
        for _ in range(3):
            call()
        seconds: list[float] = []
        while sum(seconds) < args.min_time or len(seconds) < 3:
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
        return work / statistics.median(seconds), work * len(seconds) / sum(seconds)

    common = ("--platform", args.platform, "--min-time", str(args.min_time), "--warmup", "3")
    rounds: dict[str, list[tuple[float, float, float]]] = {"gemm": [], "copy": []}  # (tool, hand median, loop)
    for _ in range(args.rounds):
        median_rate, loop_rate = hand_rates(lambda: gemm(a, b).block_until_ready(), 2 * n ** 3)
        tool = _tpu_bench("matmul", "--size", str(n), "--dtype", "f32", *common)["stats"]["throughput_tflops"]
        rounds["gemm"].append((tool["median"], median_rate / 1e12, loop_rate / 1e12))
        median_rate, loop_rate = hand_rates(lambda: copy(x).block_until_ready(), 2 * copy_bytes)
        tool = _tpu_bench("memory", "--size", str(copy_bytes), "--op", "copy", *common)["stats"]["bandwidth_gbps"]
        rounds["copy"].append((tool["median"], median_rate / 1e9, loop_rate / 1e9))

    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device {device.device_kind} ({device.platform}), {args.rounds} rounds, median of rounds")
    failed = False
    for key, label, unit in (("gemm", f"f32 GEMM {n}x{n}x{n}", "TFLOP/s"),
                             ("copy", f"copy of {args.copy_bytes} (read + write)", "GB/s")):
        tool, hand, loop = (statistics.median(r[i] for r in rounds[key]) for i in range(3))
        ratio = statistics.median(r[0] / r[1] for r in rounds[key])
        ok = abs(ratio - 1) <= 0.05
        failed |= not ok
        print(f"{label}: tpu-bench {tool:.4g} {unit} / hand-timed loop {hand:.4g} {unit} = {ratio:.3f} "
              f"(median of per-round ratios; target 0.95..1.05) {'ok' if ok else 'OUT OF TARGET'}")
        print(f"    hand loop as total work / total time: {loop:.4g} {unit}")
        print("    rounds (tpu-bench / hand median): "
              + ", ".join(f"{r[0]:.4g}/{r[1]:.4g}" for r in rounds[key]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
