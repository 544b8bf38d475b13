"""JAX's compile events and cache-miss explanations, followed once per process for the agent and the profiler.

JAX reports each stage of a compilation through `jax.monitoring` with the
function's name: tracing to a jaxpr (`jaxpr_trace_duration`), lowering to
StableHLO (`jaxpr_to_mlir_module_duration`) and the XLA compile
(`backend_compile_duration`), plus persistent-cache hits and misses (without a
name: they are credited to the function being compiled on that thread). With
`jax_explain_cache_misses` on, it logs why a function had to be traced again:

    TRACING CACHE MISS at /path/prog.py:20:4 (<module>):
      for f defined at /path/prog.py:16
      all previously seen cache keys differ. For the closest previous key:
      different input types:
      * at x, now f32[4] and before f32[3]

JAX keeps monitoring listeners for good, so one `CompileListener` per process
(`listener()`) turns both into `CompileEvent` and `CacheMiss` records and hands
them to its sinks: the agent's `CompileTracker` (aggregates per function) and
the profiler's `CompileRecorder` (keeps every record). Both name a function
with `function_name`, so `tpu-top` and `tpu-profile` agree. The callbacks run
only when JAX compiles, never in a step that reuses a compiled program.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
XLA_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
PERSISTENT_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
PERSISTENT_CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"
_STAGES = {TRACE_EVENT: "trace", LOWERING_EVENT: "lowering", XLA_COMPILE_EVENT: "xla_compile"}

# Loggers through which jax explains cache misses (tracing cache, persistent compilation cache).
EXPLAIN_LOGGERS = ("jax._src.interpreters.partial_eval", "jax._src.compiler", "jax._src.compilation_cache")
_MISS_MARKERS = ("TRACING CACHE MISS", "PERSISTENT COMPILATION CACHE MISS")
# Other lines jax logs as warnings only because jax_explain_cache_misses is on (persistent cache bookkeeping).
_EXPLAIN_ONLY = ("Not writing persistent cache entry",)

# Transformations that name the same user function: lowering and compile events say "jit(f)", tracing says
# "f"; older JAX releases also said "shard_map(f)" for jit(shard_map(f)).
_WRAPPER = re.compile(r"(?:jit|pjit|pmap|xla_pmap|shard_map)\((.*)\)")


def function_name(fun_name: str) -> str:
    """The user function behind a name JAX reports: "jit(shard_map(f))" -> "f"; other names unchanged."""
    name = fun_name.strip()
    while True:
        match = _WRAPPER.fullmatch(name)
        if not match:
            return name
        name = match.group(1)


@dataclass
class CompileEvent:
    """One stage of one compilation."""

    stage: str  # "trace", "lowering" or "xla_compile"
    function: str
    duration_s: float
    end_time_s: float  # time.time() when the stage ended
    persistent_cache_hit: bool = False  # xla_compile only: served by the persistent compilation cache
    persistent_cache_miss: bool = False  # xla_compile only: looked up there and not found


@dataclass
class CacheMiss:
    """One of JAX's cache-miss explanations, parsed."""

    function: str
    defined_at: str | None  # "path:line" of the function's definition
    call_site: str | None  # "path:line[:col] (caller)" of the call that missed
    first_trace: bool  # the function had not been seen before: not a recompilation
    kind: str  # "types", "pytree", "context", "debug_info", "redefined", "first", "persistent", "other"
    reasons: list[str]  # one line per difference, as JAX states it
    time_s: float = 0.0
    raw: str = ""

    @property
    def is_recompile(self) -> bool:
        """A function traced again (not a first trace, not a persistent-cache miss)."""
        return not self.first_trace and self.kind != "persistent"

    def summary(self) -> str:
        """One line: the kind of difference, then the differences ("different input types; at x, now ...")."""
        heading = _KIND_TEXT.get(self.kind)
        return "; ".join([heading, *self.reasons] if heading else self.reasons)


@dataclass
class CompileLog:
    """Everything a `CompileRecorder` saw: the profiler's record of a run."""

    events: list[CompileEvent] = field(default_factory=list)
    misses: list[CacheMiss] = field(default_factory=list)
    explain_enabled: bool = False  # explanations were recorded (jax_explain_cache_misses was on)

    def to_dict(self) -> dict[str, Any]:
        return {"events": [asdict(e) for e in self.events], "misses": [asdict(m) for m in self.misses],
                "explain_enabled": self.explain_enabled}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileLog:
        return cls([CompileEvent(**e) for e in data.get("events", [])],
                   [CacheMiss(**m) for m in data.get("misses", [])], bool(data.get("explain_enabled")))


# --- parsing explanations ---------------------------------------------------------------------------

_HEADER = re.compile(r"TRACING CACHE MISS at (?P<site>.*?):\s*$")
_NEVER_SEEN = re.compile(r"^\s*(?P<name>.+?) id=\d+(?: defined at (?P<where>\S+))?\s*$")
_SEEN = re.compile(r"^\s*for (?P<name>.+?)(?: defined at (?P<where>\S+))?\s*$")
_STATIC = re.compile(r"^at input path (?P<path>\S+), now <class '[\w.]*Static'> with pytree metadata "
                     r"Static\(val=(?P<now>.*)\) and before <class '[\w.]*Static'> with pytree metadata "
                     r"Static\(val=(?P<before>.*)\), so the pytree node metadata does not match$")
_KINDS = (("different input types", "types"), ("different input pytree", "pytree"),
          ("Tracing context doesn't match", "context"), ("Debug info doesn't match", "debug_info"))
_KIND_TEXT = {kind: marker for marker, kind in _KINDS}


def parse_cache_miss(message: str, time_s: float = 0.0) -> CacheMiss | None:
    """Parse one explanation JAX logged; None for messages that are not explanations."""
    lines = message.splitlines()
    if not lines:
        return None
    if lines[0].startswith("PERSISTENT COMPILATION CACHE MISS"):
        match = re.match(r"PERSISTENT COMPILATION CACHE MISS for '(?P<module>[^']*)'", lines[0])
        module = match["module"] if match else "?"
        return CacheMiss(function_name(re.sub(r"^jit_", "", module)), None, None, False, "persistent",
                         [f"module {module} not in the persistent compilation cache"], time_s, message)
    header = _HEADER.match(lines[0])
    if not header:
        return None
    site = header["site"]
    body = [line for line in lines[1:] if line.strip()]
    if body and body[0].strip() == "never seen function:" and len(body) > 1:
        seen = _NEVER_SEEN.match(body[1])
        name, where = (seen["name"], seen["where"]) if seen else (body[1].strip(), None)
        if any("re-defined repeatedly" in line or "defined on the same line" in line for line in body[2:]):
            return CacheMiss(name, where, site, False, "redefined",
                             ["a new function object at each call: it is defined (or wrapped in jax.jit) "
                              "again every time; define it once"], time_s, message)
        return CacheMiss(name, where, site, True, "first", [], time_s, message)
    seen = _SEEN.match(body[0]) if body else None
    name, where = (seen["name"], seen["where"]) if seen else ("?", None)
    kind, reasons = "other", []
    for line in body[1:]:
        text = line.strip()
        if text.startswith("all previously seen cache keys differ"):
            continue
        for marker, marker_kind in _KINDS:
            if text.startswith(marker):
                kind = marker_kind
                break
        else:
            if text.startswith("* "):
                reasons.append(_simplify_reason(text[2:]))
            elif text and not text.startswith("http"):
                reasons.append(text)
    if kind in ("context", "debug_info") and not reasons:
        reasons = [body[-1].strip()]
    return CacheMiss(name, where, site, False, kind, reasons or ["cache miss explanation unavailable"],
                     time_s, message)


def _simplify_reason(text: str) -> str:
    static = _STATIC.match(text)
    if static:
        return f"static argument at input path {static['path']}, now {static['now']} and before {static['before']}"
    return text


# --- the one listener per process -------------------------------------------------------------------

class CompileSink(Protocol):
    """What a listener hands its records to; called on the compiling thread."""

    def add_event(self, event: CompileEvent) -> None: ...

    def add_miss(self, miss: CacheMiss) -> None: ...


class _ExplanationCatcher(logging.Filter):
    """A logger filter that keeps JAX's cache-miss explanations.

    When the program did not turn the explanations on itself, the records are
    swallowed so that its stderr stays as it would be without the tool.
    """

    def __init__(self, listener: CompileListener, pass_through: bool):
        super().__init__()
        self.listener = listener
        self.pass_through = pass_through

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 a malformed record is not ours to judge
            return True
        if message.startswith(_EXPLAIN_ONLY) or (message.startswith("Writing ")
                                                  and "to persistent compilation cache" in message):
            return self.pass_through
        if not message.startswith(_MISS_MARKERS):
            return True
        miss = parse_cache_miss(message, record.created)
        if miss is not None:
            self.listener.publish_miss(miss)
        return self.pass_through


class CompileListener:
    """Listens to jax.monitoring and (once asked) JAX's explanation logs; hands records to its sinks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sinks: list[CompileSink] = []
        self._compiling = threading.local()  # the XLA compile under way on this thread: name, cache hit/miss
        self._installed = False
        self._explaining = False

    @property
    def installed(self) -> bool:
        return self._installed

    @property
    def explaining(self) -> bool:
        return self._explaining

    def add_sink(self, sink: CompileSink) -> None:
        """Hand every later record to `sink` too (once, however often it is added)."""
        with self._lock:
            if sink not in self._sinks:
                self._sinks.append(sink)

    def remove_sink(self, sink: CompileSink) -> None:
        """Stop handing records to `sink`; a sink not added is ignored."""
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def install(self, jax_module: Any, explain: bool) -> None:
        """Register with an imported jax (once); `explain` turns on jax_explain_cache_misses (also later)."""
        with self._lock:
            if not self._installed:
                monitoring = jax_module.monitoring
                monitoring.register_event_duration_secs_listener(self._on_duration)
                monitoring.register_event_listener(self._on_event)
                monitoring.register_scalar_listener(self._on_scalar)
                self._installed = True
            if explain and not self._explaining:
                already_on = bool(jax_module.config.jax_explain_cache_misses)
                catcher = _ExplanationCatcher(self, pass_through=already_on)
                for name in EXPLAIN_LOGGERS:
                    logging.getLogger(name).addFilter(catcher)
                if not already_on:
                    jax_module.config.update("jax_explain_cache_misses", True)
                self._explaining = True

    def publish_miss(self, miss: CacheMiss) -> None:
        """Hand a parsed explanation to every sink (the explanation catcher calls this)."""
        for sink in self._current_sinks():
            sink.add_miss(miss)

    def _current_sinks(self) -> list[CompileSink]:
        with self._lock:
            return list(self._sinks)

    # jax.monitoring callbacks, called by JAX on the compiling thread.

    def _on_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        if event == XLA_COMPILE_EVENT:  # recorded when an XLA compilation starts
            self._compiling.hit = False
            self._compiling.miss = False

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event == PERSISTENT_CACHE_HIT_EVENT:
            self._compiling.hit = True
        elif event == PERSISTENT_CACHE_MISS_EVENT:
            self._compiling.miss = True

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        stage = _STAGES.get(event)
        if stage is None:
            return
        compiled = stage == "xla_compile"
        record = CompileEvent(stage, function_name(str(kwargs.get("fun_name", "?"))), float(duration), time.time(),
                              compiled and bool(getattr(self._compiling, "hit", False)),
                              compiled and bool(getattr(self._compiling, "miss", False)))
        if compiled:
            self._compiling.hit = self._compiling.miss = False
        for sink in self._current_sinks():
            sink.add_event(record)


_listener = CompileListener()


def listener() -> CompileListener:
    """This process's listener (JAX keeps monitoring listeners for good: one per process)."""
    return _listener


# --- the profiler's sink: every record ----------------------------------------------------------------

class CompileRecorder:
    """Keeps every compile event and explanation while attached; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log = CompileLog()

    def install(self, jax_module: Any) -> None:
        """Attach to this process's listener with explanations on (jax_explain_cache_misses)."""
        _listener.install(jax_module, explain=True)
        _listener.add_sink(self)
        self._log.explain_enabled = True

    def detach(self) -> None:
        """Stop recording (JAX keeps the listener; it only stops handing records to this recorder)."""
        _listener.remove_sink(self)

    def add_event(self, event: CompileEvent) -> None:
        with self._lock:
            self._log.events.append(event)

    def add_miss(self, miss: CacheMiss) -> None:
        with self._lock:
            self._log.misses.append(miss)

    def snapshot(self) -> CompileLog:
        """A copy of what was recorded so far."""
        with self._lock:
            return CompileLog(list(self._log.events), list(self._log.misses), self._log.explain_enabled)


# --- the agent's sink: figures per function -----------------------------------------------------------

MAX_FUNCTIONS = 2048  # distinct names kept; later ones are counted under OTHER
OTHER = "(other functions)"
MAX_RECOMPILES = 50  # most recent recompilations kept with their reason


@dataclass
class FunctionStats:
    name: str
    compile_count: int = 0  # XLA compiles (including persistent-cache hits)
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

    @property
    def compile_time_s(self) -> float:
        """Tracing, lowering and XLA compile together."""
        return self.trace_time_s + self.lowering_time_s + self.backend_compile_time_s

    def add(self, event: CompileEvent) -> None:
        """Count one stage of one compilation of this function."""
        if event.stage == "trace":
            self.trace_count += 1
            self.trace_time_s += event.duration_s
        elif event.stage == "lowering":
            self.lowering_time_s += event.duration_s
        else:
            self.compile_count += 1
            self.backend_compile_time_s += event.duration_s
            self.cache_hits += event.persistent_cache_hit
            self.cache_misses += event.persistent_cache_miss

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


class CompileTracker:
    """Aggregates compile events per function; `snapshot()` is read by the agent server on request.

    `listening` says whether compiles are being followed (default: JAX's listener is installed); a frontend
    that hands its events in itself (torch_xla) gives its own.
    """

    def __init__(self, listening: Callable[[], bool] | None = None) -> None:
        self._listening = listening or (lambda: _listener.installed)
        self._functions: dict[str, FunctionStats] = {}
        self._recompiles: deque[Recompile] = deque(maxlen=MAX_RECOMPILES)
        self._pending_reasons: dict[str, str] = {}
        self._lock = threading.Lock()
        self.recompile_total = 0
        self._changes = 0  # events taken so far: the last snapshot is served again until this moves
        self._served: tuple[int, bool, dict[str, Any]] | None = None  # (changes, listening, snapshot)

    def install(self, jax_module: Any, explain_recompiles: bool) -> None:
        """Attach to this process's listener; `explain_recompiles` turns on JAX's explanations."""
        _listener.install(jax_module, explain=explain_recompiles)
        _listener.add_sink(self)

    @property
    def installed(self) -> bool:
        return _listener.installed

    def _stats(self, name: str) -> FunctionStats:
        stats = self._functions.get(name)
        if stats is None:
            if len(self._functions) >= MAX_FUNCTIONS:
                name = OTHER
                stats = self._functions.get(name)
            if stats is None:
                stats = self._functions[name] = FunctionStats(name)
        return stats

    def add_event(self, event: CompileEvent) -> None:
        with self._lock:
            self._changes += 1
            stats = self._stats(event.function)
            stats.add(event)
            if event.stage == "xla_compile":
                reason = self._pending_reasons.pop(event.function, None)
                if stats.compile_count > 1:
                    self.recompile_total += 1
                    if reason is not None:
                        stats.last_recompile_reason = reason
                    self._recompiles.append(Recompile(stats.name, time.time(), stats.compile_count,
                                                      event.duration_s, reason))

    def add_miss(self, miss: CacheMiss) -> None:
        if not miss.is_recompile:
            return
        with self._lock:
            if len(self._pending_reasons) < MAX_FUNCTIONS:
                self._pending_reasons[miss.function] = miss.summary()

    def snapshot(self) -> dict[str, Any]:
        """Totals, one entry per function (most compile time first) and the recent recompilations.

        A job compiles rarely once it runs: the same snapshot is returned again until an event arrives (a
        monitor asks 10 times a second, and a job of hundreds of functions would rebuild hundreds of entries
        each time). Read it; do not change it.
        """
        listening = self._listening()
        with self._lock:
            served = self._served
            if served is not None and served[0] == self._changes and served[1] == listening:
                return served[2]
            changes = self._changes
            functions = [f.to_dict() for f in self._functions.values()]
            recompiles = [r.to_dict() for r in self._recompiles]
        functions.sort(key=lambda f: (-f["backend_compile_time_s"] - f["trace_time_s"] - f["lowering_time_s"],
                                      f["name"]))
        snapshot = {
            "listening": listening,
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
        with self._lock:
            self._served = (changes, listening, snapshot)
        return snapshot
