"""A stalled job on its screen: how long since its last step, and where its main thread is.

The monitor marks the job stalled (tpu_tools.metrics.stall) and asks its agent
for its stacks once per step count; this draws what came back, innermost
frame first.
"""

from __future__ import annotations

import os

from tpu_tools.metrics.records.jobs import AgentEntry, StallStack
from tpu_tools.shorten import shorten
from tpu_tools.top.drawing import DIM, ERROR, TITLE, Line
from tpu_tools.units import MISSING

MAX_FRAME_LINES = 8


def stall_lines(detail: AgentEntry, width: int) -> list[Line]:
    """Nothing for a job that steps; for a stalled one, its stall and its main thread's innermost frames."""
    stalled = detail.stalled_s
    if stalled is None:
        return []
    median = detail.steps.p50_step_time_s if detail.steps is not None else None
    median_text = MISSING if median is None else f"{median * 1e3:.1f} ms"
    lines = [Line(), Line().add(f" STALLED: no step for {stalled:.0f} s (median step {median_text})", ERROR)]
    stack = detail.stack if isinstance(detail.stack, StallStack) else StallStack()
    if isinstance(stack.error, str):
        return [*lines, Line().add(shorten(f"  its stacks could not be read: {stack.error}", width), ERROR)]
    if not stack.where:
        return lines
    source = "faulthandler: it holds its interpreter's lock" if stack.source == "faulthandler" else "its agent"
    lines.append(Line().add(" main thread in ", TITLE).add(shorten(f"{stack.where}  (from {source})", width - 16)))
    frames = stack.frames if isinstance(stack.frames, list) else []
    for frame in list(reversed(frames))[:MAX_FRAME_LINES]:
        text = f"   {frame.function}  {os.path.basename(frame.file)}:{frame.line}"
        lines.append(Line().add(shorten(text, width), DIM))
    return lines
