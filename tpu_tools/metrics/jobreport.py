"""The jobs this host's agents belong to, over their whole lives, for the monitor's report and the exporter.

Each agent names its job's log (`job.log` of its snapshot, tpu_tools.agent.joblog); each log is read once per
round whatever the number of the job's processes here, and read again only when it changed or `REREAD_S` passed
(a process that died writes nothing more, and its state is read from whether its PID is gone).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tpu_tools.metrics.joblife import Figures, ProcessLife, job_life
from tpu_tools.metrics.joblog import host_name, read_log
from tpu_tools.metrics.records.jobs import AgentEntry, JobLife, JobLifeFigures
from tpu_tools.metrics.rundir import pid_alive

REREAD_S = 10.0


def job_figures(figures: Figures) -> JobLifeFigures:
    return JobLifeFigures(wall_s=figures.wall_s, goodput_percent=figures.goodput_percent, causes_s=figures.causes_s,
                          disruptions=figures.disruptions, lost_progress_steps=figures.lost_steps,
                          lost_progress_s=figures.lost_s, recovery_s=figures.recovery_s)


def local_pid_gone(process: ProcessLife) -> bool:
    """Whether a process of this host is gone (one of another host: unknown here, so not)."""
    return process.host == host_name() and not pid_alive(process.pid)


def read_job(job: str, log: str) -> JobLife:
    """The job's life from its log; a log that cannot be read gives `error`."""
    try:
        read = read_log(Path(log))
    except OSError as error:
        return JobLife(job=job, log=log, error=f"cannot read the job's log {log}: {error.strerror or error}")
    life = job_life(read.events, local_pid_gone, time.time())
    return JobLife(job=job, log=log, state=life.state, processes=len(life.processes), last_step=life.last_step,
                   goodput=job_figures(life.figures) if life.figures else None)


class JobLogs:
    """The reports of the jobs the agents name, each log read again only when it changed or REREAD_S passed."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, str], tuple[Any, JobLife]] = {}

    def reports(self, agents: list[AgentEntry]) -> list[JobLife]:
        named: dict[tuple[str, str], None] = {}
        for agent in agents:
            if agent.job is not None and agent.job.log is not None:
                named[(agent.job.id, agent.job.log)] = None
        found = []
        for key in named:
            try:
                info = os.stat(key[1])
                version: Any = (info.st_mtime_ns, info.st_size, int(time.monotonic() // REREAD_S))
            except OSError:
                version = None
            kept = self._read.get(key)
            if kept is None or version is None or kept[0] != version:
                kept = (version, read_job(*key))
                self._read[key] = kept
            found.append(kept[1])
        self._read = {key: value for key, value in self._read.items() if key in named}
        return found
