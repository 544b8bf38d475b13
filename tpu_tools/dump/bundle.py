"""Writing the bundle: one .tar.gz, private, complete or absent.

The archive is written to a hidden temporary name in the output folder
(created first, mode 0600, so a bad --output fails before anything is
collected) and renamed when complete: an interrupted run never leaves a file
that looks whole. Without --force an existing file is never replaced, even
one that appears while collecting.

--max-size bounds the compressed file. When the archive comes out larger,
the largest logs are shortened first (water-filling: every trimmable file is
cut to one common length, the ones below it are untouched), keeping their
newest lines, and the archive is written again.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpu_tools.atomic import PendingFile, prepare
from tpu_tools.dump.collector import TRIM_HEAD, TRIM_TAIL
from tpu_tools.dump.manifest import MANIFEST_NAME, Manifest, StoredFile

DEFAULT_MAX_SIZE_BYTES = 64 << 20
MIN_MAX_SIZE_BYTES = 64 << 10
_COMPRESS_LEVEL = 6
_FIT_ATTEMPTS = 6
_TRIM_MARK_TAIL = "[tpu-dump: trimmed to the last {kept} of {total} bytes to fit --max-size]\n"
_TRIM_MARK_HEAD = "\n[tpu-dump: trimmed to the first {kept} of {total} bytes to fit --max-size]\n"


def default_name(host: str, stamp: str) -> str:
    safe_host = re.sub(r"[^A-Za-z0-9.-]+", "-", host).strip("-.") or "host"
    return f"tpu-dump-{safe_host}-{stamp}.tar.gz"


def top_folder(final: Path) -> str:
    name = final.name
    for suffix in (".tar.gz", ".tgz", ".gz", ".tar"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


PendingBundle = PendingFile  # the bundle is written by the toolkit's one atomic writer


def prepare_output(path: Path, force: bool) -> PendingBundle:
    """Check the output path and create the private temporary file beside it; raises UsageError."""
    return prepare(path, force, what="the bundle", option="--output", mode=0o600)


def _add_member(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_archive(pending: PendingBundle, top: str, manifest: bytes, stored: list[StoredFile],
                  mtime: float) -> int:
    """Write the archive to the temporary file; returns its size in bytes."""
    with open(pending.temp, "r+b") as raw:
        raw.truncate(0)
        with gzip.GzipFile(filename=top + ".tar", mode="wb", fileobj=raw, compresslevel=_COMPRESS_LEVEL,
                           mtime=int(mtime)) as compressed:
            with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
                _add_member(tar, f"{top}/{MANIFEST_NAME}", manifest, mtime)
                for item in stored:
                    _add_member(tar, f"{top}/{item.name}", item.data, mtime)
        raw.flush()
        os.fsync(raw.fileno())
        return os.fstat(raw.fileno()).st_size


def _trimmed(item: StoredFile, keep: int) -> StoredFile:
    data = item.file.data
    if keep >= len(data):
        return StoredFile(item.file, data)
    if item.file.trim == TRIM_HEAD:
        cut = data[:keep]
        newline = cut.rfind(b"\n")
        cut = cut[: newline + 1] if newline > 0 else cut
        mark = _TRIM_MARK_HEAD.format(kept=len(cut), total=len(data)).encode()
        return StoredFile(item.file, cut + mark, len(data))
    cut = data[len(data) - keep:] if keep else b""
    newline = cut.find(b"\n")
    cut = cut[newline + 1:] if 0 <= newline < len(cut) - 1 else cut
    mark = _TRIM_MARK_TAIL.format(kept=len(cut), total=len(data)).encode()
    return StoredFile(item.file, mark + cut, len(data))


def _common_length(sizes: list[int], ratios: list[float], reduce_by: float) -> int:
    """The largest length L such that cutting every file to L saves at least `reduce_by` compressed bytes."""

    def saved(level: int) -> float:
        return sum(max(0, size - level) * ratio for size, ratio in zip(sizes, ratios))

    low, high = 0, max(sizes, default=0)
    if saved(0) < reduce_by:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if saved(middle) >= reduce_by:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass
class FitResult:
    size_bytes: int
    stored: list[StoredFile]
    manifest: Manifest
    over_limit: bool


def write_within(pending: PendingBundle, top: str, stored: list[StoredFile], max_size_bytes: int, mtime: float,
                 make_manifest: Callable[[list[StoredFile], list[str]], Manifest],
                 encode: Callable[[Manifest], bytes]) -> FitResult:
    """Write the archive, shortening the largest logs until it fits `max_size_bytes`."""
    trimmable = [i for i, item in enumerate(stored) if item.file.trim in (TRIM_TAIL, TRIM_HEAD) and item.file.data]
    ratios = {i: len(zlib.compress(stored[i].file.data, _COMPRESS_LEVEL)) / len(stored[i].file.data)
              for i in trimmable} if trimmable else {}
    current = list(stored)
    notes: list[str] = []
    level: int | None = None
    for _ in range(_FIT_ATTEMPTS):
        manifest = make_manifest(current, notes)
        size = write_archive(pending, top, encode(manifest), current, mtime)
        if size <= max_size_bytes:
            return FitResult(size, current, manifest, False)
        if not trimmable or level == 0:
            break
        sizes = [len(current[i].file.data) if level is None else min(level, len(current[i].file.data))
                 for i in trimmable]
        excess = size - max_size_bytes
        level = _common_length(sizes, [ratios[i] for i in trimmable], excess * 1.1 + 1024)
        current = list(stored)
        for i in trimmable:
            current[i] = _trimmed(stored[i], level)
        count = sum(1 for i in trimmable if current[i].trimmed_from_bytes is not None)
        notes[:] = [f"{count} log files trimmed to {level} bytes each to fit --max-size "
                    f"{max_size_bytes} bytes (largest first)"]
    notes.append(f"the bundle is larger than --max-size ({max_size_bytes} bytes) even with the logs trimmed")
    manifest = make_manifest(current, notes)
    size = write_archive(pending, top, encode(manifest), current, mtime)
    return FitResult(size, current, manifest, size > max_size_bytes)
