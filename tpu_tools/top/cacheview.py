"""The compilation cache section of tpu-top's job screen: directory, hits and misses, why keys missed, late settings."""

from __future__ import annotations

import time
from typing import Any

from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.top.drawing import DIM, ERROR, NORMAL, TITLE, WARN, Line, seconds_text

MAX_MISSES = 4


def _wrapped(text: str, width: int, indent: str, style: str) -> list[Line]:
    room = max(10, width - len(indent))
    return [Line().add(indent + text[start:start + room], style) for start in range(0, min(len(text), 4 * room), room)]


def cache_section(detail: dict[str, Any], width: int) -> list[Line]:
    """Lines for one job's persistent compilation cache (nothing from an agent that does not report it)."""
    cache = detail.get("compilation_cache")
    if not isinstance(cache, dict):
        return []
    directory = cache.get("dir_in_use") or cache.get("dir_configured")
    lines = [Line(), Line().add(" Compilation cache", TITLE).add(f"  {directory or 'not set'}", NORMAL if directory
                                                                  else DIM)]
    written = cache.get("entries_written", 0)
    failures = cache.get("deserialize_failures")  # torch_xla's: entries found but unreadable
    lines.append(Line().add(
        f"  {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses of {cache.get('lookups', 0)} lookups, "
        + (f"{written} entries written, {seconds_text(cache.get('seconds_saved_s'))} saved" if written is not None
           else f"{failures or 0} unreadable entries"), NORMAL))
    for setting in cache.get("set_too_late") or []:
        if isinstance(setting, dict):
            lines += _wrapped(str(setting.get("message")), width, "  ! ", ERROR)
    misses = [m for m in cache.get("recent_misses") or [] if isinstance(m, dict)]
    for miss in misses[-MAX_MISSES:][::-1]:
        when = time.strftime("%H:%M:%S", time.localtime(miss.get("time_unix_s") or 0))
        lines += _wrapped(f"{when} miss {miss.get('explanation')}", width, "  ", WARN if miss.get("differing")
                          else DIM)
    return lines


MAX_SHARED = 2


def shared_cache_lines(report: MonitorReport, width: int) -> list[Line]:
    """One warning line per compilation cache written by more than one process (or host), naming the writers."""
    group = report.processes
    shared = group.get("shared_cache_dirs") if isinstance(group, dict) else None
    if not isinstance(shared, list):
        return []
    lines = [Line().add(" ! ", ERROR).add(str(found.get("message")), WARN)
             for found in shared[:MAX_SHARED] if isinstance(found, dict)]
    if len(shared) > MAX_SHARED:
        lines.append(Line().add(f"   ... {len(shared) - MAX_SHARED} more shared cache directories (tpu-monitor)",
                                DIM))
    return [line.cut(width) for line in lines]
