"""`tpu-monitor --jobs-ended`: the summaries agents left when their jobs ended, newest first; then exit."""

from __future__ import annotations

from typing import Any

from tpu_tools.cli.output import Output
from tpu_tools.errors import EXIT_OK

SCHEMA = "tpu-tools/jobs-ended/v1"


def jobs_ended_document() -> dict[str, Any]:
    """The records of this user's runtime directory (unreadable files are listed under errors)."""
    from tpu_tools.metrics.jobsummary import read_summaries, summaries_dir

    records, errors = read_summaries()
    return {"schema": SCHEMA, "directory": str(summaries_dir()), "jobs": records, "errors": errors}


def print_jobs_ended(out: Output) -> int:
    out.json(jobs_ended_document())
    return EXIT_OK
