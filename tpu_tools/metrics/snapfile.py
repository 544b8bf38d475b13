"""The published snapshot file: an agent's latest snapshot, read by monitors without waking the job.

Layout of `<run dir>/agent-<pid>.snap` (little-endian)::

    0   8s  magic b"TPUSNAP1"
    8   Q   generation: odd while the agent writes, even when the content is whole
    16  Q   length of the JSON document that follows the header
    24  I   CRC-32 of that document
    28  I   (zero)
    32  d   when it was published (Unix seconds)
    64  ... the JSON document (one agent answer, as the socket would send it)

The agent writes through a shared mapping (seqlock: generation to odd, content,
generation to even) and holds an exclusive `flock` on the file for as long as it
lives, so a reader tells a live agent's file from a dead one's without asking
it. A reader copies the content with `pread` (never a mapping: a file cut short
under a mapping would kill the reader with SIGBUS), retries while the
generation is odd or moves, and checks the CRC: a torn copy is never used. It
opens the file without following links or blocking and uses it only when it is
a regular file of this user with mode 0600, as it does the socket beside it.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import stat
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from tpu_tools.metrics.rundir import private_file_problem

MAGIC = b"TPUSNAP1"
HEADER = struct.Struct("<8sQQIId")
HEADER_SIZE = 64
_GENERATION = struct.Struct("<Q")
_GENERATION_AT = 8
_FIRST_CAPACITY = 64 << 10
# A writer holds the generation odd for the time it takes to copy one snapshot (microseconds for a few KiB);
# a reader tries again at once a few times, then every millisecond, and gives up after READ_PATIENCE_S.
_QUICK_TRIES = 16
READ_PATIENCE_S = 0.5


class SnapshotFileError(Exception):
    """The snapshot file cannot be used; the message says why in one sentence."""


@functools.lru_cache(maxsize=4096)
def snapshot_file_for(socket: Path) -> Path:
    """The snapshot file beside an agent's socket: agent-<pid>.sock -> agent-<pid>.snap. The same path object for
    the same socket, made once: a monitor asks for every agent's twice a round, and keys its open files by it
    (a new path object would hash its text again each time)."""
    return socket.with_suffix(".snap")


@dataclass
class Published:
    """One whole snapshot read from a file: its JSON bytes and when the agent published it."""

    document: bytes
    published_unix_s: float
    generation: int


def read_snapshot_file(path: Path, max_bytes: int) -> Published | None:
    """The snapshot an agent published at `path`; None when there is none to read (no file, nothing published yet,
    or no live writer holding it: the caller asks the socket). Raises SnapshotFileError when the file is unsafe,
    malformed, larger than `max_bytes` or never still long enough to copy."""
    fd = open_snapshot_file(path)
    if fd is None:
        return None
    try:
        return copy_published(fd, path, max_bytes) if writer_alive(fd) else None
    finally:
        os.close(fd)


def open_snapshot_file(path: Path) -> int | None:
    """A read-only descriptor of the snapshot file at `path`, checked (a regular file of this user, mode 0600, no
    link followed); None when there is no file. Raises SnapshotFileError when it is unsafe or cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise SnapshotFileError(f"{path.name} cannot be opened ({error.strerror})") from error
    try:
        problem = private_file_problem(os.fstat(fd), stat.S_ISREG, "a regular file")
    except OSError as error:
        os.close(fd)
        raise SnapshotFileError(f"{path.name} cannot be read ({error.strerror})") from error
    if problem:
        os.close(fd)
        raise SnapshotFileError(f"{path.name} {problem}; not using it")
    return fd


def writer_alive(fd: int) -> bool:
    """Whether a live agent holds the file open behind `fd` (its exclusive lock); when none does (its writer is
    gone, a PID reused since), the caller asks the socket what is there now."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def copy_published(fd: int, path: Path, max_bytes: int, *, held: int = 0, expect_bytes: int = 0) -> Published | None:
    """The whole snapshot in the open file `fd` (named `path` in errors); None when nothing is published yet.

    A reader that already holds generation `held` gets it back with an empty document while the file is still
    at it (nothing copied), and one that `expect_bytes` about that many copies the header and the document in
    one read where they fit.
    """
    deadline, tries = time.monotonic() + READ_PATIENCE_S, 0
    while tries < _QUICK_TRIES or time.monotonic() < deadline:
        if tries >= _QUICK_TRIES:
            time.sleep(0.001)
        tries += 1
        head = os.pread(fd, HEADER_SIZE + expect_bytes, 0)
        if len(head) < HEADER_SIZE:
            raise SnapshotFileError(f"{path.name} is shorter than its header")
        magic, generation, length, crc, _, published = HEADER.unpack_from(head)
        if magic != MAGIC:
            raise SnapshotFileError(f"{path.name} is not a snapshot file")
        if generation % 2:
            continue
        if generation == 0:
            return None
        if generation == held:
            return Published(b"", published, generation)
        if length > max_bytes:
            raise SnapshotFileError(f"{path.name} holds {length} bytes, more than the {max_bytes} allowed; "
                                    "not reading it")
        combined = len(head) >= HEADER_SIZE + length
        document = head[HEADER_SIZE:HEADER_SIZE + length] if combined else os.pread(fd, length, HEADER_SIZE)
        again = _GENERATION.unpack(os.pread(fd, _GENERATION.size, _GENERATION_AT))[0]
        if again != generation:
            continue
        if len(document) != length or zlib.crc32(document) != crc:
            if combined:  # copied in one read with its header: copy it again after the header before judging it
                expect_bytes = 0
                continue
            raise SnapshotFileError(f"{path.name} is damaged (its content does not match its checksum)")
        return Published(document, published, generation)
    raise SnapshotFileError(f"{path.name} was being written at every read for {READ_PATIENCE_S:g} s")


class SnapshotWriter:
    """The agent's side: creates the file (0600, under a temporary name, then renamed into place), holds its lock
    and publishes documents into it. Not a reader's concern how often; see tpu_tools.agent.publish."""

    def __init__(self, path: Path, max_bytes: int):
        self.path = path
        self._max_bytes = max_bytes
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._generation = 0
        self._inode: int | None = None
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()

    def create(self) -> None:
        staging = self.path.with_name(f".{self.path.name}.{threading.get_ident()}")
        if os.path.lexists(staging):
            os.unlink(staging)
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, HEADER_SIZE + _FIRST_CAPACITY)
            self._map = mmap.mmap(fd, HEADER_SIZE + _FIRST_CAPACITY)
            HEADER.pack_into(self._map, 0, MAGIC, 0, 0, 0, 0, 0.0)
            os.replace(staging, self.path)
        except BaseException:
            if self._map is not None:
                self._map.close()
                self._map = None
            os.close(fd)
            try:
                os.unlink(staging)
            except OSError:
                pass
            raise
        self._fd = fd
        self._inode = os.fstat(fd).st_ino

    def publish(self, document: bytes) -> bool:
        """Write `document` as the current snapshot; False when it is too large to publish (or closed)."""
        if len(document) > self._max_bytes:
            return False
        with self._lock:
            view = self._map
            if view is None:
                return False
            if HEADER_SIZE + len(document) > len(view):
                view = self._grow(HEADER_SIZE + len(document))
            self._generation += 1
            _GENERATION.pack_into(view, _GENERATION_AT, self._generation)
            view[HEADER_SIZE:HEADER_SIZE + len(document)] = document
            HEADER.pack_into(view, 0, MAGIC, self._generation, len(document), zlib.crc32(document), 0, time.time())
            self._generation += 1
            _GENERATION.pack_into(view, _GENERATION_AT, self._generation)
            return True

    def _grow(self, needed: int) -> mmap.mmap:
        """A larger file and mapping (doubling): the file only ever grows, so no reader copies past its end."""
        assert self._map is not None
        size = len(self._map)
        while size < needed:
            size *= 2
        os.ftruncate(self._fd, size)
        self._map.resize(size)
        return self._map

    def close(self) -> None:
        """Stop publishing and remove the file (only from the process that created it, only if it is still ours)."""
        with self._lock:
            if self._map is None:
                return
            if os.getpid() == self._owner_pid:
                try:
                    if os.stat(self.path).st_ino == self._inode:
                        os.unlink(self.path)
                except OSError:
                    pass
            self._release()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the inherited mapping and descriptor (and with it no lock of the parent's)."""
        self._lock = threading.Lock()
        if self._map is not None:
            self._release()

    def _release(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
