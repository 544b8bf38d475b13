"""The job screen's goodput lines: goodput, MFU and cost, a bar of where the time went, and the job's metrics.

One letter per cause in the bar (P productive, S start-up, C compile, D data, K checkpoint, E eval,
H host work, I idle, O the job's own phases), as wide as its share of the wall time since the job
started; the legend under it gives each cause's share and seconds. Unknown figures read "unknown".
"""

from __future__ import annotations

from tpu_tools.metrics.records.jobs import AgentEntry
from tpu_tools.top.drawing import BAR_HIGH, BAR_LOW, BAR_MID, DIM, NORMAL, TITLE, WARN, Line, seconds_text
from tpu_tools.units import format_number

_LETTERS = {"productive": ("P", BAR_LOW), "startup": ("S", BAR_MID), "compile": ("C", BAR_HIGH),
            "data": ("D", BAR_MID), "checkpoint": ("K", BAR_MID), "eval": ("E", BAR_MID), "host": ("H", BAR_MID),
            "idle": ("I", BAR_HIGH)}
_OTHER = ("O", BAR_MID)
UNKNOWN = "unknown"
MAX_METRICS_SHOWN = 4


def _percent(value: float | None) -> str:
    return f"{value:.1f}%" if value is not None else UNKNOWN


def _number(value: float | None) -> str:
    return format_number(value) if value is not None else UNKNOWN


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


def goodput_lines(detail: AgentEntry, width: int) -> list[Line]:
    """Lines for an agent's entry; none when the agent serves no goodput (an older agent)."""
    figures = detail.goodput
    if figures is None or figures.since_start is None:
        return []
    since = figures.since_start
    recent = figures.recent
    # the recent span's figure where the job reports a recent span, else the whole run's
    cost = recent.cost_per_million_samples if recent is not None else since.cost_per_million_samples
    mfu = recent.mfu_percent if recent is not None else since.mfu_percent
    lines = [Line().add(" GOODPUT ", TITLE).add(
        f"{_percent(since.goodput_percent)} since start, {_percent(recent.goodput_percent if recent else None)} "
        f"recent  MFU {_percent(mfu)}  samples/s {_number(recent.samples_per_s if recent else None)}  "
        f"cost/1M samples {_number(cost)}")]
    wall = since.wall_s or 0.0
    causes = since.causes_s or {}  # cause -> seconds: a map, as the job names its phases
    if wall > 0 and causes:
        lines.append(_bar(causes, wall, width))
        legend = Line().add(" ")
        for seconds, cause in sorted(((s, c) for c, s in causes.items() if s > 0), reverse=True):
            letter, _ = _LETTERS.get(cause, _OTHER)
            legend.add(f"{letter} {cause} {100 * seconds / wall:.0f}% {seconds_text(seconds)}  ",
                       NORMAL if cause == "productive" else DIM)
        lines.append(legend)
    problems = [*(figures.problems or []), *([figures.last_error] if figures.last_error else [])]
    for problem in problems[:2]:
        lines.append(Line().add(f" {problem}", WARN))
    for metric in detail.metrics[:MAX_METRICS_SHOWN]:
        text = (f" {metric.name} {_number(metric.value)}  step "
                f"{metric.step}  {metric.scope or 'no scope'}, {metric.kind}")
        lines.append(Line().add(text, NORMAL).add(f"  {metric.suspect}" if metric.suspect else "", WARN))
    return lines
