"""Walking a folder the user or the runtime names, without ever leaving it.

Used for `--add PATH`, libtpu's log folder and the XLA dump folder. A
symbolic link is followed only when it resolves inside the tree; one that
leaves it, dangles or loops is recorded and skipped. FIFOs, sockets and
devices are never opened (a FIFO blocks its reader), credential files are
never read, and a file is opened without following links and re-checked to
be a regular file, so a swap after the walk cannot make us read elsewhere.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from tpu_tools.dump.redact import Redactor
from tpu_tools.dump.sysfiles import describe_os_error

MAX_FILES = 10_000
MAX_DEPTH = 32


@dataclass
class TreeFile:
    relative: str  # path inside the tree, as the user sees it (a link's own name)
    real: str  # the resolved path that is read
    size_bytes: int
    mtime: float


@dataclass
class TreeWalk:
    root: str
    files: list[TreeFile] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {path, reason}
    truncated: bool = False

    def skip(self, relative: str, reason: str) -> None:
        self.skipped.append({"path": relative, "reason": reason})

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "files": [{"path": f.relative, "size_bytes": f.size_bytes, "mtime": round(f.mtime, 3)}
                      for f in self.files],
            "skipped": list(self.skipped),
            "truncated": self.truncated,
        }


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def walk_tree(root: str | Path, redactor: Redactor, max_files: int = MAX_FILES) -> TreeWalk:
    """Every regular file below `root` (itself a file or a folder), links kept inside it."""
    given = str(root)
    tree = os.path.realpath(given)
    walk = TreeWalk(root=given)
    seen: set[tuple[int, int]] = set()

    def visit(path: str, relative: str, depth: int) -> None:
        if len(walk.files) >= max_files:
            walk.truncated = True
            return
        try:
            link_stat = os.lstat(path)
        except OSError as error:
            walk.skip(relative, describe_os_error(error))
            return
        if stat.S_ISLNK(link_stat.st_mode):
            target = os.path.realpath(path)
            if not _inside(target, tree):
                walk.skip(relative, f"symbolic link to {target} leaves {given}; not followed")
                return
            try:
                info = os.stat(path)
            except OSError as error:
                walk.skip(relative, f"symbolic link to {target}: {describe_os_error(error)}")
                return
            real = target
        else:
            info, real = link_stat, path
        if (info.st_dev, info.st_ino) in seen:
            return  # a link to something already taken
        seen.add((info.st_dev, info.st_ino))
        if stat.S_ISDIR(info.st_mode):
            if depth >= MAX_DEPTH:
                walk.skip(relative, f"deeper than {MAX_DEPTH} folders; not walked")
                return
            try:
                # Real entries before links, so a file is named by its own name, not by a link to it.
                names = sorted(os.listdir(real), key=lambda n: (os.path.islink(os.path.join(real, n)), n))
            except OSError as error:
                walk.skip(relative, describe_os_error(error))
                return
            for name in names:
                visit(os.path.join(real, name), f"{relative}/{name}" if relative else name, depth + 1)
            return
        if not stat.S_ISREG(info.st_mode):
            walk.skip(relative, f"{_kind(info.st_mode)}; not read")
            return
        if redactor.is_credential_file(real):
            walk.skip(relative, "a credential file; never collected")
            return
        walk.files.append(TreeFile(relative or os.path.basename(tree), real, info.st_size, info.st_mtime))

    visit(tree, "", 0)
    return walk


def read_capped(path: str, limit: int, keep: str = "tail") -> tuple[bytes, int]:
    """Up to `limit` bytes of a regular file (its end for logs, its start otherwise) and its size.

    Opened without following a link and without blocking, then checked to be a
    regular file: what is read is what the walk saw.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is {_kind(info.st_mode)}")
        size = info.st_size
        if size <= limit or keep != "tail":
            return handle.read(limit), size
        handle.seek(size - limit)
        data = handle.read(limit)
    newline = data.find(b"\n")
    return (data[newline + 1:] if 0 <= newline < len(data) - 1 else data), size
