"""What the benchmark scripts share: finding the installed programs and timing one run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def script(name: str) -> list[str]:
    """The console script next to this interpreter, else `python -m tpu_tools <subcommand>`."""
    candidate = Path(sys.executable).parent / name
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "tpu_tools", name.removeprefix("tpu-")]


def time_run(command: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of `command` (which must succeed)."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start
