"""`tpu-monitor --job ID`: a job's goodput over its whole life, from its log (schema tpu-tools/job/v1); then exit."""

from __future__ import annotations

import os
import time
from typing import Any

from tpu_tools.cli.output import Output
from tpu_tools.errors import EXIT_OK, RuntimeFailure, UsageError
from tpu_tools.metrics.joblife import ProcessLife, job_life
from tpu_tools.metrics.joblog import LOG_SUFFIX, clean_job_id, job_dir, log_path, read_log
from tpu_tools.metrics.jobreport import local_pid_gone
from tpu_tools.shorten import quoted

SCHEMA = "tpu-tools/job/v1"


def _process(life: ProcessLife) -> dict[str, Any]:
    return {"process": life.process, "host_name": life.host, "pid": life.pid, "state": life.state,
            "started_unix_s": life.started_unix_s, "first_step_unix_s": life.first_step_unix_s,
            "last_seen_unix_s": life.last_seen_unix_s, "restored_step": life.restored_step,
            "last_step": life.last_step, "checkpoints": life.checkpoint_count,
            "last_checkpoint_step": life.last_checkpoint_step, "ended_unix_s": life.ended_unix_s,
            "died_unix_s": life.died_unix_s, "lost_progress_steps": life.lost_steps, "lost_progress_s": life.lost_s,
            "recovery_s": life.recovery_s, "successor": life.successor}


def job_document(job: str) -> dict[str, Any]:
    """The job's life; UsageError for a job with no log, RuntimeFailure for a log that cannot be read."""
    if clean_job_id(job) is None:
        raise UsageError(f"--job {quoted(job, 40)} is not a job name (printable text, 1 to 200 characters)")
    directory = job_dir()
    if not os.path.isdir(directory):
        raise RuntimeFailure(f"no job log directory {directory}: no job has logged here yet "
                             "(set TPU_TOOLS_JOB_DIR to the directory the job's processes write to)")
    path = log_path(job, directory)
    try:
        read = read_log(path)
    except FileNotFoundError:
        known = sorted(name[: -len(LOG_SUFFIX)] for name in os.listdir(directory) if name.endswith(LOG_SUFFIX))
        listed = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "") if known else "none"
        raise UsageError(f"no job {quoted(job, 60)} in {directory} (jobs there: {listed})") from None
    except OSError as error:
        raise RuntimeFailure(f"cannot read the log of job {quoted(job, 60)} ({path}): "
                             f"{error.strerror or error}") from None
    life = job_life(read.events, local_pid_gone, time.time())
    started = min((p.started_unix_s for p in life.processes), default=None)
    return {
        "schema": SCHEMA, "job": job, "log": str(path), "malformed_lines": read.malformed,
        "truncated": read.truncated, "state": life.state,
        "started_unix_s": started,
        "last_seen_unix_s": max((p.last_seen_unix_s for p in life.processes), default=None),
        "last_step": life.last_step, "processes": len(life.processes),
        "goodput": life.figures.to_dict(),
        "disruptions": [{"index": d.index, "died_unix_s": d.died_unix_s, "recovered_unix_s": d.recovered_unix_s,
                         "lost_progress_steps": d.lost_steps, "lost_progress_s": d.lost_s,
                         "recovery_s": d.recovery_s} for d in life.disruptions],
        "hosts": [{"host": place.place, "host_names": place.hosts, "goodput": place.figures.to_dict(),
                   "processes": [_process(p) for p in place.processes]} for place in life.places],
    }


def print_job(job: str, out: Output) -> int:
    out.json(job_document(job))
    return EXIT_OK
