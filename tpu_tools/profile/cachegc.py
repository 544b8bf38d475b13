"""Removing cache entries safely: oldest first, never through a link, never while --dry-run, each one listed.

A job may be reading the cache while entries go. Each file is judged by
`lstat` (a link or anything but a regular file is never an entry to remove),
then renamed within the directory to a hidden name and checked to be the very
file that was judged (same inode) before it is unlinked. A job that opened the
entry keeps reading it; one that looks it up after the rename sees a miss and
compiles. Every operation is relative to the directory's descriptor, so no
name can lead outside it.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tpu_tools.errors import ToolError
from tpu_tools.instrument import cachekeys
from tpu_tools.profile.cachedir import TORCH_XLA, TRASH_PREFIX, CacheDirError, CacheScan

SCHEMA = "tpu-tools/cache-gc/v1"
LEFTOVER_AGE_S = 3600.0  # temporary files younger than this may still be being written


@dataclass
class Removal:
    name: str
    reason: str
    size_bytes: int
    removed: bool = False
    error: str | None = None


@dataclass
class GcResult:
    path: str
    dry_run: bool
    removals: list[Removal] = field(default_factory=list)
    kept_entries: int = 0
    kept_bytes: int = 0  # every entry that stays, those past the limit too
    truncated: bool = False  # the directory had more entries than were considered
    entry_count: int = 0
    entries_considered: int = 0

    def report(self) -> GcDocument:
        """The `tpu-tools/cache-gc/v1` document: removed and would_remove count only what their mode did."""
        done = [r for r in self.removals if r.removed]
        return GcDocument(
            schema=SCHEMA, path=self.path, dry_run=self.dry_run, removed=len(done) if not self.dry_run else 0,
            removed_bytes=sum(r.size_bytes for r in done) if not self.dry_run else 0,
            would_remove=len(self.removals) if self.dry_run else 0,
            would_remove_bytes=sum(r.size_bytes for r in self.removals) if self.dry_run else 0,
            failed=sum(1 for r in self.removals if r.error), kept_entries=self.kept_entries,
            kept_bytes=self.kept_bytes, truncated=self.truncated, entry_count=self.entry_count,
            entries_considered=self.entries_considered, removals=self.removals)


class GcDocument(msgspec.Struct, kw_only=True):
    """`tpu-profile cache gc`'s document, in its JSON key order."""

    schema: str
    path: str
    dry_run: bool
    removed: int
    removed_bytes: int
    would_remove: int
    would_remove_bytes: int
    failed: int
    kept_entries: int
    kept_bytes: int
    truncated: bool
    entry_count: int
    entries_considered: int
    removals: list[Removal]


def plan(scan: CacheScan, max_bytes: int | None, max_age_s: float | None, stale: bool,
         now: float | None = None) -> tuple[list[Removal], int, int]:
    """What gc removes (oldest use first), and the entries and bytes it keeps."""
    now = time.time() if now is None else now
    removals: list[Removal] = []
    entries = sorted(scan.entries, key=lambda e: e.last_used_unix_s)
    total = scan.total_bytes
    stale_names = {e.name for e in scan.stale} if stale else set()
    kept, kept_bytes = 0, 0
    for entry in entries:
        reason = None
        if entry.name in stale_names:
            reason = f"written by jaxlib {entry.jaxlib_version} (installed: {scan.installed_jaxlib})"
        elif max_age_s is not None and now - entry.last_used_unix_s > max_age_s:
            # torch_xla keeps no use time: its entry's age is since it was written
            used = "written" if entry.frontend == TORCH_XLA else "last used"
            reason = f"{used} {now - entry.last_used_unix_s:.0f} s ago"
        elif max_bytes is not None and total > max_bytes:
            reason = f"oldest while the cache is over {max_bytes} bytes"
        if reason is None:
            kept += 1
            kept_bytes += entry.size_bytes
            continue
        removals.append(Removal(entry.name, reason, entry.size_bytes))
        total -= entry.size_bytes
    for other in scan.other_files:
        if other.kind.startswith("orphan"):
            removals.append(Removal(other.name, other.kind, other.size_bytes))
        elif other.kind == "temporary":
            try:
                age = now - os.lstat(Path(scan.path) / other.name).st_mtime
            except OSError:
                continue
            if age > LEFTOVER_AGE_S:
                removals.append(Removal(other.name, f"temporary file {age:.0f} s old", other.size_bytes))
    return removals, kept, kept_bytes


def open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise ToolError(f"cannot open cache directory {path}: {error.strerror or error}") from None


def remove_file(dir_fd: int, name: str, allow_link: bool = False) -> str | None:
    """Remove one name of the directory safely (see the module's text); the error in words, or None."""
    try:
        judged = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # already gone: nothing to do
    except OSError as error:
        return error.strerror or str(error)
    if stat.S_ISLNK(judged.st_mode) and not allow_link:
        return "a link: never followed or removed by gc"
    if not (stat.S_ISREG(judged.st_mode) or stat.S_ISLNK(judged.st_mode)):
        return "not a regular file"
    trash = f"{TRASH_PREFIX}{secrets.token_hex(6)}"
    try:
        os.rename(name, trash, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        moved = os.stat(trash, dir_fd=dir_fd, follow_symlinks=False)
        if (moved.st_ino, moved.st_dev) != (judged.st_ino, judged.st_dev):  # replaced meanwhile: put it back
            try:
                os.link(trash, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                pass
            os.unlink(trash, dir_fd=dir_fd)
            return "replaced while being removed; left in place"
        os.unlink(trash, dir_fd=dir_fd)
    except OSError as error:
        return error.strerror or str(error)
    return None


def companions(name: str) -> list[str]:
    """The -atime file of an entry (its key record is removed apart, in the keys folder)."""
    if name.endswith(cachekeys.ENTRY_SUFFIX):
        return [name[: -len(cachekeys.ENTRY_SUFFIX)] + cachekeys.ATIME_SUFFIX]
    return []


def remove_record(path: Path, name: str) -> None:
    """The key record of a removed entry, if any (a link there is never followed: unlinking removes the link)."""
    parts = cachekeys.split_entry_name(name)
    if parts is None:
        return
    try:
        keys_fd = os.open(cachekeys.keys_dir(path), os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        remove_file(keys_fd, f"{parts[0]}-{parts[1]}{cachekeys.KEY_RECORD_SUFFIX}", allow_link=True)
    finally:
        os.close(keys_fd)


def apply(path: Path, removals: list[Removal], dry_run: bool, allow_links: bool = False) -> None:
    """Carry out `removals` (nothing at all with `dry_run`); each gets `removed` or its `error`."""
    if dry_run:
        return
    dir_fd = open_dir(path)
    try:
        for removal in removals:
            removal.error = remove_file(dir_fd, removal.name, allow_link=allow_links)
            removal.removed = removal.error is None
            if removal.removed:
                for extra in companions(removal.name):
                    remove_file(dir_fd, extra)
                remove_record(path, removal.name)
    finally:
        os.close(dir_fd)


def collect(scan: CacheScan, max_bytes: int | None, max_age_s: float | None, stale: bool,
            dry_run: bool) -> GcResult:
    """Plan and carry out; CacheDirError, with nothing removed, for a directory that holds no cache entry."""
    if not scan.holds_entries:  # a home or work folder given by mistake: nothing there is the cache's to remove
        raise CacheDirError(f"{scan.path} holds no JAX compilation cache entry (<module>-<hash>-cache) nor "
                            "PyTorch/XLA entry (a 128-bit hash in decimal): nothing removed")
    removals, kept, kept_bytes = plan(scan, max_bytes, max_age_s, stale)
    # entries past the limit were not considered: they stay, and count as kept (never an understated total)
    unread = scan.entry_count - len(scan.entries)
    unread_bytes = scan.total_bytes - sum(e.size_bytes for e in scan.entries)
    result = GcResult(scan.path, dry_run, removals, kept + unread, kept_bytes + unread_bytes, scan.truncated,
                      scan.entry_count, len(scan.entries))
    apply(Path(scan.path), removals, dry_run)
    return result
