"""A persistent compilation cache directory read from outside: entries, sizes, ages, compile seconds, owners.

JAX's entries are `<module>-<key>-cache` (formats: `cachekeys`); PyTorch/XLA's (`XLA_PERSISTENT_CACHE_PATH`,
`xr.initialize_cache`) are named by the graph's 128-bit hash in decimal and hold a serialised computation with
no compile time, key record or companion file. torch_xla 2.9 writes an entry in place (open, truncate, write:
no temporary name) and, when it cannot read one back, unlinks it and writes it again.

The directory is outside input: it may hold links planted by someone else,
files of any size, names of any kind, and 10^5 entries. Nothing here follows
a link (every file is opened with O_NOFOLLOW and sub-folders are never
walked through links), reads more than an entry's first bytes, or lists more
than `limit` entries in detail (the rest are counted). Formats: `cachekeys`.
"""

from __future__ import annotations

import io
import os
import pwd
import re
import stat
import time
import zlib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import msgspec

from tpu_tools.errors import ToolError
from tpu_tools.instrument import cachekeys

SCHEMA = "tpu-tools/cache/v1"
DEFAULT_LIMIT = 20_000  # entries described one by one; more are counted
HEAD_BYTES = 4096  # enough compressed bytes to read the 4-byte compile time
SUBCACHE_LIMIT = 10_000  # files counted in one sub-cache
# The only temporary names that provably belong to a cache: jax's GFileCache wrote `_temp_<key>` and renamed it
# to the entry; an interrupted `gc` leaves its own rename target. Nothing else is judged by its name (a dotfile,
# an editor's `~` or `.swp` file in a directory given by mistake is never a leftover of the cache).
JAX_TEMP = re.compile(r"^_temp_.+-[0-9a-f]{64}(-cache)?$")
TRASH_PREFIX = ".tpu-tools-removing-"
TRASH = re.compile(r"^\.tpu-tools-removing-[0-9a-f]{12}$")
# A torch_xla entry's name: a 128-bit hash in decimal, which has 30 digits or more but for 1 in 10^8 hashes.
# Shorter or larger decimal names are no entry of torch_xla's and stay "unknown" (never removed).
TORCH_XLA_ENTRY = re.compile(r"^[1-9][0-9]{29,38}$")
JAX, TORCH_XLA = "jax", "torch_xla"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XLA_SUBCACHES = {"xla_gpu_kernel_cache_file": "XLA GPU kernel cache",
                 "xla_gpu_per_fusion_autotune_cache_dir": "XLA GPU autotune cache"}
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                       "9p", "afs", "fuse.gcsfuse", "fuse.s3fs", "fuse.sshfs", "fuse.juicefs", "fuse.rclone",
                       "virtiofs", "fuse.cephfs", "fuse.glusterfs")


class CacheDirError(ToolError):
    """The directory cannot be read as a cache: missing, not a directory, unreadable."""


@dataclass
class Entry:
    name: str
    module: str
    size_bytes: int
    modified_unix_s: float
    last_used_unix_s: float  # the -atime file JAX keeps with a size limit, else the file's modification time
    compile_time_s: int | None  # as JAX stored it: whole seconds
    compression: str | None  # "zlib", "zstd" or None when unknown
    problem: str | None = None  # why JAX could not use this entry, when it can be told without deserialising
    jaxlib_version: str | None = None  # from its key record
    platform: str | None = None
    writer: str | None = None  # "host:pid" from its key record
    frontend: str = JAX  # whose entry: jax or torch_xla


@dataclass
class SubCache:
    name: str
    what: str
    owner: str
    mode: str  # "0755"
    files: int
    bytes: int
    writable_by_me: bool
    truncated: bool = False  # more than SUBCACHE_LIMIT files: files and bytes count only the first ones


@dataclass
class OtherFile:
    name: str
    kind: str  # "temporary" (jax's or gc's own), "orphan atime", "link", "not a regular file", "unknown"
    size_bytes: int


@dataclass
class CacheScan:
    path: str
    owner: str
    owner_uid: int
    mode: str
    filesystem: str | None
    writable_by_me: bool
    entries: list[Entry] = field(default_factory=list)
    entry_count: int = 0  # all entries, also those past the limit
    total_bytes: int = 0
    truncated: bool = False
    other_files: list[OtherFile] = field(default_factory=list)
    subcaches: list[SubCache] = field(default_factory=list)
    key_records: int = 0  # every record in the keys folder
    key_records_read: int = 0  # the record files read (at most `limit`): writers and versions come from these
    installed_jaxlib: str | None = None
    writers: list[str] = field(default_factory=list)  # "host:pid (user)" from key records
    writer_hosts: list[str] = field(default_factory=list)
    jaxlib_versions: list[str] = field(default_factory=list)  # seen in key records
    frontend_counts: dict[str, list[int]] = field(default_factory=dict)  # frontend -> [entries, bytes], all of them
    scanned_unix_s: float = field(default_factory=time.time)

    @property
    def stale(self) -> list[Entry]:
        """Entries written by another jaxlib: their keys can never match this installation's."""
        return [e for e in self.entries if e.jaxlib_version and self.installed_jaxlib
                and e.jaxlib_version != self.installed_jaxlib]

    @property
    def partial_figures(self) -> list[str]:
        """The figures computed over part of the directory (the listing stopped at `limit`): each counts or lists
        only what was read, so it is a lower bound, and says so where it is shown."""
        partial = []
        if self.truncated:
            partial += ["oldest_age_s", "newest_age_s", "compile_seconds_saved_per_use_s", "stale_entries",
                        "broken_entries"]
        if self.key_records_read < self.key_records:
            partial += ["writers", "writer_hosts", "jaxlib_versions"]
        return partial

    @property
    def holds_entries(self) -> bool:
        """Whether the directory holds a cache entry at all (a link with an entry's name counts: one was planted)."""
        return self.entry_count > 0 or any(o.kind.startswith("link") and cachekeys.split_entry_name(o.name)
                                           for o in self.other_files)

    @property
    def planted_links(self) -> list[OtherFile]:
        """Links under the names jax reads and writes (an entry or its -atime file): jax would follow them."""
        return [o for o in self.other_files if o.kind.startswith("link") and is_cache_name(o.name)]

    @property
    def broken(self) -> list[Entry]:
        return [e for e in self.entries if e.problem]

    def report(self) -> CacheReport:
        """The `tpu-tools/cache/v1` document of this scan."""
        now = self.scanned_unix_s
        ages = [now - e.modified_unix_s for e in self.entries]
        saved = [e.compile_time_s for e in self.entries if e.compile_time_s is not None]
        return CacheReport(
            schema=SCHEMA, path=self.path, owner=self.owner, owner_uid=self.owner_uid, mode=self.mode,
            filesystem=self.filesystem, writable_by_me=self.writable_by_me, entry_count=self.entry_count,
            entries_listed=len(self.entries), truncated=self.truncated, total_bytes=self.total_bytes,
            oldest_age_s=max(ages) if ages else None, newest_age_s=min(ages) if ages else None,
            compile_seconds_saved_per_use_s=sum(saved), stale_entries=len(self.stale),
            broken_entries=len(self.broken), installed_jaxlib=self.installed_jaxlib,
            jaxlib_versions=self.jaxlib_versions, key_records=self.key_records,
            key_records_read=self.key_records_read, partial_figures=self.partial_figures, writers=self.writers,
            writer_hosts=self.writer_hosts, entries=self.entries, other_files=self.other_files,
            subcaches=self.subcaches, frontends={name: self._frontend(name) for name in sorted(self.frontend_counts)})

    def _frontend(self, name: str) -> FrontendFigures:
        """One frontend's entries: counted over the whole directory, ages over the entries listed."""
        ages = [self.scanned_unix_s - e.modified_unix_s for e in self.entries if e.frontend == name]
        count, size = self.frontend_counts[name]
        return FrontendFigures(entry_count=count, total_bytes=size, oldest_age_s=max(ages) if ages else None,
                               newest_age_s=min(ages) if ages else None)


class FrontendFigures(msgspec.Struct, kw_only=True):
    """One frontend's entries in a cache report."""

    entry_count: int
    total_bytes: int
    oldest_age_s: float | None
    newest_age_s: float | None


class CacheReport(msgspec.Struct, kw_only=True):
    """`tpu-profile cache inspect`'s document (schema `tpu-tools/cache/v1`), in its JSON key order. Over a
    truncated listing the figures named in `partial_figures` count only the entries read."""

    schema: str
    path: str
    owner: str
    owner_uid: int
    mode: str
    filesystem: str | None
    writable_by_me: bool
    entry_count: int
    entries_listed: int
    truncated: bool
    total_bytes: int
    oldest_age_s: float | None
    newest_age_s: float | None
    compile_seconds_saved_per_use_s: int  # whole seconds, as jax stores them
    stale_entries: int
    broken_entries: int
    installed_jaxlib: str | None
    jaxlib_versions: list[str]
    key_records: int
    key_records_read: int
    partial_figures: list[str]
    writers: list[str]
    writer_hosts: list[str]
    entries: list[Entry]
    other_files: list[OtherFile]
    subcaches: list[SubCache]
    frontends: dict[str, FrontendFigures]


def is_cache_name(name: str) -> bool:
    """An entry's name or its -atime file's, in jax's key form: the names jax itself reads and writes."""
    if name.endswith(cachekeys.ATIME_SUFFIX):
        name = name[: -len(cachekeys.ATIME_SUFFIX)] + cachekeys.ENTRY_SUFFIX
    return cachekeys.split_entry_name(name) is not None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def filesystem_of(path: Path, mounts: str = "/proc/mounts") -> str | None:
    """The filesystem type of the mount that holds `path` (longest mount point that is a prefix)."""
    try:
        text = Path(mounts).read_text(errors="replace")
    except OSError:
        return None
    target = str(path.resolve())
    best, best_type = "", None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, best_type = point, parts[2]
    return best_type


def is_network_filesystem(kind: str | None) -> bool:
    return bool(kind) and (kind in NETWORK_FILESYSTEMS or (kind or "").startswith("fuse."))


def installed_jaxlib() -> str | None:
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def kind_of(mode: int) -> str:
    """What a file that is not a directory is, in words."""
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link"))
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def what_is(path: Path) -> str:
    """What stands at `path`, which is not a directory, in words: "a FIFO", "a link to nothing"."""
    try:
        info = os.lstat(path)
    except OSError:
        return "missing"
    if stat.S_ISLNK(info.st_mode):
        try:
            return f"a link to {kind_of(os.stat(path).st_mode)}"
        except OSError:
            return "a link to nothing"
    return kind_of(info.st_mode)


def make_directory(path: Path) -> os.stat_result:
    """Create a cache directory (and its parents) unless it exists; CacheDirError with one sentence when it
    cannot be one: a file of another kind in its place, a link to nothing, a parent that is a file."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CacheDirError(f"cannot use {path} as a cache directory: it is {what_is(path)}") from None
    except OSError as error:
        raise CacheDirError(f"cannot create cache directory {path}: {error.strerror or error}") from None
    return open_directory(path)


def open_directory(path: Path) -> os.stat_result:
    """The directory's own status; CacheDirError with one sentence when it cannot be a cache."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise CacheDirError(f"cache directory {path} does not exist") from None
    except OSError as error:
        raise CacheDirError(f"cannot read cache directory {path}: {error.strerror or error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CacheDirError(f"{path} is not a directory but {kind_of(info.st_mode)} (a compilation cache is a "
                            "directory)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise CacheDirError(f"cannot read cache directory {path}: permission denied for {user_name(os.geteuid())}")
    return info


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first bytes of a regular file, never through a link and never blocking on a FIFO; raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return os.read(fd, size)
    finally:
        os.close(fd)


def compile_time_of(head: bytes) -> tuple[int | None, str | None, str | None]:
    """(compile seconds, compression, problem) from an entry's first bytes."""
    if not head:
        return None, None, "empty file"
    if head.startswith(ZSTD_MAGIC):
        try:
            import zstandard  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None, "zstd", None  # readable by a jax that has zstandard; the time is not, here
        try:
            # a reader bounds the output to the 4 bytes wanted: the head of a bomb never expands whole
            raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(head)).read(4)
        except Exception:  # noqa: BLE001 hostile bytes: whatever the decoder raises, the stream is not valid
            return None, "zstd", "not a valid zstd stream"
        return (int.from_bytes(raw[:4], "big"), "zstd", None) if len(raw) >= 4 else (None, "zstd", "truncated")
    try:
        raw = zlib.decompressobj().decompress(head, 4)
    except zlib.error:
        return None, None, "not a compressed cache entry (corrupt or foreign)"
    if len(raw) < 4:
        return None, "zlib", "truncated before its header"
    return int.from_bytes(raw[:4], "big"), "zlib", None


def _atime(path: Path) -> float | None:
    try:
        raw = read_head(path, 16)
    except OSError:
        return None
    return int.from_bytes(raw[:8], "little") / 1e9 if len(raw) == 8 else None


def _subcache(path: Path, name: str, what: str) -> SubCache:
    info = os.lstat(path)
    files = size = 0
    if stat.S_ISDIR(info.st_mode):
        for root, dirs, names in os.walk(path, followlinks=False):
            for item in names:
                files += 1
                try:
                    size += os.lstat(os.path.join(root, item)).st_size
                except OSError:
                    pass
                if files >= SUBCACHE_LIMIT:
                    dirs.clear()
                    break
            if files >= SUBCACHE_LIMIT:
                break
    else:
        files, size = 1, info.st_size
    return SubCache(name, what, user_name(info.st_uid), f"{stat.S_IMODE(info.st_mode):04o}", files, size,
                    os.access(path, os.W_OK), files >= SUBCACHE_LIMIT)


def scan(path: Path, limit: int = DEFAULT_LIMIT, heads: bool = True) -> CacheScan:
    """Read a cache directory (bounded: `limit` entries described, the rest counted). Raises CacheDirError.

    `heads=False` leaves the entries' first bytes unread (no compile times, no problems found): for gc.
    """
    info = open_directory(path)
    result = CacheScan(str(path), user_name(info.st_uid), info.st_uid, f"{stat.S_IMODE(info.st_mode):04o}",
                       filesystem_of(path), os.access(path, os.W_OK | os.X_OK), installed_jaxlib=installed_jaxlib())
    names: list[os.DirEntry[str]] = []
    try:
        with os.scandir(path) as listing:
            names = list(listing)
    except OSError as error:
        raise CacheDirError(f"cannot list cache directory {path}: {error.strerror or error}") from None
    entry_names = {item.name for item in names if item.name.endswith(cachekeys.ENTRY_SUFFIX)}
    records, result.key_records = _key_records(path, limit)
    result.key_records_read = min(result.key_records, limit)
    writers = sorted({f"{r.host}:{r.pid}" + (f" ({r.user})" if r.user else "") for r in records.values()
                      if r.host or r.pid})
    result.writers = writers
    result.writer_hosts = sorted({r.host for r in records.values() if r.host})
    result.jaxlib_versions = sorted({r.jaxlib_version for r in records.values() if r.jaxlib_version})
    for item in sorted(names, key=lambda i: i.name):
        name = item.name
        try:
            item_info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if name == cachekeys.LOCK_FILE or name == cachekeys.KEYS_DIR:
            continue
        if stat.S_ISLNK(item_info.st_mode):
            result.other_files.append(OtherFile(name, "link (never followed; not an entry)", 0))
            continue
        if name in XLA_SUBCACHES or stat.S_ISDIR(item_info.st_mode):
            try:
                result.subcaches.append(_subcache(Path(item.path), name, XLA_SUBCACHES.get(name, "other folder")))
            except OSError:
                pass
            continue
        parts = cachekeys.split_entry_name(name)
        if parts is None and is_torch_xla_entry(name) and stat.S_ISREG(item_info.st_mode):
            _count(result, TORCH_XLA, item_info.st_size)
            if len(result.entries) >= limit:
                result.truncated = True
                continue
            result.entries.append(Entry(name, "", item_info.st_size, item_info.st_mtime, item_info.st_mtime, None,
                                        None, frontend=TORCH_XLA))
            continue
        if parts is None:
            base = name[: -len(cachekeys.ATIME_SUFFIX)] + cachekeys.ENTRY_SUFFIX
            if name.endswith(cachekeys.ATIME_SUFFIX) and cachekeys.split_entry_name(base) is not None:
                if base not in entry_names:
                    result.other_files.append(OtherFile(name, "orphan atime (its entry is gone)", item_info.st_size))
                continue
            kind = "temporary" if JAX_TEMP.match(name) or TRASH.match(name) else "unknown"
            if not stat.S_ISREG(item_info.st_mode):
                kind = "not a regular file"
            result.other_files.append(OtherFile(name, kind, item_info.st_size))
            continue
        _count(result, JAX, item_info.st_size)
        if len(result.entries) >= limit:
            result.truncated = True
            continue
        result.entries.append(_entry(path, name, parts[0], item_info, records.get(f"{parts[0]}-{parts[1]}"),
                                     heads))
    return result


def is_torch_xla_entry(name: str) -> bool:
    """A name of torch_xla's form: a 128-bit hash in decimal (below 2^128)."""
    return bool(TORCH_XLA_ENTRY.match(name)) and int(name) < 1 << 128


def _count(result: CacheScan, frontend: str, size: int) -> None:
    result.entry_count += 1
    result.total_bytes += size
    counts = result.frontend_counts.setdefault(frontend, [0, 0])
    counts[0] += 1
    counts[1] += size


def _entry(folder: Path, name: str, module: str, info: os.stat_result, record: cachekeys.KeyRecord | None,
           heads: bool) -> Entry:
    compile_time, compression, problem = None, None, None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file"
    elif heads:
        try:
            compile_time, compression, problem = compile_time_of(read_head(folder / name))
        except OSError as error:
            problem = f"unreadable: {error.strerror or error}"
    atime = _atime(folder / (name[: -len(cachekeys.ENTRY_SUFFIX)] + cachekeys.ATIME_SUFFIX))
    writer = f"{record.host}:{record.pid}" if record and (record.host or record.pid) else None
    return Entry(name, module, info.st_size, info.st_mtime, atime or info.st_mtime, compile_time, compression, problem,
                 record.jaxlib_version if record else None, record.platform if record else None, writer)


def _key_records(path: Path, limit: int) -> tuple[dict[str, cachekeys.KeyRecord], int]:
    """The first `limit` key records read, and how many record names the folder holds (all counted)."""
    folder = cachekeys.keys_dir(path)
    found: dict[str, cachekeys.KeyRecord] = {}
    names = 0
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            return found, 0
        with os.scandir(folder) as listing:
            for item in listing:
                if not item.name.endswith(cachekeys.KEY_RECORD_SUFFIX):
                    continue
                names += 1
                if names <= limit:
                    record = cachekeys.read_key_record(Path(item.path))
                    if record is not None:
                        found[record.key] = record
    except OSError:
        pass
    return found, names
