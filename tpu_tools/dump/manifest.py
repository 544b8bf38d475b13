"""The bundle's index, `manifest.json` (schema `tpu-tools/dump/v1`).

It says what ran, for how long, what came of it, and what each file is:
its size, its sha256, which collector made it, how many values were
redacted in it (counts by kind, never the values), and whether it was cut.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from tpu_tools import __version__
from tpu_tools.dump.collector import STATUS_SKIPPED, CollectedFile
from tpu_tools.dump.runner import CollectorResult
from tpu_tools.records import AnyJSON, Bool, Float, Int, List, Map, Obj, Str

SCHEMA = "tpu-tools/dump/v1"
MANIFEST_NAME = "manifest.json"

# What a reader accepts: a bundle may come from anyone, so `tpu-dump show` checks its manifest field by field
# (records.parse) before summarising it; a manifest that does not fit is one error naming the field.
_COUNTS = Map(Int(min=0), max_items=1000)
MANIFEST = Obj({
    "schema": Str(64), "tool": Str(64), "tool_version": Str(64), "host": Str(1024), "time": Str(64),
    "duration_s": Float(min=0.0), "command": List(Str(), max_items=10_000), "options": AnyJSON(),
    "redaction": Obj({"enabled": Bool(), "redacted_total": Int(min=0), "by_kind": _COUNTS}),
    "collectors": List(Obj({"name": Str(256), "status": Str(32), "error": Str(), "duration_s": Float(min=0.0),
                            "files": List(Str(4096)), "notes": List(Str())}), max_items=1000),
    "files": List(Obj({"name": Str(4096), "collector": Str(256), "size_bytes": Int(min=0), "sha256": Str(64),
                       "redactions": _COUNTS, "source": Str(), "source_size_bytes": Int(min=0),
                       "trimmed_from_bytes": Int(min=0)}, required=("name",))),
    "notes": List(Str()),
}, required=("schema",))
STATUSES = ("ok", "failed", "timed_out", "skipped")


class RedactionCounts(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How many values were redacted, by kind (never the values). A bundle's manifest may lack any of it."""

    enabled: bool | None = None
    redacted_total: int | None = None
    by_kind: dict[str, int | None] | None = None


class CollectorStatus(msgspec.Struct, kw_only=True):
    """What came of one collector."""

    name: str | None = None
    status: str | None = None  # one of STATUSES
    error: str | None = None
    duration_s: float | None = None


class CollectorEntry(CollectorStatus, kw_only=True):
    """A collector in the manifest: its status and the files and notes it made."""

    files: list[str | None] | None = None
    notes: list[str | None] | None = None


class FileEntry(msgspec.Struct, kw_only=True):
    """One file of the bundle: its size, its sha256, its collector, its redactions, whether it was cut."""

    name: str
    collector: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    redactions: dict[str, int | None] | None = None  # kind -> values redacted
    source: str | None = None
    source_size_bytes: int | None = None
    trimmed_from_bytes: int | None = None


class Manifest(msgspec.Struct, kw_only=True):
    """manifest.json in its JSON key order. Read back from a bundle (checked against MANIFEST first), any field
    but the schema may be missing or null."""

    schema: str
    tool: str | None = None
    tool_version: str | None = None
    host: str | None = None
    time: str | None = None
    duration_s: float | None = None
    command: list[str | None] | None = None
    options: Any = None  # the run's options as given
    redaction: RedactionCounts | None = None
    collectors: list[CollectorEntry] | None = None
    files: list[FileEntry] | None = None
    notes: list[str | None] | None = None


@dataclass
class StoredFile:
    """A collected file as it goes into the archive (possibly shortened to fit --max-size)."""

    file: CollectedFile
    data: bytes
    trimmed_from_bytes: int | None = None

    @property
    def name(self) -> str:
        return self.file.name

    def entry(self) -> FileEntry:
        return FileEntry(name=self.file.name, collector=self.file.collector, size_bytes=len(self.data),
                         sha256=hashlib.sha256(self.data).hexdigest(),
                         redactions=dict(sorted(self.file.redactions.items())), source=self.file.source,
                         source_size_bytes=self.file.source_size_bytes, trimmed_from_bytes=self.trimmed_from_bytes)


def collector_entry(result: CollectorResult) -> CollectorEntry:
    return CollectorEntry(name=result.name, status=result.status, error=result.error, duration_s=result.duration_s,
                          files=[f.name for f in result.files], notes=list(result.notes))


def skipped_result(name: str, reason: str) -> CollectorResult:
    return CollectorResult(name=name, status=STATUS_SKIPPED, error=reason)


def build_manifest(*, host: str, time: str, duration_s: float, command: list[str], options: dict[str, Any],
                   results: list[CollectorResult], stored: list[StoredFile], redaction_enabled: bool,
                   notes: list[str]) -> Manifest:
    by_kind: dict[str, int] = {}
    for item in stored:
        for kind, count in item.file.redactions.items():
            by_kind[kind] = by_kind.get(kind, 0) + count
    return Manifest(schema=SCHEMA, tool="tpu-tools", tool_version=__version__, host=host, time=time,
                    duration_s=round(duration_s, 3), command=list(command), options=options,
                    redaction=RedactionCounts(enabled=redaction_enabled, redacted_total=sum(by_kind.values()),
                                              by_kind=dict(sorted(by_kind.items()))),
                    collectors=[collector_entry(r) for r in results], files=[item.entry() for item in stored],
                    notes=list(notes))
