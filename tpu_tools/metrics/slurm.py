"""The Slurm job a process belongs to: SLURM_JOB_ID in its environment (/proc/PID/environ).

Only readable for the exporter's own user's processes, or all of them as root; anything else (no such
process, no permission, no variable, a value that is no job id) is None, never an error.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_ENVIRON_BYTES = 1 << 20  # an environment is a few KiB; read no more than this of a hostile one
JOB_ID = re.compile(rb"^[0-9]{1,20}(_[0-9]{1,10})?$")  # a job, or an array job's task (1234_7)
KEY = b"SLURM_JOB_ID="


def job_id(pid: int, root: Path) -> str | None:
    """The process's SLURM_JOB_ID, or None."""
    try:
        with (root / "proc" / str(pid) / "environ").open("rb") as handle:
            data = handle.read(MAX_ENVIRON_BYTES)
    except OSError:
        return None
    for entry in data.split(b"\0"):
        if entry.startswith(KEY):
            value = entry[len(KEY):]
            return value.decode() if JOB_ID.match(value) else None
    return None
