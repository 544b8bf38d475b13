"""A stalled job on its screen: how long since its last step, and where its main thread is.

The monitor marks the job stalled (tpu_tools.metrics.stall) and asks its agent
for its stacks once per step count; this draws what came back, innermost
frame first.
"""

from __future__ import annotations

import os
from typing import Any

from tpu_tools.shorten import shorten
from tpu_tools.top.drawing import DIM, ERROR, TITLE, Line
from tpu_tools.units import MISSING

MAX_FRAME_LINES = 8


def stall_lines(detail: dict[str, Any], width: int) -> list[Line]:
    """Nothing for a job that steps; for a stalled one, its stall and its main thread's innermost frames."""
    stalled = detail.get("stalled_s")
    if stalled is None:
        return []
    median = (detail.get("steps") or {}).get("p50_step_time_s")
    median_text = MISSING if median is None else f"{median * 1e3:.1f} ms"
    lines = [Line(), Line().add(f" STALLED: no step for {stalled:.0f} s (median step {median_text})", ERROR)]
    stack = detail.get("stack") or {}
    if stack.get("error"):
        return [*lines, Line().add(shorten(f"  its stacks could not be read: {stack['error']}", width), ERROR)]
    if not stack.get("where"):
        return lines
    source = "faulthandler: it holds its interpreter's lock" if stack.get("source") == "faulthandler" else "its agent"
    lines.append(Line().add(" main thread in ", TITLE).add(shorten(f"{stack['where']}  (from {source})", width - 16)))
    for frame in list(reversed(stack.get("frames") or []))[:MAX_FRAME_LINES]:
        text = f"   {frame.get('function')}  {os.path.basename(str(frame.get('file')))}:{frame.get('line')}"
        lines.append(Line().add(shorten(text, width), DIM))
    return lines
