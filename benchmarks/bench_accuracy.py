#!/usr/bin/env python3
"""Does `tpu-bench` report what a plain hand-timed loop measures? Side by side, in one run.

On the CPU platform (target: within 5 %), interleaved in rounds (the machine is
shared and noisy, so only ratios of figures taken side by side mean anything):
  - this script times the same jitted GEMM and the same copy itself: a plain
    loop of calls, each followed by `block_until_ready` and timed on its own
    (the per-call method tpu-bench used before it timed calls back to back);
    the rate of the median call, and total work over total time of the loop;
  - tpu-bench's matmul and memory (copy) benchmarks measure the same programs
    (same size, dtype and byte count) and report their medians: in this
    process through the runner behind `tpu-bench` (the command only renders
    what it returns), so that the two sides alternate every fraction of a
    second; `--cli` runs the `tpu-bench` program instead (seconds apart).
Each round runs the hand loop and tpu-bench, the hand loop first in even rounds
and tpu-bench first in odd ones; the figure is the median over rounds of the
ratio within a round. A ratio above 1 by more than the noise
would mean the back-to-back calls overlapped.

On a GPU or TPU, one table: tpu-bench beside a hand-timed back-to-back JAX loop
(50 calls issued, one block at the end) and, where PyTorch is installed beside
jax on a CUDA GPU, `torch.matmul` and `Tensor.copy_` timed the same way (in a
child process, before this process opens the device): bf16 and f16 GEMM 8192,
bf16 GEMM 4096, copy of 1 GiB, with the ratios and the targets (GEMM within 3 %
of the hand loop and at least 95 % of PyTorch; copy within 3 % of the hand loop
and at least 85 % of the datasheet peak). Then tpu-bench alone for f32 (with
what it ran as), fp8 and int8 with their % of peak. Runs in about 2 minutes.

    PYTHONPATH=. python benchmarks/bench_accuracy.py [--rounds N] [--min-time 0.3] [--platform auto] [--cli]
"""

from __future__ import annotations

import argparse
import functools
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

GIB = 1 << 30


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


def in_turn(round_index: int, hand, tool) -> tuple:
    """(hand(), tool()), the hand loop first in even rounds and tpu-bench first in odd ones: on a GPU whose
    clocks fall as it heats, the side that always runs second in a round reads low (the order effect measured
    on the H100, benchmarks/README.md)."""
    if round_index % 2 == 0:
        first = hand()
        return first, tool()
    second = tool()
    return hand(), second


def cpu_main(args: argparse.Namespace, jax) -> int:
    from tpu_tools.parsing import parse_size

    jnp = jax.numpy
    copy_bytes = parse_size(args.copy_bytes or "64M")
    device = jax.local_devices()[0]
    n = args.size or 1024
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
    noisy: dict[str, int] = {"gemm": 0, "copy": 0}
    for index in range(args.rounds or 15):
        (median_rate, loop_rate), case = in_turn(
            index, lambda: hand_rates(lambda: gemm(a, b).block_until_ready(), 2 * n ** 3),
            lambda: tpu_bench("matmul", {"shapes": (n,), "dtypes": ("f32",)}, args))
        rounds["gemm"].append((case["stats"]["throughput_tflops"]["median"], median_rate / 1e12, loop_rate / 1e12))
        noisy["gemm"] += bool(case["values"].get("noisy"))
        (median_rate, loop_rate), case = in_turn(
            index, lambda: hand_rates(lambda: copy(x).block_until_ready(), 2 * copy_bytes),
            lambda: tpu_bench("memory", {"sizes": (copy_bytes,), "operations": ("copy",)}, args))
        rounds["copy"].append((case["stats"]["bandwidth_gbps"]["median"], median_rate / 1e9, loop_rate / 1e9))
        noisy["copy"] += bool(case["values"].get("noisy"))

    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device {device.device_kind} ({device.platform}), {len(rounds['gemm'])} rounds, tpu-bench "
          f"{'program' if args.cli else 'runner in this process'} (calls back to back), hand loop one call at "
          "a time")
    failed = False
    for key, label, unit in (("gemm", f"f32 GEMM {n}x{n}x{n}", "TFLOP/s"),
                             ("copy", f"copy of {copy_bytes >> 20} MiB (read + write)", "GB/s")):
        tool, hand, loop = (statistics.median(r[i] for r in rounds[key]) for i in range(3))
        ratio = statistics.median(r[0] / r[1] for r in rounds[key])
        ok = abs(ratio - 1) <= 0.05
        failed |= not ok
        print(f"{label}: tpu-bench / hand-timed loop = {ratio:.3f} (median of the rounds' ratios; target "
              f"0.95..1.05) {'ok' if ok else 'OUT OF TARGET'}")
        print(f"    medians over the rounds: tpu-bench {tool:.4g} {unit}, hand loop {hand:.4g} {unit}")
        print(f"    hand loop as total work / total time: {loop:.4g} {unit}")
        print(f"    tpu-bench flagged the case noisy in {noisy[key]} of {len(rounds[key])} rounds")
        print("    rounds (tpu-bench / hand median): "
              + ", ".join(f"{r[0]:.4g}/{r[1]:.4g}" for r in rounds[key]))
    return 1 if failed else 0


# --- accelerators ----------------------------------------------------------------------------------------

GEMMS = (("bf16", 8192), ("f16", 8192), ("bf16", 4096))
TOOL_ONLY = (("f32", 8192), ("fp8", 8192), ("int8", 8192))
BACK_TO_BACK_CALLS = 50

_TORCH_CHILD = r"""
import json, sys, time
import torch
gemms, copy_bytes, calls = json.loads(sys.argv[1])
def rate(fn, work):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rates.append(work * calls / (time.perf_counter() - start))
    return sorted(rates)[len(rates) // 2]
out = {"torch": torch.__version__}
for name, n in gemms:
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[name]
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    out[f"gemm {name} {n}"] = rate(lambda: torch.matmul(a, b), 2 * n ** 3)
    del a, b
x = torch.randn(copy_bytes // 4, device="cuda")
y = torch.empty_like(x)
out["copy"] = rate(lambda: y.copy_(x), 2 * copy_bytes)
print(json.dumps(out))
"""


def torch_figures(copy_bytes: int) -> dict:
    """PyTorch's figures from a child process ({} with a reason when PyTorch or CUDA is not there)."""
    try:
        child = subprocess.run([sys.executable, "-c", _TORCH_CHILD, json.dumps([GEMMS, copy_bytes,
                                                                                BACK_TO_BACK_CALLS])],
                               capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return {"error": "PyTorch took over 240 s"}
    if child.returncode != 0:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"PyTorch not measured: {last}"}
    return json.loads(child.stdout.strip().splitlines()[-1])


def _median(case: dict, figure: str) -> float | None:
    """A tpu-bench case's median of `figure`, None when the case did not run."""
    return case["stats"][figure]["median"] if case["status"] == "ok" else None


def _row(label: str, unit: str, pairs: list, theirs: float | None) -> tuple:
    """One table row from rounds of (tool figure, hand figure, tool case): medians, and the median ratio."""
    ran = [(tool, hand, case) for tool, hand, case in pairs if tool is not None]
    if not ran:
        return label, unit, None, None, theirs, pairs[-1][2], None
    return (label, unit, statistics.median(t for t, _, _ in ran), statistics.median(h for _, h, _ in ran), theirs,
            ran[-1][2], statistics.median(t / h for t, h, _ in ran))


def accelerator_main(args: argparse.Namespace) -> int:  # noqa: C901 a script's run in order; its helpers close over jax
    from tpu_tools.parsing import parse_size

    copy_bytes = GIB if args.copy_bytes is None else parse_size(args.copy_bytes)
    torch = torch_figures(copy_bytes) if not args.no_torch else {"error": "--no-torch"}
    from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax

    jax = import_jax(RuntimePolicy(platform=args.platform))
    jnp = jax.numpy
    device = jax.local_devices()[0]
    if device.platform == "cpu" and not args.table:
        return cpu_main(args, jax)
    gemms = GEMMS if args.table_size is None else tuple((name, args.table_size) for name, _ in GEMMS[:2])
    tool_only = TOOL_ONLY if args.table_size is None else tuple((name, args.table_size) for name, _ in TOOL_ONLY)

    def back_to_back(call, work: float) -> float:
        """The hand-timed loop: 50 calls issued back to back, one block; the median of 5 such loops."""
        for _ in range(3):
            call().block_until_ready()
        rates = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(BACK_TO_BACK_CALLS):
                out = call()
            out.block_until_ready()
            rates.append(work * BACK_TO_BACK_CALLS / (time.perf_counter() - start))
        return statistics.median(rates)

    def hand_gemm(name: str, n: int) -> float:
        dtype = getattr(jnp, {"bf16": "bfloat16", "f16": "float16"}[name])
        a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
        b = jax.random.normal(jax.random.key(2), (n, n), jnp.float32).astype(dtype)
        gemm = jax.jit(jnp.matmul).lower(a, b).compile()
        return back_to_back(lambda: gemm(a, b), 2 * n ** 3) / 1e12

    def hand_copy() -> float:
        x = jax.random.normal(jax.random.key(3), (copy_bytes // 4,), jnp.float32)
        copy = jax.jit(lambda v: v.copy()).lower(x).compile()
        return back_to_back(lambda: copy(x), 2 * copy_bytes) / 1e9

    # A GPU's clocks follow its power and temperature, so figures taken minutes apart differ by several per
    # cent: the hand loop and tpu-bench alternate in rounds, and each figure is the median over rounds (the
    # ratio is the median of the ratios within a round). Which side goes first alternates too (in_turn), and
    # the rounds are even in number so that each side leads as often.
    rounds = args.rounds or 4
    rows = []  # (label, unit, tool, hand, torch, tool case, ratio)
    warnings: list[str] = []
    for name, n in gemms:
        pairs = []
        for index in range(rounds):
            hand, case = in_turn(index, functools.partial(hand_gemm, name, n),
                                 functools.partial(_tpu_bench_runner, "matmul", {"shapes": (n,), "dtypes": (name,)},
                                                   args))
            pairs.append((_median(case, "throughput_tflops"), hand, case))
        torch_figure = (torch.get(f"gemm {name} {n}") or 0) / 1e12 or None
        rows.append(_row(f"matmul {name} {n}", "TFLOP/s", pairs, torch_figure))
    pairs = []
    for index in range(rounds):
        hand, case = in_turn(index, hand_copy,
                             lambda: _tpu_bench_runner("memory", {"sizes": (copy_bytes,), "operations": ("copy",)},
                                                       args))
        pairs.append((_median(case, "bandwidth_gbps"), hand, case))
    rows.append(_row(f"memory copy {copy_bytes >> 20} MiB", "GB/s", pairs, (torch.get("copy") or 0) / 1e9 or None))

    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# device {device.device_kind} ({device.platform}), jax {jax.__version__}, "
          f"PyTorch {torch.get('torch') or '-'}; hand loop: {BACK_TO_BACK_CALLS} calls back to back, one block, "
          f"median of 5; hand loop and tpu-bench alternate in {rounds} rounds, each first in half of them, medians "
          "over rounds")
    if "error" in torch:
        print(f"# {torch['error']}")
    print(f"{'case':<22} {'tpu-bench':>12} {'hand loop':>12} {'PyTorch':>12} {'tool/hand':>10} {'tool/torch':>10}"
          f" {'% peak':>7}  verdict")
    failed = False
    for label, unit, tool, hand, theirs, case, ratio in rows:
        if tool is None:
            failed = True
            print(f"{label:<22} tpu-bench {case['status']}: {case['message']}")
            continue
        versus_torch = tool / theirs if theirs else None
        peak = case["values"].get("percent_of_peak")
        checks = [abs(ratio - 1) <= 0.03]
        if label.startswith("matmul") and versus_torch is not None:
            checks.append(versus_torch >= 0.95)
        if label.startswith("memory") and peak is not None:
            checks.append(peak >= 85)
        ok = all(checks)
        failed |= not ok
        print(f"{label:<22} {tool:>8.4g} {unit:<3} {hand:>8.4g} {unit:<3} "
              f"{(f'{theirs:.4g}') if theirs else '-':>8} {unit if theirs else '':<3} {ratio:>10.3f} "
              f"{(f'{versus_torch:.3f}') if versus_torch else '-':>10} "
              f"{(f'{peak:.1f}') if peak is not None else '-':>7}  {'ok' if ok else 'OUT OF TARGET'}")
        warnings += [f"{case['id']}: {w}" for w in case["warnings"]]
    print("targets: GEMM tool/hand 0.97..1.03 and tool/torch >= 0.95; copy tool/hand 0.97..1.03 and >= 85% of "
          "the datasheet peak")
    print("tpu-bench alone (what ran, % of peak):")
    for name, n in tool_only:
        case = _tpu_bench_runner("matmul", {"shapes": (n,), "dtypes": (name,)}, args)
        if case["status"] != "ok":
            print(f"    matmul {name} {n}: {case['status']}: {case['message']}")
            continue
        figure = case["stats"][case["primary"]]["median"]
        peak = case["values"].get("percent_of_peak")
        print(f"    matmul {name} {n}: {figure:.4g} {'TOP/s' if name == 'int8' else 'TFLOP/s'}, ran as "
              f"{case['values'].get('arithmetic')}, {f'{peak:.1f}% of peak' if peak is not None else 'no peak'}")
        warnings += [f"{case['id']}: {w}" for w in case["warnings"]]
    print(f"tpu-bench warnings in these cases: {len(warnings)}")
    for warning in warnings:
        print(f"    {warning}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of hand loop and tpu-bench, which goes first alternating (15 on the CPU "
                             "platform, 4 on an accelerator)")
    parser.add_argument("--size", type=int, default=None, help="CPU: GEMM size N (N x N x N, float32; 1024)")
    parser.add_argument("--copy-bytes", default=None, help="bytes per array of the copy (64M on CPU, else 1G)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement, both sides")
    parser.add_argument("--platform", default="auto", help="auto (whatever jax picks), cpu, cuda, tpu, ...")
    parser.add_argument("--cli", action="store_true", help="CPU: run the tpu-bench program instead of its runner")
    parser.add_argument("--no-torch", action="store_true", help="accelerators: leave PyTorch out")
    parser.add_argument("--table", action="store_true",
                        help="print the accelerator table on the CPU platform too (to check this script)")
    parser.add_argument("--table-size", type=int, default=None, help="accelerator table: GEMM size instead of "
                        "8192 and 4096 (to check this script quickly)")
    args = parser.parse_args()
    if args.platform == "cpu" and not args.table:
        from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax

        return cpu_main(args, import_jax(RuntimePolicy(platform="cpu")))
    return accelerator_main(args)


if __name__ == "__main__":
    sys.exit(main())
