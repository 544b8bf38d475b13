"""The compilation cache section of tpu-top's job screen: directory, hits and misses, why keys missed, late settings."""

from __future__ import annotations

import time

from tpu_tools.metrics.records.jobs import AgentEntry
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.top.drawing import DIM, ERROR, NORMAL, TITLE, WARN, Line, seconds_text

MAX_MISSES = 4


def _wrapped(text: str, width: int, indent: str, style: str) -> list[Line]:
    room = max(10, width - len(indent))
    return [Line().add(indent + text[start:start + room], style) for start in range(0, min(len(text), 4 * room), room)]


def cache_section(detail: AgentEntry, width: int) -> list[Line]:
    """Lines for one job's persistent compilation cache (nothing from an agent that does not report it)."""
    cache = detail.compilation_cache
    if cache is None:
        return []
    directory = cache.dir_in_use or cache.dir_configured
    lines = [Line(), Line().add(" Compilation cache", TITLE).add(f"  {directory or 'not set'}", NORMAL if directory
                                                                  else DIM)]
    written = cache.entries_written
    failures = cache.deserialize_failures  # torch_xla's: entries found but unreadable
    lines.append(Line().add(
        f"  {cache.hits} hits, {cache.misses} misses of {cache.lookups} lookups, "
        + (f"{written} entries written, {seconds_text(cache.seconds_saved_s)} saved" if written is not None
           else f"{failures or 0} unreadable entries"), NORMAL))
    for setting in cache.set_too_late or []:
        lines += _wrapped(str(setting.message), width, "  ! ", ERROR)
    for miss in (cache.recent_misses or [])[-MAX_MISSES:][::-1]:
        when = time.strftime("%H:%M:%S", time.localtime(miss.time_unix_s or 0))
        lines += _wrapped(f"{when} miss {miss.explanation}", width, "  ", WARN if miss.differing else DIM)
    return lines


MAX_SHARED = 2


def shared_cache_lines(report: MonitorReport, width: int) -> list[Line]:
    """One warning line per compilation cache written by more than one process (or host), naming the writers."""
    shared = report.processes.shared_cache_dirs if report.processes is not None else []
    lines = [Line().add(" ! ", ERROR).add(found.message, WARN) for found in shared[:MAX_SHARED]]
    if len(shared) > MAX_SHARED:
        lines.append(Line().add(f"   ... {len(shared) - MAX_SHARED} more shared cache directories (tpu-monitor)",
                                DIM))
    return [line.cut(width) for line in lines]
