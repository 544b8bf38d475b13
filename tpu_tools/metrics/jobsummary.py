"""Job-end summaries: the record an agent leaves when its job exits, like `dcgmi stats` after a job.

Layout: `<runtime dir>/jobs-ended/<ended unix ms>-<pid>.json`, each file mode 0600 in a 0700
directory, at most `MAX_RECORDS` of them (the oldest are removed when a new one is written).
`tpu-monitor --jobs-ended` lists them and `tpu-dump` includes them. A reader checks each file
(size, JSON, schema) and reports a bad one as an error entry; it never trusts it.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from tpu_tools.metrics.rundir import RunDirError, check_private_dir, ensure_private_dir, runtime_dir

SCHEMA = "tpu-tools/job-summary/v1"
DIRECTORY = "jobs-ended"
MAX_RECORDS = 64
MAX_RECORD_BYTES = 256 * 1024
_NAME = re.compile(r"^(\d{1,16})-(\d{1,8})\.json$", re.ASCII)


def summaries_dir(base: Path | None = None) -> Path:
    return (base or runtime_dir()) / DIRECTORY


def _finite(value: Any) -> Any:
    """JSON without NaN or infinities (they are not JSON): unknown figures become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_summary(record: dict[str, Any], base: Path | None = None) -> Path:
    """Write one record (schema added) and prune the oldest beyond MAX_RECORDS; raises OSError/RunDirError."""
    ensure_private_dir(base or runtime_dir())
    directory = summaries_dir(base)
    ensure_private_dir(directory)
    ended_ms = int(float(record.get("ended_unix_s") or 0) * 1000)
    path = directory / f"{ended_ms}-{int(record.get('pid') or os.getpid())}.json"
    data = json.dumps(_finite({"schema": SCHEMA, **record}), sort_keys=True).encode()
    staging = directory / f".{path.name}.{os.getpid()}"
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(staging, path)
    _prune(directory)
    return path


def _prune(directory: Path) -> None:
    names = sorted((int(m[1]), name) for name in os.listdir(directory) if (m := _NAME.match(name)))
    for _, name in names[:max(0, len(names) - MAX_RECORDS)]:
        try:
            os.unlink(directory / name)
        except OSError:
            pass


def read_summaries(base: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, newest first; one line per file that could not be read). A missing directory is no records."""
    directory = summaries_dir(base)
    if not directory.exists():
        return [], []
    try:
        check_private_dir(directory)
        names = [name for name in os.listdir(directory) if _NAME.match(name)]
    except (RunDirError, OSError) as error:
        return [], [str(error)]
    records: list[dict[str, Any]] = []
    errors: list[str] = []
    for name in sorted(names, key=lambda n: int(n.split("-", 1)[0]), reverse=True):
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(MAX_RECORD_BYTES + 1)
            if len(data) > MAX_RECORD_BYTES:
                raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
            record = json.loads(data)
            if not isinstance(record, dict) or record.get("schema") != SCHEMA:
                raise ValueError("not a job summary")
        except (OSError, ValueError) as error:
            errors.append(f"{path}: {error}")
            continue
        records.append(record)
    return records, errors
