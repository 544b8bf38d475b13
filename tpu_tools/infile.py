"""The one way a file from outside is read: a regular file, read up to a size cap. Base layer: no printing.

Config files, web configs, TLS files, benchmark results and baselines, profile summaries: a user may name any
path. A FIFO would block the read forever (and with it SIGINT and SIGTERM), a device such as /dev/zero or a
file that keeps growing would be read until memory runs out. So the path is looked at before it is opened
(opening some devices has effects), opened without blocking, checked again on the open descriptor (it may have
been swapped), and read in chunks of at most `limit` bytes: a signal is answered between two chunks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class InputFileError(ValueError):
    """The file cannot be read as an input; the message is one sentence naming it."""


def _size(limit: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift:
            return f"{limit / (1 << shift):g} {unit}"
    return f"{limit} bytes"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _check(info: os.stat_result, path: str | Path, what: str, limit: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"{what} {path} is {_kind(info.st_mode)}, not a regular file")
    if info.st_size > limit:
        raise InputFileError(f"{what} {path} is larger than {_size(limit)}")


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


def check_input_file(path: str | Path, what: str, limit: int) -> None:
    """Refuse what is not a regular file of at most `limit` bytes (for files a library reads itself: TLS)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what} {path} does not exist") from None
    except OSError as error:
        raise InputFileError(f"cannot read {what} {path}: {_reason(error)}") from None
    _check(info, path, what, limit)


def read_input_file(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; InputFileError (one sentence) otherwise.

    `what` names the file in the sentence: "config file", "--web-config", "baseline file".
    """
    check_input_file(path, what, limit)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        raise InputFileError(f"cannot read {what} {path}: {_reason(error)}") from None
    try:
        _check(os.fstat(fd), path, what, limit)  # what was opened: the name may have been swapped meanwhile
        chunks: list[bytes] = []
        total = 0
        while total <= limit:  # a file that grows while it is read stops at the cap
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as error:
        raise InputFileError(f"cannot read {what} {path}: {_reason(error)}") from None
    finally:
        os.close(fd)
    if total > limit:
        raise InputFileError(f"{what} {path} is larger than {_size(limit)}")
    return b"".join(chunks)
