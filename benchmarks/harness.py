"""What the benchmark scripts share: finding the installed programs and timing one run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def script(name: str) -> list[str]:
    """The console script next to this interpreter, else `python -m tpu_tools <subcommand>`."""
    candidate = Path(sys.executable).parent / name
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "tpu_tools", name.removeprefix("tpu-")]


def private_workdir(prefix: str = "ttbench") -> tuple[Path, Path]:
    """(a new folder under /tmp for a benchmark's files, its private run directory `run` inside it, mode 0700 as
    the agents require); the caller removes the folder."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    rundir = workdir / "run"
    rundir.mkdir(mode=0o700)
    return workdir, rundir


def time_run(command: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of `command` (which must succeed)."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def monitor_report(document: dict[str, Any]) -> Any:
    """A monitor report record (tpu_tools.metrics.records.report) from a document of its JSON shape, a header it
    leaves out blank: the groups are decoded into their records as a saved tpu-monitor line would be."""
    from tpu_tools.metrics.records.report import report_from_document

    return report_from_document(document)
