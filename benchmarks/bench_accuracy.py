#!/usr/bin/env python3
"""Does `tpu-bench` report what a plain hand-timed loop measures? Target: within 5 %.

In one run, interleaved in rounds (the machine is shared and noisy, so only
ratios of figures taken side by side mean anything):
  - this script times the same jitted GEMM and the same copy itself: a plain
    loop of calls, each followed by `block_until_ready` and timed on its own;
    the rate of the median call (what tpu-bench reports), and total work over
    total time of the loop for reference;
  - tpu-bench's matmul and memory (copy) benchmarks measure the same programs
    (same size, dtype and byte count) and report their medians: in this
    process through the runner behind `tpu-bench` (the command only renders
    what it returns), so that the two sides can alternate every fraction of a
    second; `--cli` runs the `tpu-bench` program instead (seconds apart).
Each round runs the hand loop, then tpu-bench; the figure is the median over
rounds of the ratio within a round.

    python benchmarks/bench_accuracy.py [--rounds 15] [--size 1024] [--copy-bytes 64M] [--min-time 0.3] [--cli]
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

from harness import script

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _tpu_bench_program(benchmark: str, options: dict, args: argparse.Namespace) -> dict:
    """The `tpu-bench` program's JSON result for one case."""
    command = script("tpu-bench")
    flags = {"shapes": "--size", "dtypes": "--dtype", "sizes": "--size", "operations": "--op"}
    words = [word for key, values in options.items() for word in (flags[key], ",".join(map(str, values)))]
    result = subprocess.run([*command, benchmark, *words, "--platform", args.platform, "--min-time",
                             str(args.min_time), "--warmup", "3", "--json", "-"],
                            capture_output=True, text=True, check=True)
    (case,) = json.loads(result.stdout)["results"]
    return case


def _tpu_bench_runner(benchmark: str, options: dict, args: argparse.Namespace) -> dict:
    """The same result from tpu-bench's runner, in this process."""
    from tpu_tools.bench.matmul import Shape
    from tpu_tools.bench.runner import RunRequest, run_benchmarks
    from tpu_tools.bench.suites import selection
    from tpu_tools.bench.timing import TimingSettings
    from tpu_tools.pjrt.runtime import RuntimePolicy

    if "shapes" in options:
        options = {**options, "shapes": tuple(Shape(n, n, n) for n in options["shapes"])}
    request = RunRequest([selection(benchmark, "quick", options)], RuntimePolicy(platform=args.platform), 600,
                         TimingSettings(min_time_s=args.min_time, warmup=3))
    (case,) = run_benchmarks(request).results
    return case.to_dict()


def main() -> int:
    from tpu_tools.parsing import parse_size
    from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--size", type=int, default=1024, help="GEMM size N (N x N x N, float32)")
    parser.add_argument("--copy-bytes", default="64M", help="bytes per array of the copy")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement, both sides")
    parser.add_argument("--platform", default="cpu")
    parser.add_argument("--cli", action="store_true", help="run the tpu-bench program instead of its runner")
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

    tpu_bench = _tpu_bench_program if args.cli else _tpu_bench_runner
    rounds: dict[str, list[tuple[float, float, float]]] = {"gemm": [], "copy": []}  # (tool, hand median, loop)
    for _ in range(args.rounds):
        median_rate, loop_rate = hand_rates(lambda: gemm(a, b).block_until_ready(), 2 * n ** 3)
        tool = tpu_bench("matmul", {"shapes": (n,), "dtypes": ("f32",)}, args)["stats"]["throughput_tflops"]
        rounds["gemm"].append((tool["median"], median_rate / 1e12, loop_rate / 1e12))
        median_rate, loop_rate = hand_rates(lambda: copy(x).block_until_ready(), 2 * copy_bytes)
        tool = tpu_bench("memory", {"sizes": (copy_bytes,), "operations": ("copy",)}, args)["stats"]["bandwidth_gbps"]
        rounds["copy"].append((tool["median"], median_rate / 1e9, loop_rate / 1e9))

    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device {device.device_kind} ({device.platform}), {args.rounds} rounds, tpu-bench "
          f"{'program' if args.cli else 'runner in this process'}")
    failed = False
    for key, label, unit in (("gemm", f"f32 GEMM {n}x{n}x{n}", "TFLOP/s"),
                             ("copy", f"copy of {args.copy_bytes} (read + write)", "GB/s")):
        tool, hand, loop = (statistics.median(r[i] for r in rounds[key]) for i in range(3))
        ratio = statistics.median(r[0] / r[1] for r in rounds[key])
        ok = abs(ratio - 1) <= 0.05
        failed |= not ok
        print(f"{label}: tpu-bench / hand-timed loop = {ratio:.3f} (median of the rounds' ratios; target "
              f"0.95..1.05) {'ok' if ok else 'OUT OF TARGET'}")
        print(f"    medians over the rounds: tpu-bench {tool:.4g} {unit}, hand loop {hand:.4g} {unit}")
        print(f"    hand loop as total work / total time: {loop:.4g} {unit}")
        print("    rounds (tpu-bench / hand median): "
              + ", ".join(f"{r[0]:.4g}/{r[1]:.4g}" for r in rounds[key]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
