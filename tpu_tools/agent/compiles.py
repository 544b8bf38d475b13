"""Compile events from `jax.monitoring`, per function, and recompilations with JAX's reason.

JAX reports each phase of a compilation through `jax.monitoring` with the
function's name: tracing (`jaxpr_trace_duration`), lowering to MLIR
(`jaxpr_to_mlir_module_duration`) and the backend compile
(`backend_compile_duration`), plus persistent-cache hits and misses (without a
name: they are credited to the function being compiled on that thread). A
function compiled again is a recompilation. With `jax_explain_cache_misses`
on, JAX logs why it traced a function again; the tracker keeps that reason.
These callbacks run only when JAX compiles, never in a step that reuses a
compiled program.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"

MAX_FUNCTIONS = 2048  # distinct names kept; later ones are counted under OTHER
OTHER = "(other functions)"
MAX_RECOMPILES = 50  # most recent recompilations kept with their reason
_WRAPPER = re.compile(r"^(?:jit|pjit|pmap|xla_pmap)\((.*)\)$")
_MISS_HEADER = "TRACING CACHE MISS"
_FOR_FUNCTION = re.compile(r"^\s*for (\S+)")


def function_name(fun_name: str) -> str:
    """`jit(f)` and `f` are one function: lowering and compile events wrap the traced name."""
    match = _WRAPPER.match(fun_name)
    return match.group(1) if match else fun_name


@dataclass
class FunctionStats:
    name: str
    compile_count: int = 0  # backend compiles (including persistent-cache hits)
    trace_count: int = 0
    trace_time_s: float = 0.0
    lowering_time_s: float = 0.0
    backend_compile_time_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    last_recompile_reason: str | None = None

    @property
    def recompile_count(self) -> int:
        return max(0, self.compile_count - 1)

    def to_dict(self) -> dict[str, Any]:
        # vars(), not dataclasses.asdict: this runs for every function on every request.
        return {**vars(self), "recompile_count": self.recompile_count}


@dataclass
class Recompile:
    function: str
    time_unix_s: float
    compile_count: int
    backend_compile_time_s: float
    reason: str | None  # JAX's explanation, when cache-miss explanations are on

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def parse_miss_explanation(message: str) -> tuple[str, str] | None:
    """(function, reason) from JAX's "TRACING CACHE MISS" log text; None for a first trace."""
    lines = message.splitlines()
    if not lines or not lines[0].startswith(_MISS_HEADER) or len(lines) < 2:
        return None
    match = _FOR_FUNCTION.match(lines[1])
    if not match:
        return None  # "never seen function": a first compile, not a recompilation
    body = [line.strip() for line in lines[2:] if line.strip()]
    body = [line for line in body if not line.startswith("all previously seen cache keys differ")]
    reason = "; ".join(line.lstrip("* ").rstrip(":") for line in body)
    return match.group(1), reason or "cache miss explanation unavailable"


class _ExplanationHandler(logging.Handler):
    """Receives JAX's cache-miss explanations (WARNING records of the jax loggers)."""

    def __init__(self, tracker: CompileTracker):
        super().__init__(level=logging.WARNING)
        self._tracker = tracker

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg if isinstance(record.msg, str) else ""
        if not message.startswith(_MISS_HEADER):
            return
        parsed = parse_miss_explanation(record.getMessage())
        if parsed:
            self._tracker.note_reason(*parsed)


class CompileTracker:
    """Aggregates compile events; `snapshot()` is read by the agent server on request."""

    def __init__(self) -> None:
        self._functions: dict[str, FunctionStats] = {}
        self._recompiles: deque[Recompile] = deque(maxlen=MAX_RECOMPILES)
        self._pending_reasons: dict[str, str] = {}
        self._lock = threading.Lock()
        self._current = threading.local()  # the function being backend-compiled on this thread
        self._installed = False
        self._handler: _ExplanationHandler | None = None
        self.recompile_total = 0

    # --- jax.monitoring listeners (called by JAX on the compiling thread) ---------------------------

    def _stats(self, name: str) -> FunctionStats:
        stats = self._functions.get(name)
        if stats is None:
            if len(self._functions) >= MAX_FUNCTIONS:
                name = OTHER
                stats = self._functions.get(name)
            if stats is None:
                stats = self._functions[name] = FunctionStats(name)
        return stats

    def on_scalar(self, event: str, value: float | int, **kwargs: Any) -> None:
        if event == BACKEND_EVENT:  # recorded when a backend compile starts
            self._current.name = function_name(str(kwargs.get("fun_name", "?")))

    def on_duration(self, event: str, duration_s: float, **kwargs: Any) -> None:
        if event not in (TRACE_EVENT, LOWER_EVENT, BACKEND_EVENT):
            return
        name = function_name(str(kwargs.get("fun_name", "?")))
        with self._lock:
            stats = self._stats(name)
            if event == TRACE_EVENT:
                stats.trace_count += 1
                stats.trace_time_s += duration_s
            elif event == LOWER_EVENT:
                stats.lowering_time_s += duration_s
            else:
                stats.compile_count += 1
                stats.backend_compile_time_s += duration_s
                reason = self._pending_reasons.pop(name, None)
                if stats.compile_count > 1:
                    self.recompile_total += 1
                    if reason is not None:
                        stats.last_recompile_reason = reason
                    self._recompiles.append(Recompile(stats.name, time.time(), stats.compile_count,
                                                      duration_s, reason))
        if event == BACKEND_EVENT:
            self._current.name = None

    def on_event(self, event: str, **kwargs: Any) -> None:
        if event not in (CACHE_HIT_EVENT, CACHE_MISS_EVENT):
            return
        name = getattr(self._current, "name", None) or "?"
        with self._lock:
            stats = self._stats(name)
            if event == CACHE_HIT_EVENT:
                stats.cache_hits += 1
            else:
                stats.cache_misses += 1

    def note_reason(self, function: str, reason: str) -> None:
        with self._lock:
            if len(self._pending_reasons) < MAX_FUNCTIONS:
                self._pending_reasons[function] = reason

    # --- set-up ------------------------------------------------------------------------------------

    def install(self, jax_module: Any, explain_recompiles: bool) -> None:
        """Register the listeners with an imported jax (once; explanations can be turned on later)."""
        if not self._installed:
            monitoring = jax_module.monitoring
            monitoring.register_event_duration_secs_listener(self.on_duration)
            monitoring.register_event_listener(self.on_event)
            monitoring.register_scalar_listener(self.on_scalar)
            self._installed = True
        if explain_recompiles and self._handler is None:
            jax_module.config.update("jax_explain_cache_misses", True)
            self._handler = _ExplanationHandler(self)
            logging.getLogger("jax").addHandler(self._handler)

    @property
    def installed(self) -> bool:
        return self._installed

    # --- reading ------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            functions = [f.to_dict() for f in self._functions.values()]
            recompiles = [r.to_dict() for r in self._recompiles]
        functions.sort(key=lambda f: (-f["backend_compile_time_s"] - f["trace_time_s"] - f["lowering_time_s"],
                                      f["name"]))
        return {
            "listening": self._installed,
            "compile_count": sum(f["compile_count"] for f in functions),
            "recompile_count": self.recompile_total,
            "trace_count": sum(f["trace_count"] for f in functions),
            "trace_time_s": sum(f["trace_time_s"] for f in functions),
            "lowering_time_s": sum(f["lowering_time_s"] for f in functions),
            "backend_compile_time_s": sum(f["backend_compile_time_s"] for f in functions),
            "cache_hits": sum(f["cache_hits"] for f in functions),
            "cache_misses": sum(f["cache_misses"] for f in functions),
            "functions": functions,
            "recent_recompiles": recompiles,
        }
