"""The job screen's goodput lines: goodput, MFU and cost, a bar of where the time went, and the job's metrics.

One letter per cause in the bar (P productive, S start-up, C compile, D data, K checkpoint, E eval,
H host work, I idle, O the job's own phases), as wide as its share of the wall time since the job
started; the legend under it gives each cause's share and seconds. Unknown figures read "unknown".
"""

from __future__ import annotations

from typing import Any

from tpu_tools.top.drawing import BAR_HIGH, BAR_LOW, BAR_MID, DIM, NORMAL, TITLE, WARN, Line, seconds_text
from tpu_tools.units import format_number

_LETTERS = {"productive": ("P", BAR_LOW), "startup": ("S", BAR_MID), "compile": ("C", BAR_HIGH),
            "data": ("D", BAR_MID), "checkpoint": ("K", BAR_MID), "eval": ("E", BAR_MID), "host": ("H", BAR_MID),
            "idle": ("I", BAR_HIGH)}
_OTHER = ("O", BAR_MID)
UNKNOWN = "unknown"
MAX_METRICS_SHOWN = 4


def _percent(value: Any) -> str:
    return f"{value:.1f}%" if isinstance(value, (int, float)) else UNKNOWN


def _number(value: Any) -> str:
    return format_number(value) if isinstance(value, (int, float)) else UNKNOWN


def _bar(causes: dict[str, float], wall: float, width: int) -> Line:
    line = Line().add(" ")
    room = max(10, width - 2)
    shares = sorted(((seconds, cause) for cause, seconds in causes.items() if seconds > 0), reverse=True)
    used = 0
    for index, (seconds, cause) in enumerate(shares):
        cells = room - used if index == len(shares) - 1 else round(room * seconds / wall)
        cells = max(0, min(cells, room - used))
        letter, style = _LETTERS.get(cause, _OTHER)
        line.add(letter * cells, style)
        used += cells
    return line


def goodput_lines(detail: dict[str, Any], width: int) -> list[Line]:
    """Lines for an agent's entry; none when the agent serves no goodput (an older agent)."""
    figures = detail.get("goodput")
    if not isinstance(figures, dict) or not isinstance(figures.get("since_start"), dict):
        return []
    since = figures["since_start"]
    recent = figures.get("recent") or {}
    cost = recent.get("cost_per_million_samples", since.get("cost_per_million_samples"))
    lines = [Line().add(" GOODPUT ", TITLE).add(
        f"{_percent(since.get('goodput_percent'))} since start, {_percent(recent.get('goodput_percent'))} "
        f"recent  MFU {_percent(recent.get('mfu_percent', since.get('mfu_percent')))}  "
        f"samples/s {_number(recent.get('samples_per_s'))}  cost/1M samples {_number(cost)}")]
    wall = since.get("wall_s") or 0.0
    causes = {str(k): float(v) for k, v in (since.get("causes_s") or {}).items() if isinstance(v, (int, float))}
    if wall > 0 and causes:
        lines.append(_bar(causes, wall, width))
        legend = Line().add(" ")
        for seconds, cause in sorted(((s, c) for c, s in causes.items() if s > 0), reverse=True):
            letter, _ = _LETTERS.get(cause, _OTHER)
            legend.add(f"{letter} {cause} {100 * seconds / wall:.0f}% {seconds_text(seconds)}  ",
                       NORMAL if cause == "productive" else DIM)
        lines.append(legend)
    problems = [*(figures.get("problems") or []), *([figures["last_error"]] if figures.get("last_error") else [])]
    for problem in problems[:2]:
        lines.append(Line().add(f" {problem}", WARN))
    for metric in (detail.get("metrics") or [])[:MAX_METRICS_SHOWN]:
        text = (f" {metric.get('name')} {_number(metric.get('value'))}  step "
                f"{metric.get('step')}  {metric.get('scope') or 'no scope'}, {metric.get('kind')}")
        lines.append(Line().add(text, NORMAL).add(f"  {metric['suspect']}" if metric.get("suspect") else "", WARN))
    return lines
