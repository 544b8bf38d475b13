"""Is a job's "global" metric global? Compare it between the workers of the job at the same step.

A metric reported with `tpu_tools.agent.metric(name, value, scope="global")` claims to be the same
on every worker (the loss after the all-reduce). The workers of one job are the agents with the same
tag and the same process count (one per process of a `jax.distributed` job). Where two or more of
them report the metric at the same step with different values, or one agent already knows its value
lived on only some of the job's devices, that is a finding: one worker read its own shard.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

RELATIVE_TOLERANCE = 1e-6  # replicated values are bitwise equal; this only forgives printing round-trips


def _differ(values: list[float]) -> bool:
    low, high = min(values), max(values)
    return high - low > RELATIVE_TOLERANCE * max(abs(low), abs(high), 1e-30)


def global_metric_findings(agents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding per global metric that is not global: {tag, name, step, reason, workers[]}."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    findings: list[dict[str, Any]] = []
    for agent in agents:
        if agent.get("error"):
            continue
        for metric in agent.get("metrics") or []:
            if not isinstance(metric, dict) or metric.get("scope") != "global":
                continue
            worker = {"host": agent.get("host"), "pid": agent.get("pid"),
                      "process_index": agent.get("process_index"), "value": metric.get("value"),
                      "kind": metric.get("kind"), "step": metric.get("step")}
            if metric.get("suspect"):
                findings.append({"tag": agent.get("tag"), "name": metric.get("name"), "step": metric.get("step"),
                                 "reason": str(metric["suspect"]), "workers": [worker]})
            groups[(agent.get("tag"), agent.get("process_count"), metric.get("name"), metric.get("step"))].append(
                worker)
    for (tag, _, name, step), workers in sorted(groups.items(), key=lambda item: str(item[0])):
        values = [w["value"] for w in workers if isinstance(w["value"], (int, float)) and math.isfinite(w["value"])]
        if len(values) >= 2 and _differ(values):
            findings.append({"tag": tag, "name": name, "step": step,
                             "reason": f"differs between {len(workers)} workers at step {step} "
                                       f"({min(values):.6g} to {max(values):.6g})",
                             "workers": workers})
    return findings
