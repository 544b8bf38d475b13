"""Prometheus families of the jobs across restarts (tpu_tools.metrics.jobreport): goodput over a job's whole life,
the progress its restarts lost and how long they took to recover, labelled job_id (Prometheus's own `job` label
names the scrape job); and which job each process is part of, as an info series to join on (a job label on every
process series would multiply them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from tpu_tools.exporter.naming import PREFIX
from tpu_tools.metrics.labeltext import label_value


def job_families(data: dict[str, Any], labels: list[str],
                 values_of: Callable[[dict[str, Any]], list[str]]) -> Iterator[Metric]:
    info = GaugeMetricFamily(f"{PREFIX}process_job_info", "1 for the job a process is part of across its restarts "
                             "(python -m tpu_tools.agent --job, $TPU_TOOLS_JOB, its Kubernetes or Slurm job).",
                             labels=[*labels, "job_id"])
    for agent in data.get("agents") or []:
        job = agent.get("job") if not agent.get("error") else None
        if isinstance(job, dict) and isinstance(job.get("id"), str):
            info.add_metric([*values_of(agent), label_value(job["id"])], 1.0)
    yield info
    gauges = {key: GaugeMetricFamily(f"{PREFIX}job_{name}", doc, labels=["job_id"]) for key, name, doc in [
        ("goodput_percent", "goodput_ratio", "Productive share of the job's whole life, across its restarts and "
         "hosts, less the progress its restarts lost (0 to 1)."),
        ("lost_progress_s", "lost_progress_seconds", "Time the job's processes spent on steps after the "
         "checkpoint their successors resumed from, over its whole life (each disruption: its worst host)."),
        ("lost_progress_steps", "lost_progress_steps", "Steps the job's restarts repeated, over its whole life."),
        ("recovery_s", "recovery_seconds", "Time from each death of a process of the job to its successors' first "
         "step, summed over its whole life."),
        ("disruptions", "disruptions", "Processes of the job that died (the most of any host)."),
    ]}
    for job in data.get("jobs") or []:
        figures = job.get("goodput") if isinstance(job, dict) else None
        if not isinstance(figures, dict):
            continue
        name = label_value(str(job.get("job")))
        for key, family in gauges.items():
            value = figures.get(key)
            if isinstance(value, (int, float)):
                family.add_metric([name], value / 100.0 if key == "goodput_percent" else float(value))
    yield from gauges.values()
