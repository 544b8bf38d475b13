"""Stalled jobs and where they are: a job whose steps stopped, its stack, and the worker that differs.

A job is stalled when its last step ended more than STALL_FACTOR times its
median step ago, and at least STALL_FLOOR_S ago (a fast job pausing for a
second to evaluate is not stalled). Of a stalled job the monitor asks the
agent for its stacks once per step count (a stuck job's stack does not move;
a job stuck holding its interpreter's lock answers through faulthandler, see
tpu_tools.agent.stacks) and keeps where its main thread is.

The workers of one job (agents with the same tag) that stalled together are
compared by where they are: seven in an all-reduce, one still loading data,
the one whose place is shared by the fewest is named. Where the places are
tied (two workers), the one in the job's own code is named rather than one
inside a library (the collective it waits in).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from tpu_tools.errors import first_line
from tpu_tools.metrics.records.jobs import AgentEntry, EntrySteps, StackFrame, StalledWorker, StallFinding, StallStack
from tpu_tools.metrics.stacks import is_library, main_thread

STALL_FACTOR = 10.0
STALL_FLOOR_S = 5.0
MAX_FRAMES_KEPT = 12

AskStacks = Callable[[int], Any]  # PID -> agent_client.StacksAnswer (raises AgentQueryError)


def stalled_for(steps: EntrySteps | None) -> float | None:
    """Seconds since the last step when the job is stalled (see the module's rule), else None."""
    if steps is None:
        return None
    age, median, count = steps.last_step_age_s, steps.p50_step_time_s, steps.count
    if age is None or median is None or not count or count < 2:
        return None
    return float(age) if age > max(STALL_FACTOR * median, STALL_FLOOR_S) else None


def stack_summary(answer: Any) -> StallStack:
    """Where the main thread of a StacksAnswer is, and its innermost frames."""
    main = main_thread(answer.stacks)
    frames = [StackFrame(file=frame.file or "?", line=frame.line, function=frame.function)
              for frame in ((main.frames if main is not None else None) or [])[-MAX_FRAMES_KEPT:]]
    # inside a library (waiting in a collective, say), rather than in the job's own code
    return StallStack(where=answer.where, source=answer.source, frames=frames,
                      in_library=bool(frames) and is_library(frames[-1].file),
                      threads=len(answer.stacks.threads or []))


class StallStacks:
    """The stacks of each stalled job, asked once per (PID, step count)."""

    def __init__(self, ask: AskStacks):
        self._ask = ask
        self._known: dict[int, tuple[Any, StallStack]] = {}

    def stack(self, pid: int, count: Any) -> StallStack:
        known = self._known.get(pid)
        if known is not None and known[0] == count:
            return known[1]
        try:
            summary = stack_summary(self._ask(pid))
        except Exception as error:  # noqa: BLE001 an agent that cannot say is that job's note, never the report's failure
            summary = StallStack(where=None, error=first_line(error, limit=300))
        self._known[pid] = (count, summary)
        return summary

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._known if p not in pids]:
            del self._known[pid]


def _where(agent: AgentEntry) -> str | None:
    return agent.stack.where if isinstance(agent.stack, StallStack) else None


def _in_library(agent: AgentEntry) -> bool:
    return isinstance(agent.stack, StallStack) and agent.stack.in_library is True


def stall_findings(agents: list[AgentEntry]) -> list[StallFinding]:
    """Per job (tag) with two or more stalled workers in different places: the worker(s) whose place differs."""
    jobs: dict[Any, list[AgentEntry]] = defaultdict(list)
    for agent in agents:
        if agent.stalled_s is not None and _where(agent):
            jobs[agent.tag].append(agent)
    findings = []
    for tag, workers in sorted(jobs.items(), key=lambda item: str(item[0])):
        places = Counter(_where(w) for w in workers)
        if len(places) < 2:
            continue
        fewest = min(places.values())
        odd = [w for w in workers if places[_where(w)] == fewest]
        if len({_where(w) for w in odd}) > 1:  # tied: the one in its own code, not in a library's
            own = [w for w in odd if not _in_library(w)]
            if not own or len({_where(w) for w in own}) > 1:
                continue
            odd = own
        where = str(_where(odd[0]))
        others = sorted({str(_where(w)) for w in workers if _where(w) != where})
        findings.append(StallFinding(
            tag=tag, others_where=others,
            workers=[StalledWorker(host=w.host_name, pid=w.pid, process_index=w.process_index, where=where)
                     for w in odd],
            reason=f"{len(odd)} of {len(workers)} stalled workers in {where}; the others in {', '.join(others)}"))
    return findings
