"""The jobs across restarts in the fleet view: each job's figures over its whole life from the exporters'
`tpu_tools_job_*` series (tpu_tools.exporter.jobs), and which job each process is part of.

Every host whose exporter reads a job's shared log serves the same figures; where hosts read logs of their own,
the fleet's figure of a job is its worst host's (the largest loss, recovery and disruptions, the lowest goodput).
"""

from __future__ import annotations

from typing import Any

from tpu_tools.metrics.fleet.client import Sample

PREFIX = "tpu_tools_job_"
# series -> (the figure of `tpu-monitor --job`'s goodput, scale, the worst of several hosts)
FIGURES = {"goodput_ratio": ("goodput_percent", 100.0, min), "lost_progress_seconds": ("lost_progress_s", 1.0, max),
           "lost_progress_steps": ("lost_progress_steps", 1.0, max), "recovery_seconds": ("recovery_s", 1.0, max),
           "disruptions": ("disruptions", 1.0, max)}
_COUNTS = ("lost_progress_steps", "disruptions")


def fleet_jobs(series: list[Sample], host_of: Any) -> list[dict[str, Any]]:
    """processes.jobs[] of the fleet report: {job, hosts[], goodput {...}}, sorted by job; `host_of(labels)`
    names a sample's host."""
    jobs: dict[str, dict[str, Any]] = {}
    for sample in series:
        figure = FIGURES.get(sample.name.removeprefix(PREFIX)) if sample.name.startswith(PREFIX) else None
        name = sample.labels.get("job_id")
        if figure is None or not name:
            continue
        key, scale, worst = figure
        job = jobs.setdefault(name, {"job": name, "log": None, "state": None, "processes": None, "last_step": None,
                                     "hosts": [], "goodput": {}, "error": None})
        host = host_of(sample.labels)
        if host not in job["hosts"]:
            job["hosts"].append(host)
        value = sample.value * scale
        value = int(value) if key in _COUNTS else round(value, 9)
        job["goodput"][key] = value if key not in job["goodput"] else worst(job["goodput"][key], value)
    for job in jobs.values():
        job["hosts"].sort()
    return [jobs[name] for name in sorted(jobs)]
