"""The last `tpu-diag` result, kept in the runtime directory for tpu-monitor, tpu-top and tpu-dump.

`diag-last.json` in the private runtime directory (see `rundir`) holds the whole `tpu-tools/diag/v1`
document of the last run on this host, written atomically. Readers treat it as outside input: a file
that is not ours, not private, too large or not the document yields a `LastDiag` whose `error` says why.

The file is the node's health, so `record_run` keeps it honest: a run with an injected fault is never
written (it says nothing about the hardware); an interrupted run that finished no check leaves the file as
it was; an interrupted run with checks is written as partial, keeping every failure of the run before that
it did not re-run, and the time of the last complete run (`last_complete_time`), which the age reported for
staleness counts from.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tpu_tools import jsonout
from tpu_tools.atomic import write_file
from tpu_tools.metrics.rundir import RunDirError, check_private_dir, ensure_private_dir, runtime_dir
from tpu_tools.records import Bool, Int, List, Obj, RecordError, Str, parse

FILE_NAME = "diag-last.json"
MAX_BYTES = 8 << 20
STATUS_VALUES = {"pass": 0, "fail": 1, "warn": 2, "skip": 3}
SCHEMA = "tpu-tools/diag/v1"
_STATUS = Str(one_of=tuple(STATUS_VALUES), nullable=False)
_RUN_STATUS = Str(one_of=(*STATUS_VALUES, "interrupted"), nullable=False)

# What the readers use of the document; the rest of it is kept in the file for tpu-dump.
CHECK = Obj({"test": Str(80, nullable=False), "status": _STATUS, "device": Int(min=0), "link": Str(40),
             "why": Str(300), "found_at": Str(64), "figures": Obj({"digest": Str(16), "key": Str(16)})},
            required=("test", "status"))
DOCUMENT = Obj({"schema": Str(one_of=(SCHEMA,), nullable=False), "time": Str(64, nullable=False),
                "level": Int(min=1, max=4), "platform": Str(20), "status": _RUN_STATUS, "interrupted": Bool(),
                "last_complete_time": Str(64), "checks": List(CHECK, max_items=100_000)},
               required=("schema", "time", "status"))


@dataclass
class LastCheck:
    test: str
    status: str
    device: int | None
    link: str | None
    why: str
    found_at: str | None = None  # an earlier run's failure, kept by a partial run that did not re-run it
    digest: str | None = None  # a GEMM's digest and its comparability key (see diag.reference)
    key: str | None = None


@dataclass
class LastDiag:
    path: str
    error: str | None = None
    time: str | None = None
    time_unix_s: float | None = None
    level: int | None = None
    platform: str | None = None
    status: str | None = None
    interrupted: bool = False
    complete_unix_s: float | None = None  # when the last complete run started (None: none was)
    checks: list[LastCheck] = field(default_factory=list)

    def age_s(self, now: float | None = None) -> float | None:
        """Seconds since the last complete run started: a partial run does not make the record younger."""
        if self.complete_unix_s is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.complete_unix_s)

    def device_status(self) -> dict[int, str]:
        """Each device's worst status in the last run (fail, warn, pass; skip only when nothing ran)."""
        order = ("fail", "warn", "pass", "skip")
        worst: dict[int, str] = {}
        for check in self.checks:
            if check.device is None:
                continue
            current = worst.get(check.device)
            if current is None or order.index(check.status) < order.index(current):
                worst[check.device] = check.status
        return worst

    def failed(self) -> list[LastCheck]:
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        age = self.age_s(now)
        return {"path": self.path, "error": self.error, "time": self.time, "time_unix_s": self.time_unix_s,
                "age_s": None if age is None else round(age, 1), "level": self.level, "platform": self.platform,
                "status": self.status, "interrupted": self.interrupted, "failed_checks": len(self.failed()),
                "complete_time_unix_s": self.complete_unix_s, "checks": [vars(c) for c in self.checks]}


def last_path(directory: Path | None = None) -> Path:
    return (directory or runtime_dir()) / FILE_NAME


def write_last(document: dict[str, Any], directory: Path | None = None) -> Path:
    """Keep `document` as the last result; raises RunDirError when the directory cannot be used."""
    folder = ensure_private_dir(directory or runtime_dir())
    return write_file(folder / FILE_NAME, jsonout.dumps(document) + "\n", True,
                      what="the last diagnostic result", mode=0o600)


def _check_key(check: dict[str, Any]) -> tuple[Any, Any, Any]:
    return check.get("test"), check.get("device"), check.get("link")


def _previous(directory: Path | None) -> dict[str, Any] | None:
    """The document kept now, when it is a readable one (a damaged file is replaced)."""
    last = read_last(directory)
    if last is None or last.error:
        return None
    try:
        document = json.loads(Path(last.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def recorded_document(document: dict[str, Any], previous: dict[str, Any] | None) -> tuple[dict[str, Any] | None,
                                                                                        str | None]:
    """What a run leaves as the node's health: (the document to write, or None; why not, or a note)."""
    if (document.get("settings") or {}).get("inject"):
        return None, "a run with an injected fault is not this host's health: the last result is unchanged"
    if not document.get("interrupted"):
        return {**document, "last_complete_time": document.get("time")}, None
    checks = list(document.get("checks") or [])
    if not checks:
        return None, "the run was interrupted before any check ended: the last result is unchanged"
    before = previous or {}
    done = {_check_key(c) for c in checks}
    kept = [{**c, "found_at": c.get("found_at") or before.get("time")} for c in before.get("checks") or []
            if isinstance(c, dict) and c.get("status") == "fail" and _check_key(c) not in done]
    complete = before.get("last_complete_time") if before else None
    if before and not before.get("interrupted") and not complete:
        complete = before.get("time")  # a document kept before the field existed
    note = f"{len(kept)} failure(s) of the run before, not re-run, are kept" if kept else None
    return {**document, "checks": checks + kept, "last_complete_time": complete}, note


def record_run(document: dict[str, Any], directory: Path | None = None) -> str | None:
    """Keep a run's document as the node's health under the rules above; returns a note for the user, if any.
    Raises RunDirError (or UsageError, OSError) when the directory cannot be used."""
    kept, note = recorded_document(document, _previous(directory))
    if kept is not None:
        write_last(kept, directory)
    return note


def read_last(directory: Path | None = None) -> LastDiag | None:
    """The last result, or None when no run has left one."""
    path = last_path(directory)
    if not os.path.lexists(path):
        return None
    last = LastDiag(str(path))
    try:
        check_private_dir(path.parent)
        if path.is_symlink() or not path.is_file():
            raise ValueError("is not a regular file")
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"is larger than {MAX_BYTES >> 20} MiB")
        document = json.loads(path.read_text(encoding="utf-8"))
        _fill(last, document)
    except (OSError, RunDirError, ValueError) as error:  # RecordError is a ValueError
        last.error = f"{path}: {error}"
    return last


def _fill(last: LastDiag, document: Any) -> None:
    record = parse(DOCUMENT, document)
    last.time = record["time"]
    try:
        last.time_unix_s = datetime.fromisoformat(record["time"]).timestamp()
    except ValueError:
        raise RecordError(f"time: {record['time']!r} is not an ISO 8601 time") from None
    last.level, last.platform, last.status = record["level"], record["platform"], record["status"]
    last.interrupted = record["interrupted"] is True
    # A document without the field was written before partial runs were kept apart: its own time, if complete.
    complete = record["last_complete_time"] if "last_complete_time" in document else (
        None if last.interrupted else record["time"])
    try:
        last.complete_unix_s = datetime.fromisoformat(complete).timestamp() if complete else None
    except ValueError:
        raise RecordError(f"last_complete_time: {complete!r} is not an ISO 8601 time") from None
    last.checks = [LastCheck(c["test"], c["status"], c["device"], c["link"], c["why"] or "", c["found_at"],
                             (c["figures"] or {}).get("digest"), (c["figures"] or {}).get("key"))
                   for c in record["checks"] or []]
