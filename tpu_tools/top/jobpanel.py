"""The job screen's line of the job a process is part of across its restarts (tpu_tools.agent.joblog): its name,
step and last checkpoint from the agent, and from the job's log its goodput over its whole life, the progress its
restarts lost and how long they took to recover (`processes.jobs` of the report)."""

from __future__ import annotations

from tpu_tools.metrics.records.jobs import AgentEntry
from tpu_tools.metrics.records.report import MonitorReport
from tpu_tools.shorten import shorten
from tpu_tools.top.drawing import DIM, ERROR, TITLE, Line, seconds_text
from tpu_tools.units import MISSING


def _count(value: int | None) -> str:
    return str(value) if value is not None else MISSING


def _seconds(value: float | None) -> str:
    return seconds_text(value) if value is not None else MISSING


def job_life_lines(agent: AgentEntry, report: MonitorReport, width: int) -> list[Line]:
    """Lines for an agent's entry that names its job; none for one that does not."""
    job = agent.job
    if job is None:
        return []
    worker = f"  worker {job.worker}" if job.worker is not None else ""
    lines = [Line().add(" JOB ", TITLE).add(
        shorten(f"{job.id} ({job.source or MISSING}){worker}  step {_count(job.step)}  "
                f"last checkpoint {_count(job.last_checkpoint_step)}", max(10, width - 6)))]
    jobs = report.processes.jobs if report.processes is not None else []
    life = next((j for j in jobs if j.job == job.id), None)
    figures = life.goodput if life is not None else None
    if figures is not None:
        goodput = figures.goodput_percent
        lines.append(Line().add(" over its life: ", DIM).add(
            f"goodput {f'{goodput:.1f}%' if goodput is not None else MISSING}  "
            f"{_count(figures.disruptions)} disruptions  lost {_seconds(figures.lost_progress_s)} "
            f"({_count(figures.lost_progress_steps)} steps)  recovery {_seconds(figures.recovery_s)}"))
    if life is not None and life.error:
        lines.append(Line().add(" " + shorten(life.error, max(10, width - 2)), ERROR))
    if job.log_error:
        lines.append(Line().add(" " + shorten(f"job log: {job.log_error}", max(10, width - 2)), ERROR))
    return lines
