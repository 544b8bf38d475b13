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
from tpu_tools.metrics.stacks import is_library

STALL_FACTOR = 10.0
STALL_FLOOR_S = 5.0
MAX_FRAMES_KEPT = 12

AskStacks = Callable[[int], Any]  # PID -> agent_client.StacksAnswer (raises AgentQueryError)


def stalled_for(steps: dict[str, Any] | None) -> float | None:
    """Seconds since the last step when the job is stalled (see the module's rule), else None."""
    if not steps:
        return None
    age, median, count = steps.get("last_step_age_s"), steps.get("p50_step_time_s"), steps.get("count")
    if not isinstance(age, (int, float)) or not isinstance(median, (int, float)) or not count or count < 2:
        return None
    return float(age) if age > max(STALL_FACTOR * median, STALL_FLOOR_S) else None


def stack_summary(answer: Any) -> dict[str, Any]:
    """{"where", "in_library", "source", "frames"} of a StacksAnswer: the main thread's innermost frames."""
    threads = answer.stacks.get("threads") or []
    main = next((t for t in threads if t.get("main")), threads[0] if threads else {})
    frames = (main.get("frames") or [])[-MAX_FRAMES_KEPT:]
    # inside a library (waiting in a collective, say), rather than in the job's own code
    return {"where": answer.where, "source": answer.source, "frames": frames,
            "in_library": bool(frames) and is_library(frames[-1]["file"]), "threads": len(threads)}


class StallStacks:
    """The stacks of each stalled job, asked once per (PID, step count)."""

    def __init__(self, ask: AskStacks):
        self._ask = ask
        self._known: dict[int, tuple[Any, dict[str, Any]]] = {}

    def stack(self, pid: int, count: Any) -> dict[str, Any]:
        known = self._known.get(pid)
        if known is not None and known[0] == count:
            return known[1]
        try:
            summary = stack_summary(self._ask(pid))
        except Exception as error:  # noqa: BLE001 an agent that cannot say is that job's note, never the report's failure
            summary = {"where": None, "error": first_line(error, limit=300)}
        self._known[pid] = (count, summary)
        return summary

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._known if p not in pids]:
            del self._known[pid]


def stall_findings(agents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job (tag) with two or more stalled workers in different places: the worker(s) whose place differs,
    {tag, workers: [{host, pid, process_index, where}], others_where, reason}."""
    jobs: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for agent in agents:
        stack = agent.get("stack") or {}
        if agent.get("stalled_s") is not None and stack.get("where"):
            jobs[agent.get("tag")].append(agent)
    findings = []
    for tag, workers in sorted(jobs.items(), key=lambda item: str(item[0])):
        places = Counter(w["stack"]["where"] for w in workers)
        if len(places) < 2:
            continue
        fewest = min(places.values())
        odd = [w for w in workers if places[w["stack"]["where"]] == fewest]
        if len({w["stack"]["where"] for w in odd}) > 1:  # tied: the one in its own code, not in a library's
            own = [w for w in odd if not w["stack"].get("in_library")]
            if not own or len({w["stack"]["where"] for w in own}) > 1:
                continue
            odd = own
        where = odd[0]["stack"]["where"]
        others = sorted({w["stack"]["where"] for w in workers if w["stack"]["where"] != where})
        findings.append({
            "tag": tag, "others_where": others,
            "workers": [{"host": w.get("host"), "pid": w.get("pid"), "process_index": w.get("process_index"),
                         "where": where} for w in odd],
            "reason": f"{len(odd)} of {len(workers)} stalled workers in {where}; the others in {', '.join(others)}",
        })
    return findings
