"""The `quick` and `full` suites: which cases each benchmark runs, by platform.

`quick` finishes in under two minutes on a 2-core CPU host. Accelerators get
larger problems (a 1024 GEMM says nothing about a TPU). Options given on the
command line replace a suite's choice field by field.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpu_tools.bench.compile import CompileOptions
from tpu_tools.bench.dispatch import DispatchOptions
from tpu_tools.bench.infer import InferOptions, batch_sizes_up_to
from tpu_tools.bench.matmul import MatmulOptions, Shape
from tpu_tools.bench.memory import MemoryOptions
from tpu_tools.bench.model import ModelChoice
from tpu_tools.bench.names import BENCHMARKS
from tpu_tools.bench.runner import Selection, benchmark_module
from tpu_tools.bench.train import TrainOptions
from tpu_tools.bench.transfer import TransferOptions

SUITES = ("quick", "full")
MIN_TIME_S = {"quick": 0.5, "full": 2.0}

K, M, G = 1 << 10, 1 << 20, 1 << 30


def _squares(*sizes: int) -> tuple[Shape, ...]:
    return tuple(Shape(s, s, s) for s in sizes)


def defaults(benchmark: str, suite: str, platform: str) -> Any:
    """The options a suite gives one benchmark on a platform ("cpu", "tpu", "gpu", ...)."""
    cpu = platform in ("cpu", "auto")
    quick = suite == "quick"
    if benchmark == "compile":
        return CompileOptions(ModelChoice("tiny" if quick else "small"), repeats=1 if quick else 3)
    if benchmark == "dispatch":
        return DispatchOptions()
    if benchmark == "matmul":
        if cpu:
            return MatmulOptions(_squares(1024) if quick else _squares(1024, 2048, 4096))
        return MatmulOptions(_squares(4096, 8192) if quick else _squares(1024, 2048, 4096, 8192, 16384))
    if benchmark == "memory":
        if cpu:
            return MemoryOptions((64 * M,) if quick else (16 * M, 256 * M, 1 * G))
        return MemoryOptions((1 * G,) if quick else (64 * M, 256 * M, 1 * G, 4 * G))
    if benchmark == "transfer":
        if quick:
            return TransferOptions((64 * K, 1 * M, 16 * M) if cpu else (64 * K, 1 * M, 16 * M, 256 * M))
        return TransferOptions((4 * K, 64 * K, 1 * M, 16 * M, 256 * M) + (() if cpu else (1 * G,)))
    if benchmark == "train":
        if quick:
            return TrainOptions((ModelChoice("tiny" if cpu else "small"),))
        return TrainOptions((ModelChoice("tiny"), ModelChoice("small")) if cpu
                            else (ModelChoice("small"), ModelChoice("base")))
    if benchmark == "infer":
        if quick:
            return InferOptions(ModelChoice("tiny" if cpu else "small"), batch_sizes_up_to(8))
        return InferOptions(ModelChoice("small" if cpu else "base"), batch_sizes_up_to(32 if cpu else 64))
    raise KeyError(benchmark)


def selection(benchmark: str, suite: str, overrides: dict[str, Any] | None = None) -> Selection:
    """One benchmark: the suite's options on the platform, with `overrides` (None values ignored) on top."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    module = benchmark_module(benchmark)

    def plan(platform: str) -> list:
        return module.plan(replace(defaults(benchmark, suite, platform), **given))

    return Selection(benchmark, plan)


def suite_selections(suite: str, shared: dict[str, dict[str, Any]] | None = None) -> list[Selection]:
    """Every benchmark of a suite; `shared` holds per-benchmark overrides (price, cache directory)."""
    shared = shared or {}
    return [selection(name, suite, shared.get(name)) for name in BENCHMARKS]
