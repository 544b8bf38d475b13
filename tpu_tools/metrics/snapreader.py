"""Reading agents' snapshot files round after round, paying only for what changed since the last round.

A monitor reads every agent's file 10 times a second; on a host whose cores a job's threads fill, what the
reader spends is taken from the job. A `SnapshotFiles` kept from round to round (with the monitor's
connections) therefore keeps each file open and, per round, asks the kernel three things: is the path still
the file it holds (`lstat`), does a live agent still hold it (a lock probe), and what is its generation now
(one read that also takes the document, where it is about the size of the last one).
An unchanged generation is the snapshot already decoded: nothing is read into a record again. A new one is
decoded straight into its record (`agent_snapshot.decode_snapshot`), as a socket answer is.

The records returned are shared with the readers of earlier rounds: readers never change them in place (a
reader that brings a figure up to date makes a new record, `msgspec.structs.replace`).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from tpu_tools.metrics.agent_snapshot import NOT_JSON, decode_snapshot
from tpu_tools.metrics.records.agent import AgentSnapshot
from tpu_tools.metrics.rundir import private_file_problem
from tpu_tools.metrics.snapfile import (
    SnapshotFileError,
    copy_published,
    open_snapshot_file,
    writer_alive,
)
from tpu_tools.outside import OutsideError


def decode_published(document: bytes | bytearray | memoryview) -> AgentSnapshot:
    """The record of a snapshot file's document: SnapshotFileError when it is not JSON (the file's fault),
    OutsideError when its snapshot does not fit (the agent's)."""
    try:
        return decode_snapshot(document)
    except OutsideError as error:
        if str(error) == NOT_JSON:
            raise SnapshotFileError("published something that is not JSON") from error
        raise


@dataclass
class ReadCounts:
    """What the reads cost, counted (the tests assert on these, not on time)."""

    unchanged: int = 0  # reads that found the generation already decoded: nothing decoded again
    decoded: int = 0  # documents decoded


@dataclass
class PublishedSnapshot:
    """A checked snapshot read from a file, and when its agent published it."""

    snapshot: AgentSnapshot
    published_unix_s: float


@dataclass
class _Kept:
    fd: int
    device: int
    inode: int
    generation: int = 0
    published_unix_s: float = 0.0
    length: int = 0  # of the last document read
    snapshot: AgentSnapshot | None = None  # the last generation as decoded


@dataclass
class SnapshotFiles:
    """Snapshot files kept open between rounds, each with its last generation decoded."""

    counts: ReadCounts = field(default_factory=ReadCounts)
    _kept: dict[Path, _Kept] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # a round's reads, or its end, at a time

    def read(self, path: Path, max_bytes: int) -> PublishedSnapshot | None:
        """The snapshot published at `path`, decoded into its record (shared: never changed in place); None when
        there is none (no file, nothing published yet, its writer gone). Raises SnapshotFileError when the file
        is unsafe or malformed, OutsideError when its snapshot is."""
        with self._lock:
            return self._read(path, max_bytes)

    def _read(self, path: Path, max_bytes: int) -> PublishedSnapshot | None:
        kept = self._current(path)
        if kept is None:
            return None
        try:
            if not writer_alive(kept.fd):
                self._drop(path)
                return None
            held = kept.generation if kept.snapshot is not None else 0
            # one read for the header and a document the size of the last one (and a little more)
            published = copy_published(kept.fd, path, max_bytes, held=held,
                                       expect_bytes=min(max_bytes, kept.length + kept.length // 4 + 256))
        except BaseException:
            self._drop(path)
            raise
        if published is None:
            return None
        if held and published.generation == held and kept.snapshot is not None:
            self.counts.unchanged += 1
            return PublishedSnapshot(kept.snapshot, kept.published_unix_s)
        self.counts.decoded += 1
        try:
            snapshot = decode_published(published.document)
        except (SnapshotFileError, OutsideError):
            self._drop(path)
            raise
        kept.generation, kept.published_unix_s = published.generation, published.published_unix_s
        kept.length, kept.snapshot = len(published.document), snapshot
        return PublishedSnapshot(snapshot, published.published_unix_s)

    def _current(self, path: Path) -> _Kept | None:
        """The file at `path`, kept open: the one opened before while the path still names it, else opened now."""
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            self._drop(path)
            return None
        except OSError as error:
            self._drop(path)
            raise SnapshotFileError(f"{path.name} cannot be read ({error.strerror})") from error
        kept = self._kept.get(path)
        if kept is not None and (kept.device, kept.inode) == (info.st_dev, info.st_ino):
            problem = private_file_problem(info, stat.S_ISREG, "a regular file")  # a mode changed since it was opened
            if problem:
                self._drop(path)
                raise SnapshotFileError(f"{path.name} {problem}; not using it")
            return kept
        self._drop(path)
        fd = open_snapshot_file(path)
        if fd is None:
            return None
        opened = os.fstat(fd)  # what was opened, which may have replaced what lstat saw
        kept = self._kept[path] = _Kept(fd, opened.st_dev, opened.st_ino)
        return kept

    def forget_except(self, paths: Collection[Path]) -> None:
        """Close the files of every other agent (gone, or no longer read)."""
        with self._lock:
            for path in [p for p in self._kept if p not in paths]:
                self._drop(path)

    def close(self) -> None:
        self.forget_except(())

    def _drop(self, path: Path) -> None:
        kept = self._kept.pop(path, None)
        if kept is not None:
            os.close(kept.fd)
