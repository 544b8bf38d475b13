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

from tpu_tools.metrics.records.jobs import AgentEntry, GlobalMetricFinding, MetricWorker

RELATIVE_TOLERANCE = 1e-6  # replicated values are bitwise equal; this only forgives printing round-trips


def _differ(values: list[float]) -> bool:
    low, high = min(values), max(values)
    return high - low > RELATIVE_TOLERANCE * max(abs(low), abs(high), 1e-30)


def global_metric_findings(agents: list[AgentEntry]) -> list[GlobalMetricFinding]:
    """One finding per global metric that is not global: its tag, name, step, reason and workers."""
    groups: dict[tuple[Any, ...], list[MetricWorker]] = defaultdict(list)
    findings: list[GlobalMetricFinding] = []
    for agent in agents:
        if agent.error:
            continue
        for metric in agent.metrics:
            if metric.scope != "global":
                continue
            worker = MetricWorker(host=agent.host_name, pid=agent.pid, process_index=agent.process_index,
                                  value=metric.value, kind=metric.kind, step=metric.step)
            if metric.suspect:
                findings.append(GlobalMetricFinding(tag=agent.tag, name=metric.name, step=metric.step,
                                                    reason=metric.suspect, workers=[worker]))
            groups[(agent.tag, agent.process_count, metric.name, metric.step)].append(worker)
    for (tag, _, name, step), workers in sorted(groups.items(), key=lambda item: str(item[0])):
        values = [w.value for w in workers if w.value is not None and math.isfinite(w.value)]
        if len(values) >= 2 and _differ(values):
            findings.append(GlobalMetricFinding(
                tag=tag, name=name, step=step, workers=workers,
                reason=f"differs between {len(workers)} workers at step {step} ({min(values):.6g} to "
                       f"{max(values):.6g})"))
    return findings
