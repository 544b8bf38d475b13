"""Compile events and JAX's explanations of its cache misses, recorded inside the profiled program.

JAX reports each stage of a compilation through `jax.monitoring` (tracing to a
jaxpr, lowering to StableHLO, XLA compilation; each with `fun_name`), and with
`jax_explain_cache_misses` on it logs why a function had to be traced again:

    TRACING CACHE MISS at /path/prog.py:20:4 (<module>):
      for f defined at /path/prog.py:16
      all previously seen cache keys differ. For the closest previous key:
      different input types:
      * at x, now f32[4] and before f32[3]

`CompileRecorder` collects both while the program runs; the functions below
turn them into the compile table and the recompilation report.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
XLA_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
PERSISTENT_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_STAGES = {TRACE_EVENT: "trace", LOWERING_EVENT: "lowering", XLA_COMPILE_EVENT: "xla_compile"}

# Loggers through which jax explains cache misses (tracing cache, persistent compilation cache).
EXPLAIN_LOGGERS = ("jax._src.interpreters.partial_eval", "jax._src.compiler", "jax._src.compilation_cache")
_MISS_MARKERS = ("TRACING CACHE MISS", "PERSISTENT COMPILATION CACHE MISS")
# Other lines jax logs as warnings only because jax_explain_cache_misses is on (persistent cache bookkeeping).
_EXPLAIN_ONLY = ("Not writing persistent cache entry",)


@dataclass
class CompileEvent:
    stage: str  # "trace", "lowering" or "xla_compile"
    function: str
    duration_s: float
    end_time_s: float  # time.time() when the stage ended
    persistent_cache_hit: bool = False


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


@dataclass
class CompileLog:
    events: list[CompileEvent] = field(default_factory=list)
    misses: list[CacheMiss] = field(default_factory=list)
    explain_enabled: bool = False  # explanations were recorded (jax_explain_cache_misses was on)

    def to_dict(self) -> dict:
        return {"events": [asdict(e) for e in self.events], "misses": [asdict(m) for m in self.misses],
                "explain_enabled": self.explain_enabled}

    @classmethod
    def from_dict(cls, data: dict) -> CompileLog:
        return cls([CompileEvent(**e) for e in data.get("events", [])],
                   [CacheMiss(**m) for m in data.get("misses", [])], bool(data.get("explain_enabled")))


def function_name(fun_name: str) -> str:
    """"jit(f)" -> "f": monitoring names lowering and compilation after the transformation."""
    name = fun_name.strip()
    while True:
        match = re.fullmatch(r"(?:jit|pjit|pmap|xla_pmap|shard_map)\((.*)\)", name)
        if not match:
            return name
        name = match.group(1)


# --- parsing explanations ---------------------------------------------------------------------------

_HEADER = re.compile(r"TRACING CACHE MISS at (?P<site>.*?):\s*$")
_NEVER_SEEN = re.compile(r"^\s*(?P<name>.+?) id=\d+(?: defined at (?P<where>\S+))?\s*$")
_SEEN = re.compile(r"^\s*for (?P<name>.+?)(?: defined at (?P<where>\S+))?\s*$")
_STATIC = re.compile(r"^at input path (?P<path>\S+), now <class '[\w.]*Static'> with pytree metadata "
                     r"Static\(val=(?P<now>.*)\) and before <class '[\w.]*Static'> with pytree metadata "
                     r"Static\(val=(?P<before>.*)\), so the pytree node metadata does not match$")
_KINDS = (("different input types", "types"), ("different input pytree", "pytree"),
          ("Tracing context doesn't match", "context"), ("Debug info doesn't match", "debug_info"))


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


# --- recording inside the program -------------------------------------------------------------------

class _ExplanationCatcher(logging.Filter):
    """A logger filter that keeps JAX's cache-miss explanations.

    When the user did not ask for the explanations themselves, the records are
    swallowed so that the program's stderr stays as it would be without the tool.
    """

    def __init__(self, recorder: CompileRecorder, pass_through: bool):
        super().__init__()
        self.recorder = recorder
        self.pass_through = pass_through

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        if message.startswith(_EXPLAIN_ONLY) or (message.startswith("Writing ")
                                                  and "to persistent compilation cache" in message):
            return self.pass_through
        if not message.startswith(_MISS_MARKERS):
            return True
        miss = parse_cache_miss(message, record.created)
        if miss is not None:
            self.recorder.add_miss(miss)
        return self.pass_through


class CompileRecorder:
    """Listens to jax.monitoring and JAX's explanation logs; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log = CompileLog()
        self._compiling = threading.local()  # the function whose XLA compile is under way, per thread

    def install(self, jax_module: Any) -> None:
        """Hook into an imported jax; turns on jax_explain_cache_misses."""
        monitoring = jax_module.monitoring
        monitoring.register_event_duration_secs_listener(self._on_duration)
        monitoring.register_event_listener(self._on_event)
        monitoring.register_scalar_listener(self._on_scalar)
        already_on = bool(jax_module.config.jax_explain_cache_misses)
        catcher = _ExplanationCatcher(self, pass_through=already_on)
        for name in EXPLAIN_LOGGERS:
            logging.getLogger(name).addFilter(catcher)
        if not already_on:
            jax_module.config.update("jax_explain_cache_misses", True)
        self._log.explain_enabled = True

    def _on_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        if event == XLA_COMPILE_EVENT:  # recorded when an XLA compilation starts
            self._compiling.name = function_name(str(kwargs.get("fun_name", "?")))
            self._compiling.hit = False

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event == PERSISTENT_CACHE_HIT_EVENT:
            self._compiling.hit = True

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        stage = _STAGES.get(event)
        if stage is None:
            return
        hit = stage == "xla_compile" and bool(getattr(self._compiling, "hit", False))
        record = CompileEvent(stage, function_name(str(kwargs.get("fun_name", "?"))), float(duration),
                              time.time(), hit)
        with self._lock:
            self._log.events.append(record)

    def add_miss(self, miss: CacheMiss) -> None:
        with self._lock:
            self._log.misses.append(miss)

    def snapshot(self) -> CompileLog:
        with self._lock:
            return CompileLog(list(self._log.events), list(self._log.misses), self._log.explain_enabled)


# --- tables -----------------------------------------------------------------------------------------

@dataclass
class CompileRow:
    function: str
    defined_at: str | None
    compiles: int  # XLA compilations (including ones served by the persistent cache)
    traces: int
    compile_time_s: float  # trace + lowering + XLA compile
    trace_time_s: float
    lowering_time_s: float
    xla_compile_time_s: float
    persistent_cache_hits: int
    calls: int | None  # dispatches seen in the trace window
    cache_hits: int | None  # calls served by the in-memory cache (no compile), within the trace window


@dataclass
class Recompilation:
    function: str
    defined_at: str | None
    recompiles: int
    reasons: list[dict]  # {"reason", "count", "call_sites"}


def compile_rows(log: CompileLog, calls: dict[str, tuple[int, int]] | None = None,
                 base_dir: str | None = None) -> list[CompileRow]:
    """One row per function, most compile time first.

    `calls` maps a function to (calls seen in the trace, of which served from the cache without compiling).
    """
    rows: dict[str, CompileRow] = {}
    for event in log.events:
        row = rows.setdefault(event.function, CompileRow(event.function, None, 0, 0, 0.0, 0.0, 0.0, 0.0, 0,
                                                          None, None))
        row.compile_time_s += event.duration_s
        if event.stage == "trace":
            row.traces += 1
            row.trace_time_s += event.duration_s
        elif event.stage == "lowering":
            row.lowering_time_s += event.duration_s
        else:
            row.compiles += 1
            row.xla_compile_time_s += event.duration_s
            row.persistent_cache_hits += event.persistent_cache_hit
    for miss in log.misses:
        if miss.function in rows and miss.defined_at and rows[miss.function].defined_at is None:
            rows[miss.function].defined_at = relative_location(miss.defined_at, base_dir)
    if calls is not None:
        for name, row in rows.items():
            row.calls, row.cache_hits = calls.get(name, (0, 0))
    return sorted(rows.values(), key=lambda r: (-r.compile_time_s, r.function))


def recompilations(log: CompileLog, base_dir: str | None = None) -> list[Recompilation]:
    """Recompilations grouped by function and definition, with JAX's reasons and where they were called."""
    groups: dict[tuple[str, str | None], dict[str, dict]] = {}
    for miss in log.misses:
        if miss.first_trace or miss.kind == "persistent":
            continue
        key = (miss.function, relative_location(miss.defined_at, base_dir) if miss.defined_at else None)
        reasons = groups.setdefault(key, {})
        for reason in miss.reasons:
            entry = reasons.setdefault(reason, {"reason": reason, "count": 0, "call_sites": []})
            entry["count"] += 1
            site = relative_location(miss.call_site, base_dir) if miss.call_site else None
            if site and site not in entry["call_sites"]:
                entry["call_sites"].append(site)
    result = []
    for (function, where), reasons in groups.items():
        count = sum(1 for m in log.misses if not m.first_trace and m.kind != "persistent"
                    and m.function == function
                    and (relative_location(m.defined_at, base_dir) if m.defined_at else None) == where)
        result.append(Recompilation(function, where, count, sorted(reasons.values(), key=lambda r: -r["count"])))
    return sorted(result, key=lambda r: (-r.recompiles, r.function))


def user_functions(log: CompileLog) -> set[str]:
    """Functions JAX traced from the user's files (it explains misses only for those)."""
    return {m.function for m in log.misses if m.kind != "persistent"}


def relative_location(location: str, base_dir: str | None) -> str:
    """"/cwd/dir/prog.py:12 (f)" -> "dir/prog.py:12 (f)" when under base_dir."""
    if not base_dir:
        return location
    prefix = base_dir.rstrip(os.sep) + os.sep
    return location[len(prefix):] if location.startswith(prefix) else location
