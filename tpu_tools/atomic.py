"""The one way output files are written: complete or absent, never over a file without --force, no links.

A file is written to a hidden temporary name in its own folder (created with O_EXCL and O_NOFOLLOW, so a
link planted there is never followed) and renamed into place when complete: a reader, or an interrupted
run, never sees half a file. Without `force` an existing name is never replaced, even one that appears while
writing (the final step is a hard link, which fails when the name is taken). With `force` the rename replaces
a regular file or a symbolic link at the name, and never writes through the link.

A name that is (or links to) a stream rather than a file, a FIFO, a terminal or the null device
(`--json /dev/stdout`), is never replaced: the complete output is written into it in place, without
--force (nothing is replaced), from a private temporary file. Any other special file (a block or
other character device, a socket) is refused: renaming over /dev/sda or writing into it would be
the toolkit breaking the machine. Base layer: no printing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpu_tools.errors import UsageError

# Character devices written in place: the null device and terminals (tty, console, pseudo-terminals), by major.
_NULL_DEVICE = (1, 3)
_TERMINAL_MAJORS = frozenset({4, 5, *range(136, 144)})
_STREAM_FLAGS = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@dataclass
class PendingFile:
    """The temporary file an output is written to, and where it goes when complete."""

    final: Path
    temp: Path
    force: bool
    what: str = "the file"
    stream: bool = False  # the final name is a FIFO, a terminal or the null device: written into in place

    def discard(self) -> None:
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass

    def commit(self) -> Path:
        """Move the complete file to its final name; returns where it went."""
        if self.stream:
            _write_into(self.final, self.temp, self.what)
            return self.final
        if self.force:
            os.replace(self.temp, self.final)
            return self.final
        try:
            os.link(self.temp, self.final)  # atomic, and fails if the name was taken meanwhile
        except FileExistsError:
            self._taken()
        except OSError:  # a filesystem without hard links
            if os.path.lexists(self.final):
                self._taken()
            os.rename(self.temp, self.final)
            return self.final
        os.unlink(self.temp)
        return self.final

    def _taken(self) -> None:
        kept = self._free_name()
        os.rename(self.temp, kept)
        raise UsageError(f"{self.final} was created by something else meanwhile; what was written is saved as {kept}")

    def _free_name(self) -> Path:
        name = self.final.name
        suffix = ".tar.gz" if name.endswith(".tar.gz") and len(name) > 7 else self.final.suffix
        stem = name[: len(name) - len(suffix)]
        for number in range(2, 1000):
            candidate = self.final.with_name(f"{stem}-{number}{suffix}")
            if not os.path.lexists(candidate):
                return candidate
        return self.temp


def prepare(path: str | Path, force: bool, *, what: str = "the file", option: str | None = None,
            mode: int | None = None) -> PendingFile:
    """Check the output path and create the temporary file beside it; raises UsageError.

    `what` names the output in messages ("the bundle"), `option` the flag that chose the path ("--json").
    `mode` defaults to what the umask allows for a new file; private outputs pass 0o600.
    """
    final = Path(os.path.abspath(os.path.expanduser(str(path))))
    parent = final.parent
    choose = f" (choose another {option})" if option else ""
    if stream_kind(final, _target(what, final)):
        fd, name = tempfile.mkstemp(prefix=".tpu-tools-out-")
        os.close(fd)
        return PendingFile(final, Path(name), force, what, stream=True)
    if final.is_dir() and not final.is_symlink():
        raise UsageError(f"cannot write {_target(what, final)}: it is a folder")
    if not parent.exists():
        raise UsageError(f"cannot write {_target(what, final)}: the folder {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"cannot write {_target(what, final)}: {parent} is not a folder")
    if os.path.lexists(final) and not force:
        also = f", or choose another {option}" if option else ""
        raise UsageError(f"{final} already exists; use --force to replace it{also}")
    temp = parent / f".{final.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        fd = os.open(temp, _CREATE_FLAGS, 0o600)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise UsageError(f"cannot write {what} in {parent}: {reason}{choose}") from None
    try:
        os.fchmod(fd, _default_mode() if mode is None else mode)
    finally:
        os.close(fd)
    return PendingFile(final, temp, force, what)


def stream_kind(path: Path, target: str = "") -> str | None:
    """"FIFO", "terminal" or "null device" when `path` (links followed) is written in place; None for a regular
    file, a folder or a free name. Raises UsageError for any other special file."""
    try:
        info = os.stat(path)
    except OSError:  # a free name or a dangling link: created (or replaced) by the rename
        return None
    return _stream_kind(info, target or str(path))


def _stream_kind(info: os.stat_result, target: str) -> str | None:
    mode = info.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode):
        device = (os.major(info.st_rdev), os.minor(info.st_rdev))
        if device == _NULL_DEVICE:
            return "null device"
        if device[0] in _TERMINAL_MAJORS:
            return "terminal"
        raise UsageError(f"cannot write {target}: it is a character device ({device[0]},{device[1]}); "
                         "only a regular file, a FIFO, a terminal or /dev/null is written")
    kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"
    raise UsageError(f"cannot write {target}: it is {kind}; only a regular file, a FIFO, a terminal or /dev/null "
                     "is written")


def _write_into(final: Path, temp: Path, what: str) -> None:
    """Copy the complete output into a stream in place (no rename, no truncation: a stream has neither)."""
    target = _target(what, final)
    try:
        fd = os.open(final, _STREAM_FLAGS)
    except OSError as error:
        if error.errno == errno.ENXIO:  # a FIFO that nobody reads: opening it for writing would wait forever
            raise UsageError(f"cannot write {target}: it is a FIFO with no reader") from None
        raise UsageError(f"cannot write {target}: {(error.strerror or str(error)).lower()}") from None
    try:
        _stream_kind(os.fstat(fd), target)  # what was opened, not what was looked at: it may have been swapped
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"cannot write {target}: it was replaced by a regular file meanwhile")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        with open(temp, "rb") as source:
            while chunk := source.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _target(what: str, final: Path) -> str:
    """"--json /x/out.json" for an option, "the bundle to /x/b.tar.gz" for a thing."""
    return f"{what} {final}" if what.startswith("-") else f"{what} to {final}"


def write_file(path: str | Path, data: str | bytes, force: bool, *, what: str = "the file",
               option: str | None = None, mode: int | None = None) -> Path:
    """Write `data` to `path` atomically under the rules above; returns the final path. Raises UsageError."""
    pending = prepare(path, force, what=what, option=option, mode=mode)
    try:
        payload = data.encode("utf-8") if isinstance(data, str) else data
        with open(pending.temp, "r+b") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        return pending.commit()
    except OSError as error:
        raise UsageError(f"cannot write {_target(what, pending.final)}: {error.strerror or error}") from None
    finally:
        pending.discard()


def check_writable(path: str | Path, force: bool, *, what: str = "the file", option: str | None = None) -> None:
    """Refuse, before any work, an output that could not be written later (the same checks as `prepare`)."""
    prepare(path, force, what=what, option=option).discard()
