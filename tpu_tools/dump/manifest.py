"""The bundle's index, `manifest.json` (schema `tpu-tools/dump/v1`).

It says what ran, for how long, what came of it, and what each file is:
its size, its sha256, which collector made it, how many values were
redacted in it (counts by kind, never the values), and whether it was cut.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from tpu_tools import __version__
from tpu_tools.dump.collector import STATUS_SKIPPED, CollectedFile
from tpu_tools.dump.runner import CollectorResult
from tpu_tools.outside import MAX_STRING, check_finite, cut_all, cut_fields

SCHEMA = "tpu-tools/dump/v1"
MANIFEST_NAME = "manifest.json"

# A bundle may come from anyone, so `tpu-dump show` decodes its manifest into these same records, bounded and with
# strings cut, before summarising it; a manifest that does not fit is one error naming the field. Every field may
# be null or absent (a bundle of an older version) but the schema and each file's name.
STATUSES = ("ok", "failed", "timed_out", "skipped")
_NOT_NEGATIVE = msgspec.Meta(ge=0)
Count = Annotated[int, _NOT_NEGATIVE]
Counts = Annotated[dict[str, Count | None], msgspec.Meta(max_length=1000)]  # redactions by kind
Texts = Annotated[list[str], msgspec.Meta(max_length=100_000)]


class RedactionCounts(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How many values were redacted, by kind (never the values). A bundle's manifest may lack any of it."""

    enabled: bool | None = None
    redacted_total: Count | None = None
    by_kind: Counts | None = None


class CollectorStatus(msgspec.Struct, kw_only=True):
    """What came of one collector."""

    name: str | None = None
    status: str | None = None  # one of STATUSES
    error: str | None = None
    duration_s: Annotated[float, _NOT_NEGATIVE] | None = None

    def __post_init__(self) -> None:
        check_finite(self, "duration_s")
        cut_fields(self, {"name": 256, "status": 32, "error": MAX_STRING})


class CollectorEntry(CollectorStatus, kw_only=True):
    """A collector in the manifest: its status and the files and notes it made."""

    files: Texts | None = None
    notes: Texts | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.files, self.notes = cut_all(self.files, 4096), cut_all(self.notes)


class FileEntry(msgspec.Struct, kw_only=True):
    """One file of the bundle: its size, its sha256, its collector, its redactions, whether it was cut."""

    name: str
    collector: str | None = None
    size_bytes: Count | None = None
    sha256: str | None = None
    redactions: Counts | None = None  # kind -> values redacted
    source: str | None = None
    source_size_bytes: Count | None = None
    trimmed_from_bytes: Count | None = None

    def __post_init__(self) -> None:
        cut_fields(self, {"name": 4096, "collector": 256, "sha256": 64, "source": MAX_STRING})


class Manifest(msgspec.Struct, kw_only=True):
    """manifest.json in its JSON key order."""

    schema: str
    tool: str | None = None
    tool_version: str | None = None
    host: str | None = None
    time: str | None = None
    duration_s: Annotated[float, _NOT_NEGATIVE] | None = None
    command: Texts | None = None
    options: Any = None  # the run's options as given, shown as they are
    redaction: RedactionCounts | None = None
    collectors: Annotated[list[CollectorEntry], msgspec.Meta(max_length=1000)] | None = None
    files: Annotated[list[FileEntry], msgspec.Meta(max_length=100_000)] | None = None
    notes: Texts | None = None

    def __post_init__(self) -> None:
        check_finite(self, "duration_s")
        cut_fields(self, {"schema": 64, "tool": 64, "tool_version": 64, "host": 1024, "time": 64})
        self.command, self.notes = cut_all(self.command), cut_all(self.notes)


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
