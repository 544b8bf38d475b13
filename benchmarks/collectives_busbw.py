#!/usr/bin/env python3
"""Does `tpu-collectives-test` report what a hand-written psum loop measures?

Two comparisons, each side by side in one run (both by default; --part picks one):

latency: on the default platform (all its devices: one GPU on a one-GPU machine, 8 CPU devices where
  there is no accelerator), the 1 KiB all-reduce:
    tpu-collectives-test all-reduce -b 1K -e 1K --json FILE   its time (out-of-place and in-place
                                                            columns), run through its click entry point
    a hand-timed back-to-back loop of the same jitted psum: bursts of calls issued back to back, one
    block at the end of each, time / calls (what nccl-tests does); and the same psum with a block
    after every call, for the latency a user sees when waiting for each call.
  Target: the command's out-of-place time within 2x of the back-to-back loop's.
  Also printed: whether the compiled psum still holds an all-reduce (XLA may drop one over a single
  device: then the figure is the cost of launching a program, not of a collective).

busbw: on the CPU platform with 8 devices, at 1, 16 and 64 MiB, the command's busbw against a plain
  loop over the same psum with a block after every call (the timing before back-to-back samples), its
  mean time turned into busbw with the same formula, 2(n-1)/n. At these sizes the round trip is small
  next to the call, so the two must agree: the back-to-back figure may not exceed the per-call one by
  more than the noise (a runtime that ran calls side by side would show here). Each pair runs in one
  worker process, one side after the other in alternating order: on this platform the same loop in
  separate processes varies far more than the 10 % tested (where the runtime's threads and buffers land
  is decided per process), while within one process both sides see the same runtime. Each size runs in
  --workers fresh processes of --pairs pairs each; the median of all pairs' ratios is compared.
  Target: within 10 % at every size.

Runs from a source tree, nothing installed but jax, click, rich, psutil:

    PYTHONPATH=. python3 benchmarks/collectives_busbw.py [--part latency|busbw|both] [--workers 2] [--pairs 2]

The latency part takes well under a minute; the busbw part a few minutes on 2 busy cores, less on a
host with more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a source tree: the package next to this folder
    sys.path.insert(0, str(REPO))

SIZES_MIB = (1, 16, 64)
# Plain loop iterations per size: about a second of timed work each, so that one scheduling hiccup
# on a busy machine moves the mean little. The command's samples (5 ms or one call, whichever is
# longer) are chosen for about as long.
ITERS = {1: 1500, 16: 60, 64: 12}
TOOL_SAMPLES = {1: 200, 16: 60, 64: 12}
DEVICES = 8
TOLERANCE = 0.10
LATENCY_BYTES = 1024
LATENCY_TARGET = 2.0
# Calls per back-to-back burst of the hand loop: enough for several ms on a fast device; on the CPU
# platform 16, since its runtime hangs with about 50 collective calls queued.
BURST = {"cpu": 16}
BURST_DEFAULT = 500


def _env(cpu: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    if cpu:
        # What `--host-devices 8` makes of the environment, set before the worker imports jax, so that
        # the tool's runtime policy and the plain loop agree on it.
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
        env["JAX_NUM_CPU_DEVICES"] = str(DEVICES)
    return env


def _tool_row(size: int, samples: int, warmup: int, folder: Path) -> dict:
    """The command's JSON row for one all-reduce size."""
    from tpu_tools.cli.collectives import collectives_command

    path = folder / f"run-{time.monotonic_ns()}.json"
    args = ["all-reduce", "-b", str(size), "-e", str(size), "-n", str(samples), "-w", str(warmup),
            "--host-devices", str(DEVICES), "--stats", "p50", "--json", str(path)]
    code = collectives_command.main(args, prog_name="tpu-collectives-test", standalone_mode=False)
    if code:
        raise SystemExit(f"tpu-collectives-test exited {code}")
    document = json.loads(path.read_text())
    (row,) = document["tests"][0]["results"]
    row["device_kind"], row["platform"], row["ranks"] = document["device_kind"], document["platform"], document["ranks"]
    return row


class PlainLoop:
    """The hand-written timing: what a user would type to measure one psum."""

    def __init__(self) -> None:
        import jax
        import numpy as np
        from jax import lax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.jax, self.np = jax, np
        self.mesh = Mesh(np.array(jax.devices()), ("x",))
        self.sharding = NamedSharding(self.mesh, P("x", None))
        self.psum = jax.jit(jax.shard_map(lambda a: lax.psum(a, "x"), mesh=self.mesh, in_specs=P("x", None),
                                          out_specs=P("x", None)))
        self.ranks = len(jax.devices())
        self.platform = jax.devices()[0].platform

    def _input(self, size: int):
        return self.jax.device_put(self.np.ones((self.ranks, size // 4), self.np.float32), self.sharding)

    def busbw(self, size: int, iters: int, warmup: int) -> tuple[float, float]:
        """Each call waited for: busbw from the mean and from the median time."""
        x = self._input(size)
        self.psum(x).block_until_ready()
        for _ in range(warmup):
            self.psum(x).block_until_ready()
        times = []
        for _ in range(iters):
            started = time.perf_counter()
            self.psum(x).block_until_ready()
            times.append(time.perf_counter() - started)
        factor = 2 * (self.ranks - 1) / self.ranks
        return size / statistics.fmean(times) / 1e9 * factor, size / statistics.median(times) / 1e9 * factor

    def latency(self, size: int, bursts: int = 30) -> dict:
        """Back to back (bursts of calls, one block each) and waited for, in us; and is there an all-reduce."""
        x = self._input(size)
        compiled_text = self.psum.lower(x).compile().as_text()
        burst = BURST.get(self.platform, BURST_DEFAULT)
        for _ in range(5):
            self.psum(x).block_until_ready()
        back_to_back = []
        for _ in range(bursts):
            started = time.perf_counter()
            for _ in range(burst):
                y = self.psum(x)
            y.block_until_ready()
            back_to_back.append((time.perf_counter() - started) / burst * 1e6)
        waited = []
        for _ in range(200):
            started = time.perf_counter()
            self.psum(x).block_until_ready()
            waited.append((time.perf_counter() - started) * 1e6)
        return {"back_to_back_us": statistics.median(back_to_back), "waited_us": statistics.median(waited),
                "burst": burst, "has_all_reduce": "all-reduce" in compiled_text}


def _busbw_worker(size: int, pairs: int, iters: int, samples: int, warmup: int, tool_first: bool) -> None:
    """Print [[ours_mean, ours_p50, loop_mean, loop_p50], ...] for `pairs` pairs in this process."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        _tool_row(size, 2, warmup, Path(folder))  # the tool's policy sets the runtime up first
        loop = PlainLoop()
        for index in range(pairs):
            order = ("ours", "loop") if (index % 2 == 0) == tool_first else ("loop", "ours")
            measured = {}
            for side in order:
                if side == "ours":
                    row = _tool_row(size, samples, warmup, Path(folder))
                    measured[side] = (row["busbw_gbps"], row["busbw_gbps"] * row["time_us"] / row["stats_us"]["p50"])
                else:
                    measured[side] = loop.busbw(size, iters, warmup)
            results.append([*measured["ours"], *measured["loop"]])
    sys.stdout.write(json.dumps(results) + "\n")


def _latency_worker(pairs: int, warmup: int) -> None:
    """Print [{tool row, hand loop}, ...] for the 1 KiB all-reduce on the default platform."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        _tool_row(LATENCY_BYTES, 2, warmup, Path(folder))  # the tool's policy sets the runtime up first
        loop = PlainLoop()
        for index in range(pairs):
            if index % 2:
                hand, tool = loop.latency(LATENCY_BYTES), _tool_row(LATENCY_BYTES, 20, warmup, Path(folder))
            else:
                tool, hand = _tool_row(LATENCY_BYTES, 20, warmup, Path(folder)), loop.latency(LATENCY_BYTES)
            results.append({"tool": tool, "hand": hand})
    sys.stdout.write(json.dumps(results) + "\n")


def _run_worker(arguments: list[str], cpu: bool) -> list:
    command = [sys.executable, __file__, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, env=_env(cpu))
    if result.returncode:
        raise SystemExit(f"worker {' '.join(arguments)} failed: {result.stderr.strip().splitlines()[-3:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _latency(args: argparse.Namespace) -> bool:
    pairs = _run_worker(["--worker-latency", "--pairs", str(max(2, args.pairs)), "--warmup", str(args.warmup)],
                        cpu=False)
    tool = {key: statistics.median(p["tool"][key] for p in pairs) for key in ("time_us", "blocking_call_us")}
    in_place = statistics.median(p["tool"]["in_place"]["time_us"] for p in pairs)
    hand = {key: statistics.median(p["hand"][key] for p in pairs) for key in ("back_to_back_us", "waited_us")}
    first = pairs[0]
    ratio = tool["time_us"] / hand["back_to_back_us"]
    ok = ratio <= LATENCY_TARGET
    where = (f"{first['tool']['platform']} ({first['tool']['device_kind']}, {first['tool']['ranks']} "
             f"device{'s' if first['tool']['ranks'] != 1 else ''})")
    kept = ("the compiled psum holds an all-reduce" if first["hand"]["has_all_reduce"]
            else "XLA removed the all-reduce from the compiled psum: this is the cost of launching a program")
    print(f"all-reduce 1 KiB latency on {where}, median of {len(pairs)} pairs in one process:")
    print(f"  tpu-collectives-test   {tool['time_us']:9.2f} us out-of-place, {in_place:.2f} us in-place "
          f"(k = {first['tool']['calls_per_sample']} calls per sample); one call waited for "
          f"{tool['blocking_call_us']:.2f} us")
    print(f"  hand-timed psum loop   {hand['back_to_back_us']:9.2f} us back to back (bursts of "
          f"{first['hand']['burst']}, one block each); one call waited for {hand['waited_us']:.2f} us")
    print(f"  ratio {ratio:.2f} (target within {LATENCY_TARGET:g}x) {'ok' if ok else 'OFF TARGET'}; {kept}")
    return ok


def _busbw(args: argparse.Namespace) -> bool:
    pairs: dict[int, list[list[float]]] = {mib: [] for mib in SIZES_MIB}
    per_process: dict[int, list[float]] = {mib: [] for mib in SIZES_MIB}
    for worker in range(args.workers):
        for mib in SIZES_MIB:
            arguments = ["--worker-busbw", str(mib << 20), "--pairs", str(args.pairs), "--iters",
                         str(args.iters or ITERS[mib]), "--samples", str(TOOL_SAMPLES[mib]), "--warmup",
                         str(args.warmup)] + (["--tool-first"] if worker % 2 == 0 else [])
            measured = _run_worker(arguments, cpu=True)
            pairs[mib].extend(measured)
            per_process[mib].append(statistics.median(p[0] / p[2] for p in measured))
    failed = False
    print(f"all-reduce busbw on the CPU platform ({DEVICES} devices): tpu-collectives-test (k calls back to back "
          "per sample) vs a plain psum loop waiting for every call")
    for mib in SIZES_MIB:
        rows = pairs[mib]
        ratio = statistics.median(p[0] / p[2] for p in rows)
        by_p50 = statistics.median(p[1] / p[3] for p in rows)
        ok = abs(ratio - 1) <= TOLERANCE
        failed |= not ok
        print(f"  {mib:>2} MiB: tpu-collectives-test {statistics.median(p[0] for p in rows):.3f} GB/s, "
              f"plain psum loop {statistics.median(p[2] for p in rows):.3f} GB/s; median ratio of {len(rows)} "
              f"pairs {ratio:.3f} (target within {TOLERANCE:.0%}) {'ok' if ok else 'OFF TARGET'}  "
              f"[from p50 times: {by_p50:.3f}; per process: {min(per_process[mib]):.3f}-{max(per_process[mib]):.3f}]")
    return not failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("latency", "busbw", "both"), default="both")
    parser.add_argument("--workers", type=int, default=2, help="fresh processes per size (busbw)")
    parser.add_argument("--pairs", type=int, default=2, help="pairs measured in each process")
    parser.add_argument("--iters", type=int, default=None, help="plain loop iterations (default: per size)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--worker-busbw", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-latency", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--tool-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_busbw is not None:
        _busbw_worker(args.worker_busbw, args.pairs, args.iters, args.samples, args.warmup, args.tool_first)
        return 0
    if args.worker_latency:
        _latency_worker(args.pairs, args.warmup)
        return 0
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    started = time.monotonic()
    ok = True
    if args.part in ("latency", "both"):
        ok &= _latency(args)
    if args.part in ("busbw", "both"):
        ok &= _busbw(args)
    print(f"# {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
