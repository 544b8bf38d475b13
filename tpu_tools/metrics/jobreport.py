"""The jobs this host's agents belong to, over their whole lives, for the monitor's report and the exporter.

Each agent names its job's log (`job.log` of its snapshot, tpu_tools.agent.joblog); each log is read once per
round whatever the number of the job's processes here, and read again only when it changed or `REREAD_S` passed
(a process that died writes nothing more, and its state is read from whether its PID is gone).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tools.metrics.joblife import Figures, ProcessLife, job_life
from tpu_tools.metrics.joblog import host_name, read_log
from tpu_tools.metrics.rundir import pid_alive

REREAD_S = 10.0


@dataclass
class JobReport:
    job: str
    log: str
    state: str | None = None
    processes: int = 0
    last_step: int | None = None
    figures: Figures | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "log": self.log, "state": self.state, "processes": self.processes,
                "last_step": self.last_step, "goodput": self.figures.to_dict() if self.figures else None,
                "error": self.error}


def local_pid_gone(process: ProcessLife) -> bool:
    """Whether a process of this host is gone (one of another host: unknown here, so not)."""
    return process.host == host_name() and not pid_alive(process.pid)


def read_job(job: str, log: str) -> JobReport:
    """The job's life from its log; a log that cannot be read gives `error`."""
    report = JobReport(job, log)
    try:
        read = read_log(Path(log))
    except OSError as error:
        report.error = f"cannot read the job's log {log}: {error.strerror or error}"
        return report
    life = job_life(read.events, local_pid_gone, time.time())
    report.state, report.processes, report.last_step = life.state, len(life.processes), life.last_step
    report.figures = life.figures
    return report


class JobLogs:
    """The reports of the jobs the agents name, each log read again only when it changed or REREAD_S passed."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, str], tuple[Any, JobReport]] = {}

    def reports(self, agents: list[dict[str, Any]]) -> list[JobReport]:
        named: dict[tuple[str, str], None] = {}
        for agent in agents:
            job = agent.get("job")
            if isinstance(job, dict) and isinstance(job.get("id"), str) and isinstance(job.get("log"), str):
                named[(job["id"], job["log"])] = None
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
