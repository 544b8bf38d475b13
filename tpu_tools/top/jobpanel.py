"""The job screen's line of the job a process is part of across its restarts (tpu_tools.agent.joblog): its name,
step and last checkpoint from the agent, and from the job's log its goodput over its whole life, the progress its
restarts lost and how long they took to recover (`processes.jobs` of the report)."""

from __future__ import annotations

from typing import Any

from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.shorten import shorten
from tpu_tools.top.drawing import DIM, ERROR, TITLE, Line, seconds_text
from tpu_tools.units import MISSING


def _count(value: Any) -> str:
    return str(value) if isinstance(value, int) else MISSING


def _seconds(value: Any) -> str:
    return seconds_text(value) if isinstance(value, (int, float)) else MISSING


def job_life_lines(detail: dict[str, Any], report: MonitorReport, width: int) -> list[Line]:
    """Lines for an agent's entry that names its job; none for one that does not."""
    job = detail.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("id"), str):
        return []
    worker = f"  worker {job['worker']}" if isinstance(job.get("worker"), str) else ""
    lines = [Line().add(" JOB ", TITLE).add(
        shorten(f"{job['id']} ({job.get('source') or MISSING}){worker}  step {_count(job.get('step'))}  "
                f"last checkpoint {_count(job.get('last_checkpoint_step'))}", max(10, width - 6)))]
    jobs = (report.processes or {}).get("jobs") or []
    life = next((j for j in jobs if isinstance(j, dict) and j.get("job") == job["id"]), None)
    figures = life.get("goodput") if isinstance(life, dict) else None
    if isinstance(figures, dict):
        goodput = figures.get("goodput_percent")
        lines.append(Line().add(" over its life: ", DIM).add(
            f"goodput {f'{goodput:.1f}%' if isinstance(goodput, (int, float)) else MISSING}  "
            f"{_count(figures.get('disruptions'))} disruptions  lost {_seconds(figures.get('lost_progress_s'))} "
            f"({_count(figures.get('lost_progress_steps'))} steps)  recovery {_seconds(figures.get('recovery_s'))}"))
    if isinstance(life, dict) and life.get("error"):
        lines.append(Line().add(" " + shorten(str(life["error"]), max(10, width - 2)), ERROR))
    if job.get("log_error"):
        lines.append(Line().add(" " + shorten(f"job log: {job['log_error']}", max(10, width - 2)), ERROR))
    return lines
