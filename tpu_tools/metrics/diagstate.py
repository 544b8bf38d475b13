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
from typing import Annotated, Any, Literal

import msgspec

from tpu_tools import jsonout
from tpu_tools.atomic import write_file
from tpu_tools.metrics.records.diag import DiagCheck, DiagResult
from tpu_tools.metrics.rundir import RunDirError, check_private_dir, ensure_private_dir, runtime_dir
from tpu_tools.outside import OutsideError, cut, decode_json

FILE_NAME = "diag-last.json"
MAX_BYTES = 8 << 20
STATUS_VALUES = {"pass": 0, "fail": 1, "warn": 2, "skip": 3}
SCHEMA = "tpu-tools/diag/v1"
Status = Literal["pass", "fail", "warn", "skip"]
_NOT_NEGATIVE = msgspec.Meta(ge=0)


# What the readers use of the document (the rest of it is kept in the file for tpu-dump); strings are cut, as
# what reads them shows them.
class _Figures(msgspec.Struct):
    digest: str | None = None
    key: str | None = None


class _Check(msgspec.Struct):
    test: str
    status: Status
    device: Annotated[int, _NOT_NEGATIVE] | None = None
    link: str | None = None
    why: str | None = None
    found_at: str | None = None
    figures: _Figures | None = None

    def __post_init__(self) -> None:
        self.test = self.test[:80]
        self.link, self.why, self.found_at = cut(self.link, 40), cut(self.why, 300), cut(self.found_at, 64)

    def record(self) -> DiagCheck:
        figures = self.figures or _Figures()
        return DiagCheck(test=self.test, status=self.status, device=self.device, link=self.link, why=self.why or "",
                         found_at=self.found_at, digest=cut(figures.digest, 16), key=cut(figures.key, 16))


class _Document(msgspec.Struct):
    schema: Literal["tpu-tools/diag/v1"]
    time: str
    status: Literal["pass", "fail", "warn", "skip", "interrupted"]
    level: Annotated[int, msgspec.Meta(ge=1, le=4)] | None = None
    platform: str | None = None
    interrupted: bool | None = None
    # absent: a document written before partial runs were kept apart
    last_complete_time: str | None | msgspec.UnsetType = msgspec.UNSET
    checks: Annotated[list[_Check], msgspec.Meta(max_length=100_000)] | None = None

    def __post_init__(self) -> None:
        self.time, self.platform = self.time[:64], cut(self.platform, 20)
        if isinstance(self.last_complete_time, str):
            self.last_complete_time = self.last_complete_time[:64]


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
    checks: list[DiagCheck] = field(default_factory=list)

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

    def failed(self) -> list[DiagCheck]:
        return [c for c in self.checks if c.status == "fail"]

    def to_record(self, now: float | None = None) -> DiagResult:
        age = self.age_s(now)
        return DiagResult(path=self.path, error=self.error, time=self.time, time_unix_s=self.time_unix_s,
                          age_s=None if age is None else round(age, 1), level=self.level, platform=self.platform,
                          status=self.status, interrupted=self.interrupted, failed_checks=len(self.failed()),
                          complete_time_unix_s=self.complete_unix_s, checks=list(self.checks))


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
        _fill(last, decode_json(path.read_bytes(), _Document))
    except (OSError, RunDirError, ValueError) as error:  # OutsideError is a ValueError
        last.error = f"{path}: {error}"
    return last


class LastDiagReader:
    """`read_last` for a reader that asks every round (tpu-top, tpu-monitor): the file is decoded again only
    when it is another file or changed (its inode, size, modification or status change time); the runtime
    directory's ownership and mode are checked at every read."""

    def __init__(self, directory: Path | None = None):
        self._directory = directory
        self._seen: tuple[str, int, int, int, int, int] | None = None
        self._last: LastDiag | None = None

    def read(self) -> LastDiag | None:
        path = last_path(self._directory)
        try:
            check_private_dir(path.parent)
            stat = os.lstat(path)
        except (OSError, RunDirError):  # no file (no run yet), or a directory read_last says is unsafe
            self._seen = None
            return read_last(self._directory)
        seen = (str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if seen != self._seen:
            self._last = read_last(self._directory)
            self._seen = seen if self._last is not None and self._last.error is None else None
        return self._last


def _unix_time(text: str, name: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise OutsideError(f"{name}: {text!r} is not an ISO 8601 time") from None


def _fill(last: LastDiag, document: _Document) -> None:
    last.time = document.time
    last.time_unix_s = _unix_time(document.time, "time")
    last.level, last.platform, last.status = document.level, document.platform, document.status
    last.interrupted = document.interrupted is True
    # A document without the field was written before partial runs were kept apart: its own time, if complete.
    complete = document.last_complete_time if document.last_complete_time is not msgspec.UNSET else (
        None if last.interrupted else document.time)
    last.complete_unix_s = _unix_time(complete, "last_complete_time") if complete else None
    last.checks = [check.record() for check in document.checks or []]
