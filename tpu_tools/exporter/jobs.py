"""Prometheus families of the jobs across restarts (tpu_tools.metrics.jobreport): goodput over a job's whole life,
the progress its restarts lost and how long they took to recover, labelled job_id (Prometheus's own `job` label
names the scrape job); and which job each process is part of, as an info series to join on (a job label on every
process series would multiply them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from tpu_tools.exporter.naming import PREFIX
from tpu_tools.metrics.labeltext import label_value
from tpu_tools.metrics.records.jobs import AgentEntry, JobLifeFigures, ProcessesGroup


def job_families(data: ProcessesGroup, labels: list[str],
                 values_of: Callable[[AgentEntry], list[str]]) -> Iterator[Metric]:
    info = GaugeMetricFamily(f"{PREFIX}process_job_info", "1 for the job a process is part of across its restarts "
                             "(python -m tpu_tools.agent --job, $TPU_TOOLS_JOB, its Kubernetes or Slurm job).",
                             labels=[*labels, "job_id"])
    for agent in data.agents:
        if agent.job is not None and not agent.error:
            info.add_metric([*values_of(agent), label_value(agent.job.id)], 1.0)
    yield info
    gauges = [(GaugeMetricFamily(f"{PREFIX}job_{name}", doc, labels=["job_id"]), figure, scale)
              for name, figure, scale, doc in _FIGURES]
    for job in data.jobs:
        if job.goodput is None:
            continue
        name = label_value(job.job)
        for family, figure, scale in gauges:
            value = figure(job.goodput)
            if value is not None:
                family.add_metric([name], value / scale)
    yield from (family for family, _, _ in gauges)


# series name, the figure of a job's whole life (JobLifeFigures), what it is divided by in the series, help
_FIGURES: list[tuple[str, Callable[[JobLifeFigures], float | int | None], float, str]] = [
    ("goodput_ratio", lambda f: f.goodput_percent, 100.0, "Productive share of the job's whole life, across its "
     "restarts and hosts, less the progress its restarts lost (0 to 1)."),
    ("lost_progress_seconds", lambda f: f.lost_progress_s, 1.0, "Time the job's processes spent on steps after the "
     "checkpoint their successors resumed from, over its whole life (each disruption: its worst host)."),
    ("lost_progress_steps", lambda f: f.lost_progress_steps, 1.0, "Steps the job's restarts repeated, over its "
     "whole life."),
    ("recovery_seconds", lambda f: f.recovery_s, 1.0, "Time from each death of a process of the job to its "
     "successors' first step, summed over its whole life."),
    ("disruptions", lambda f: f.disruptions, 1.0, "Processes of the job that died (the most of any host)."),
]
