"""The compile table and the recompilation report of a profiled run, from its `CompileLog`.

The records come from `tpu_tools.instrument.compiles` (the listener the agent
uses too, so both name a function the same way).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tpu_tools.instrument.compiles import CompileLog, FunctionStats

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
    stats: dict[str, FunctionStats] = {}
    for event in log.events:
        stats.setdefault(event.function, FunctionStats(event.function)).add(event)
    rows = {name: CompileRow(name, None, s.compile_count, s.trace_count, s.compile_time_s, s.trace_time_s,
                             s.lowering_time_s, s.backend_compile_time_s, s.cache_hits, None, None)
            for name, s in stats.items()}
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
