"""Run a selection of benchmark cases, one at a time, and collect their results.

A case that cannot run (unsupported dtype, out of memory, a runtime error)
becomes a result with a status and the suite goes on. Ctrl-C stops the run:
the case in progress is marked interrupted, the rest not run, and what finished
is returned for the caller to write.

Out-of-process benchmarks (compile) run first, before this process opens the
device: a TPU belongs to one process at a time.
"""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from tpu_tools import signals
from tpu_tools.bench.failures import classify
from tpu_tools.bench.interference import interference, noise_reasons, snapshot
from tpu_tools.bench.interrupts import kept_interrupts, raise_kept_interrupt
from tpu_tools.bench.names import OUT_OF_PROCESS
from tpu_tools.bench.records import (
    INTERRUPTED,
    NOT_RUN,
    OK,
    BenchEnvironment,
    BenchSettings,
    Case,
    CaseResult,
    RunResult,
)
from tpu_tools.bench.timing import TimingSettings
from tpu_tools.errors import PlatformUnavailable, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy


@dataclass(frozen=True)
class Selection:
    """One benchmark with its options; `plan(platform)` lists its cases (sizes may depend on the platform)."""

    benchmark: str
    plan: Callable[[str], list[Case]]


class Progress(Protocol):
    def planned(self, total: int) -> None: ...

    def started(self, case: Case) -> None: ...

    def finished(self, result: CaseResult) -> None: ...


class NoProgress:
    def planned(self, total: int) -> None:
        pass

    def started(self, case: Case) -> None:
        pass

    def finished(self, result: CaseResult) -> None:
        pass


@dataclass
class RunRequest:
    selections: list[Selection]
    policy: RuntimePolicy
    timeout_s: float
    timing: TimingSettings
    seed: int = 0
    suite: str | None = None
    environment: BenchEnvironment = field(default_factory=BenchEnvironment)
    # Called with the run once the device is known, before the in-process benchmarks (baseline checks).
    on_device: Callable[[RunResult], None] | None = None


def benchmark_module(benchmark: str) -> Any:
    return importlib.import_module(f"tpu_tools.bench.{benchmark}")


def run_benchmarks(request: RunRequest, progress: Progress | None = None) -> RunResult:
    progress = progress or NoProgress()
    timing = request.timing
    run = RunResult(environment=request.environment, device=None, suite=request.suite,
                    settings=BenchSettings(min_time_s=timing.min_time_s, warmup=timing.warmup,
                                           min_samples=timing.min_samples, seed=request.seed,
                                           sample_time_s=timing.sample_time_s, repeats=timing.repeats,
                                           timeout_s=request.timeout_s),
                    time=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    outside = [s for s in request.selections if s.benchmark in OUT_OF_PROCESS]
    inside = [s for s in request.selections if s.benchmark not in OUT_OF_PROCESS]
    pending: list[Case] = []
    current: list[Case] = []  # the case in progress, if any

    def run_cases(cases: list[Case], run_one: Callable[[Case], CaseResult]) -> None:
        pending[:] = cases
        progress.planned(len(run.results) + len(cases))
        for case in cases:
            raise_kept_interrupt()
            current[:] = [case]
            progress.started(case)
            run.results.append(run_one(case))
            progress.finished(run.results[-1])
            current.clear()
            gc.collect()

    try:
        with kept_interrupts():
            run_cases([case for s in outside for case in s.plan(_platform_hint(request.policy))],
                      lambda case: _run_out_of_process(case, request))
            pending.clear()
            ctx = _open_device(request, run)  # also when only compile ran: the result records the device
            run_cases([case for s in inside for case in s.plan(ctx.platform)],
                      lambda case: _run_in_process(ctx, case))
            raise_kept_interrupt()
        _note_library_calls(run)
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM (tpu_tools.signals)
        signals.note_interrupt(error)
        why = signals.interrupt_word()
        run.interrupted = True
        for case in current:
            run.results.append(CaseResult(case, status=INTERRUPTED, message=why))
        done = {r.case.id for r in run.results}
        run.results.extend(CaseResult(case, status=NOT_RUN, message="not run: the suite was interrupted")
                           for case in pending if case.id not in done)
        run.notes.append(f"{why}: partial results; cases after the interruption did not run")
    return run


def _platform_hint(policy: RuntimePolicy) -> str:
    platforms = policy.requested_platforms()
    return platforms[0] if platforms else "auto"


def _open_device(request: RunRequest, run: RunResult) -> Any:
    from tpu_tools.bench.context import BenchContext
    from tpu_tools.bench.environment import device_record
    from tpu_tools.pjrt.runtime import import_jax

    jax = import_jax(request.policy)
    devices = jax.local_devices()
    device = run.device = device_record(devices, process_count=jax.process_count())
    if request.on_device is not None:
        request.on_device(run)
    return BenchContext(jax=jax, devices=devices, device=device, timing=request.timing, seed=request.seed,
                        gpu_clocks=_gpu_clocks(devices[0]))


def _gpu_clocks(device: Any) -> Any:
    """NVML's view of the benchmark's GPU, on an NVIDIA GPU (None elsewhere)."""
    from tpu_tools.bench.gpu_clocks import GpuClocks
    from tpu_tools.pjrt.pairing import GPU_PLATFORMS

    if device.platform not in GPU_PLATFORMS or "nvidia" not in str(getattr(device, "device_kind", "")).lower():
        return None
    ordinal = getattr(device, "local_hardware_id", None)
    return GpuClocks(ordinal if isinstance(ordinal, int) else device.id)


def _run_out_of_process(case: Case, request: RunRequest) -> CaseResult:
    start = time.perf_counter()
    try:
        result = benchmark_module(case.benchmark).run_out_of_process(case, request.policy, request.timeout_s)
    except PlatformUnavailable:
        raise  # nothing else can run either
    except Exception as error:  # noqa: BLE001 any failure of a case is classified and recorded; the others run
        status, message = classify(error, _platform_hint(request.policy))
        result = CaseResult(case, status=status, message=message)
    result.duration_s = time.perf_counter() - start
    return result


def _run_in_process(ctx: Any, case: Case) -> CaseResult:
    start = time.perf_counter()
    before = snapshot()
    try:
        result = benchmark_module(case.benchmark).run(ctx, case)
    except UsageError:
        raise  # the user's target or arguments are wrong (tpu-bench fn): no case can run
    except Exception as error:  # noqa: BLE001 any failure of a case is classified and recorded; the others run
        status, message = classify(error, ctx.platform)
        result = CaseResult(case, status=status, message=message)
    result.duration_s = time.perf_counter() - start
    if result.status == OK:
        result.values["interference"] = interference(before, snapshot())
        if ctx.gpu_clocks is not None:
            result.values["interference"]["gpu"] = ctx.gpu_clocks.read()
        reasons = noise_reasons(result.values, ctx.platform)
        result.values["noisy"] = bool(reasons)
        if reasons:
            result.warn("noisy: " + "; ".join(reasons))
    return result


def _note_library_calls(run: RunResult) -> None:
    """Say once that XLA's counts leave out library calls, where they did (cuBLAS, cuDNN on GPUs)."""
    excluded = {(r.case.id, target) for r in run.results for target in r.values.get("xla_cost_excludes") or ()}
    if excluded:
        targets = sorted({target for _, target in excluded})
        cases = sorted({case_id for case_id, _ in excluded})
        run.notes.append(f"XLA's cost analysis does not count the work of library calls ({', '.join(targets)}): "
                         f"its FLOP and byte counts are not compared with the analytic ones in {len(cases)} "
                         f"case(s) ({', '.join(cases[:4])}{', ...' if len(cases) > 4 else ''})")
