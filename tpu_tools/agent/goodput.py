"""The job's goodput ledger, its MFU and cost figures, and the summary it leaves when it ends.

One `GoodputLedger` per process, started at the process's own start time (so imports and
backend start are counted as start-up). The agent hands it compile durations from the compile
listener, and XLA's cost analysis of each program JAX builds from the program watcher (the FLOPs
of the step's programs, `instrument/programs.py`); `tpu_tools.agent.step()`, `step_context()` and
`phase()` mark it. Peak FLOP/s comes
from the device table (`tpu_tools.accelerators`) times the local devices, unless the job or
$TPU_TOOLS_PEAK_FLOPS gives it; the price per hour from `start(price_per_hour=...)`,
`python -m tpu_tools.agent --price-per-hour` or $TPU_TOOLS_PRICE_PER_HOUR.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tpu_tools.instrument.compiles import CacheMiss, CompileEvent
from tpu_tools.instrument.goodput import GoodputLedger, LedgerSettings, process_start_unix_s, work_rates
from tpu_tools.instrument.jobvalues import finite_at_least
from tpu_tools.instrument.programs import CompiledProgram, watcher
from tpu_tools.parsing import parse_number
from tpu_tools.shorten import quoted, shorten

ENV_PRICE = "TPU_TOOLS_PRICE_PER_HOUR"
ENV_PEAK = "TPU_TOOLS_PEAK_FLOPS"


def _new_ledger() -> GoodputLedger:
    now_unix, now_perf = time.time(), time.perf_counter()
    started = process_start_unix_s()
    if started is None or not 0 <= now_unix - started < 10 * 365 * 86400:
        started = now_unix  # no /proc: count from the agent's import
    return GoodputLedger(now_perf - (now_unix - started), started, LedgerSettings())


_ledger = _new_ledger()


def process_ledger() -> GoodputLedger:
    """This process's ledger (a forked child starts a fresh one: see `reset_after_fork`)."""
    return _ledger


def reset_after_fork() -> None:
    global _ledger
    _ledger = _new_ledger()


class LedgerCompileSink:
    """Hands compile durations from the compile listener to the process ledger."""

    def add_event(self, event: CompileEvent) -> None:
        _ledger.add_compile(event.duration_s)

    def add_miss(self, miss: CacheMiss) -> None:
        pass


LEDGER_SINK = LedgerCompileSink()  # one per process: the listener keeps its sinks for good


class LedgerProgramSink:
    """Hands XLA's FLOPs of each program JAX builds to the process ledger (the step's programs)."""

    def add_program(self, program: CompiledProgram) -> None:
        _ledger.add_program(program.name, program.flops)


PROGRAM_SINK = LedgerProgramSink()


def listen_to_programs() -> bool:
    """Read XLA's cost analysis of each program JAX builds from now on; False where this JAX cannot be
    watched (the FLOPs then stay unknown unless the job gives them)."""
    try:
        if not watcher().install():
            return False
        watcher().add_sink(PROGRAM_SINK)
        return True
    except Exception:  # noqa: BLE001 never into the job
        return False


# Orbax records how long a save blocked the training thread through jax.monitoring (synchronous and
# asynchronous saves); that time is checkpoint time wherever the job did not label it itself.
ORBAX_BLOCKING_EVENTS = ("/jax/orbax/write/blocking_duration_secs",
                         "/jax/checkpoint/write/async/blocking_duration_secs")
_orbax_listening = False


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    if event in ORBAX_BLOCKING_EVENTS:
        try:
            _ledger.add_claimed("checkpoint", duration)
        except Exception:  # noqa: BLE001 a listener of JAX's never raises into the job
            pass


def listen_to_checkpoints(jax_module: Any) -> None:
    """Take Orbax's blocking save durations from jax.monitoring (once: JAX keeps its listeners for good)."""
    global _orbax_listening
    if not _orbax_listening:
        jax_module.monitoring.register_event_duration_secs_listener(_on_duration)
        _orbax_listening = True


def positive_number(value: Any) -> float | None:
    """A finite number > 0, else None (a price or a peak of 0, NaN or infinity is unknown). Text (a flag,
    an environment variable) is read by the project's ASCII number parser; anything else is the job's value."""
    if isinstance(value, str):
        try:
            return float(parse_number(value, "value", above=0))
        except ValueError:
            return None
    return finite_at_least(value, 0.0, above=True)


class JobFigures:
    """Peak and price of this job, and the figures built on the ledger; read on request."""

    def __init__(self, price_per_hour: Any = None, peak_flops_per_s: Any = None):
        self.problems: list[str] = []
        self.price_per_hour = self._setting("price per hour", price_per_hour, ENV_PRICE)
        self.peak_flops_per_s = self._setting("peak FLOP/s", peak_flops_per_s, ENV_PEAK)
        self.peak_source = "given" if self.peak_flops_per_s is not None else None
        self._peak_looked_up = self.peak_source is not None  # the device table is read once, not per request

    def _setting(self, what: str, given: Any, env: str) -> float | None:
        value = given if given is not None else os.environ.get(env) or None
        if value is None:
            return None
        number = positive_number(value)
        if number is None:
            source = "given" if given is not None else f"${env}"
            self.problems.append(f"{what} {quoted(value, 40)} ({source}) is not a finite number > 0; unknown")
        return number

    def attach_jax(self, jax_module: Any) -> None:
        """Peak of the device table for the job's local devices, unless one was given."""
        if self.peak_flops_per_s is not None:
            return
        try:
            from tpu_tools.accelerators import spec_for_device_kind

            devices = jax_module.local_devices()
            spec = spec_for_device_kind(str(devices[0].device_kind)) if devices else None
            if spec is not None and spec.peak_bf16_flops:
                chips = len(devices) / max(1, spec.devices_per_chip or 1)  # the table's peaks are per chip
                self.peak_flops_per_s = spec.peak_bf16_flops * chips
                self.peak_source = f"{spec.name} bf16 peak x {chips:g} chips"
        except Exception as error:  # noqa: BLE001 a runtime that fails leaves the peak unknown, nothing else
            self.problems.append(shorten(f"peak unknown: {type(error).__name__}: {error}", 200))

    def snapshot(self, jax_module: Any = None) -> dict[str, Any]:
        """The ledger's figures with MFU, samples/s and cost per 1M samples for both spans.

        The device table's peak is looked up once the job's runtime has started (asking for
        devices before would start it).
        """
        if jax_module is not None and not self._peak_looked_up:
            from tpu_tools.agent.memory import backends_ready

            if backends_ready(jax_module):
                self._peak_looked_up = True
                self.attach_jax(jax_module)
        figures = _ledger.snapshot()
        for span in ("since_start", "recent"):
            if figures.get(span) is not None:
                figures[span].update(work_rates(figures[span], self.peak_flops_per_s, self.price_per_hour))
        figures["peak_flops_per_s"] = self.peak_flops_per_s
        figures["peak_source"] = self.peak_source
        figures["price_per_hour"] = self.price_per_hour
        figures["problems"] = list(self.problems)
        return figures


def program_flops(compiled: Any) -> float | None:
    """FLOPs of one run of a compiled program (`jax.stages.Compiled`) over all its devices, from XLA's
    cost analysis; None where XLA does not say."""
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, (list, tuple)):
            cost = cost[0] if cost else None
        per_device = positive_number((cost or {}).get("flops"))
        if per_device is None:
            return None
        devices = 1
        try:
            import jax

            leaves = jax.tree_util.tree_leaves(compiled.input_shardings)
            devices = max((len(s.device_set) for s in leaves), default=1)
        except Exception:  # noqa: BLE001 a program without shardings runs on one device
            devices = 1
        return per_device * devices  # XLA counts one device's share of an SPMD program
    except Exception:  # noqa: BLE001 XLA's cost analysis may fail any way: the FLOPs are then unknown
        return None


def job_summary(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The record a job leaves when it ends (`tpu_tools.metrics.jobsummary`), from the agent's last snapshot."""
    devices = snapshot.get("devices") or []
    peaks = [d["memory_peak_bytes"] for d in devices if d.get("memory_peak_bytes") is not None]
    compiles = snapshot.get("compiles") or {}
    goodput = snapshot.get("goodput") or {}
    return {**{key: snapshot.get(key) for key in ("pid", "tag", "user", "command", "frontend", "frontend_version",
                                                  "jax_version", "runtime", "steps", "goodput", "metrics",
                                                  "cpu_fallbacks")},
            "recent_recompiles": compiles.get("recent_recompiles") or [],
            "host": os.uname().nodename, "started_unix_s": goodput.get("started_unix_s"), "ended_unix_s": time.time(),
            "compile_count": compiles.get("compile_count"), "recompile_count": compiles.get("recompile_count"),
            "compile_time_s": sum(compiles.get(k) or 0.0 for k in ("trace_time_s", "lowering_time_s",
                                                                    "backend_compile_time_s")),
            "device_memory_peak_bytes": max(peaks) if peaks else None, "devices": len(devices),
            "hardware": snapshot.get("hardware")}


def write_job_summary(snapshot: Callable[[], dict[str, Any]]) -> None:
    """Leave the job's summary in the runtime directory; best effort, one line on stderr when it fails."""
    try:
        from tpu_tools.metrics.jobsummary import write_summary

        write_summary(job_summary(snapshot()))
    except Exception as error:  # noqa: BLE001 a job that ends must end
        sys.stderr.write(f"tpu-tools agent: no job summary written: {type(error).__name__}: {error}\n")
