"""XLA's cost analysis of every program JAX builds, as it is built: FLOPs per step without the job's help.

JAX's compile events (`jax.monitoring`) name a function and a duration but carry no executable.
Every executable a `jit`, `pmap` or `shard_map` runs, whether XLA compiled it now or it was read
from the persistent compilation cache, comes out of one function of JAX's compiler module,
`compile_or_get_cached`, which JAX's own callers look up on that module at each call. So one
wrapper around it, installed once per process, sees each new executable: it asks XLA's cost
analysis for the FLOPs of one run (tens of microseconds, on the compiling thread and inside
JAX's own XLA-compile timing, so the ledger counts it as compile time) and hands a
`CompiledProgram` to its sinks. Steps that reuse a compiled program never pass through it.

A JAX without that function (or with another signature) is left alone: `install` returns False
and the FLOPs stay unknown. Nothing here raises into JAX: the wrapper returns JAX's executable
whatever the analysis or a sink does.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tpu_tools.shorten import shorten

COMPILER_MODULE = "jax._src.compiler"
COMPILE_FUNCTION = "compile_or_get_cached"
_MARK = "__tpu_tools_programs__"  # set on our wrapper: never wrap twice (a second agent, a reload)


@dataclass(frozen=True)
class CompiledProgram:
    """One executable JAX built or loaded: its module name and the FLOPs of one run over its local devices."""

    name: str  # the StableHLO module's name: "jit_train_step", "pmap_f", ...
    flops: float | None  # None: XLA's cost analysis did not say
    devices: int


class ProgramSink(Protocol):
    def add_program(self, program: CompiledProgram) -> None: ...


def executable_flops(executable: Any) -> tuple[float | None, int]:
    """FLOPs of one run of an XLA executable over its local devices, and their number; (None, n) when XLA
    cannot say. XLA counts one device's share of an SPMD program and leaves out properties that are 0."""
    try:
        devices = max(1, len(executable.local_devices()))
    except Exception:  # noqa: BLE001 a runtime that cannot say: one device
        devices = 1
    try:
        cost = executable.cost_analysis()
        if isinstance(cost, (list, tuple)):  # older jaxlibs: one dict per program
            cost = cost[0] if cost else None
        if not isinstance(cost, dict):
            return None, devices
        flops = cost.get("flops", 0.0)
        value = float(flops)
    except Exception:  # noqa: BLE001 XLA's cost analysis may fail any way: the FLOPs are then unknown
        return None, devices
    if value != value or value < 0 or value == float("inf"):
        return None, devices
    return value * devices, devices


def module_name(computation: Any) -> str:
    """The name of the StableHLO module JAX compiles ("jit_f"); "?" when it cannot be read."""
    try:
        name = str(computation.operation.attributes["sym_name"]).strip('"')
    except Exception:  # noqa: BLE001 MLIR's bindings fail their own ways: the name is unknown
        return "?"
    return shorten(name, 256) if name else "?"


class ProgramWatcher:
    """Wraps JAX's compile-or-load function once per process and hands each new executable to its sinks."""

    def __init__(self, module: str = COMPILER_MODULE, function: str = COMPILE_FUNCTION) -> None:
        self._lock = threading.Lock()
        self._sinks: list[ProgramSink] = []
        self._module, self._function = module, function
        self.installed = False

    def add_sink(self, sink: ProgramSink) -> None:
        with self._lock:
            if sink not in self._sinks:
                self._sinks.append(sink)

    def remove_sink(self, sink: ProgramSink) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def install(self) -> bool:
        """Wrap JAX's compile-or-load function (once); False where this JAX has none to wrap."""
        with self._lock:
            if self.installed:
                return True
            try:
                compiler = importlib.import_module(self._module)
                original = getattr(compiler, self._function)
            except Exception:  # noqa: BLE001 another JAX: the FLOPs stay unknown
                return False
            if not callable(original):
                return False
            if not getattr(original, _MARK, False):
                setattr(compiler, self._function, self._wrap(original))
            self.installed = True
            return True

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def compile_or_get_cached(*args: Any, **kwargs: Any) -> Any:
            executable = original(*args, **kwargs)
            try:
                self._publish(executable, args[1] if len(args) > 1 else kwargs.get("computation"))
            except Exception:  # noqa: BLE001 JAX gets its executable whatever happens here
                pass
            return executable

        setattr(compile_or_get_cached, _MARK, True)
        return compile_or_get_cached

    def _publish(self, executable: Any, computation: Any) -> None:
        with self._lock:
            sinks = list(self._sinks)
        if not sinks:
            return
        flops, devices = executable_flops(executable)
        program = CompiledProgram(module_name(computation), flops, devices)
        for sink in sinks:
            try:
                sink.add_program(program)
            except Exception:  # noqa: BLE001 a sink never breaks the compile it is told of
                pass


_watcher = ProgramWatcher()


def watcher() -> ProgramWatcher:
    """This process's watcher (the wrapper stays in JAX for good: one per process)."""
    return _watcher
