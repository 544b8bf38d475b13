"""The per-user directory where agents register their sockets, and the checks that keep it private.

Layout: `<dir>/agent-<pid>.sock` and the snapshot the agent publishes beside it,
`<dir>/agent-<pid>.snap` (tpu_tools.metrics.snapfile) and the file faulthandler writes its
stacks into on a signal, `<dir>/agent-<pid>.stacks` (tpu_tools.agent.stacks), where
`<dir>` is `TPU_TOOLS_RUNTIME_DIR`, else
`$XDG_RUNTIME_DIR/tpu-tools` (when that directory is ours), else
`/tmp/tpu-tools-<uid>`. The directory is created mode 0700 and must be owned by
this user and not be a symbolic link; each socket is created 0600. A directory
or socket that fails these checks is never used, and never deleted either: it
is not ours to touch.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV_RUNTIME_DIR = "TPU_TOOLS_RUNTIME_DIR"
SOCKET_PATTERN = re.compile(r"^agent-(\d+)\.sock$", re.ASCII)
MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT
# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


class RunDirError(OSError):
    """The runtime directory cannot be used safely; the message says why."""


def runtime_dir() -> Path:
    """Where agents put their sockets: $TPU_TOOLS_RUNTIME_DIR, else $XDG_RUNTIME_DIR/tpu-tools when it is
    this user's directory, else <tmp>/tpu-tools-UID. Only computes the path; creates nothing.
    """
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            info = os.stat(xdg)
            if info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode):
                return Path(xdg) / "tpu-tools"
        except OSError:
            pass
    return Path(tempfile.gettempdir()) / f"tpu-tools-{os.getuid()}"


def check_private_dir(path: Path) -> None:
    """Raise RunDirError unless `path` is a real directory of ours with mode 0700."""
    try:
        info = os.lstat(path)
    except OSError as error:
        raise RunDirError(f"runtime directory {path} is not accessible: {error.strerror}") from error
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise RunDirError(f"runtime directory {path} is not a directory (a link or a file); not using it")
    if info.st_uid != os.getuid():
        raise RunDirError(f"runtime directory {path} belongs to uid {info.st_uid}, not to this user; not using it")
    if info.st_mode & 0o077:
        raise RunDirError(f"runtime directory {path} has mode {info.st_mode & 0o777:04o}, not 0700; not using it")


def ensure_private_dir(path: Path | None = None) -> Path:
    """Create the runtime directory (0700) if needed and check it; returns it."""
    path = path or runtime_dir()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as error:
        raise RunDirError(f"cannot create runtime directory {path}: {error.strerror}") from error
    check_private_dir(path)
    return path


def socket_path(pid: int, directory: Path | None = None) -> Path:
    """The socket path of the agent of process `pid`. Raises RunDirError when it is too long for a Unix socket."""
    path = (directory or runtime_dir()) / f"agent-{pid}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise RunDirError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; "
                          f"set {ENV_RUNTIME_DIR} to a shorter directory")
    return path


@dataclass
class SocketEntry:
    """One `agent-<pid>.sock` found in the directory, with what is wrong with it (if anything)."""

    pid: int
    path: Path
    problem: str | None = None  # not ours, wrong mode, not a socket: never connect to it

    @property
    def usable(self) -> bool:
        return self.problem is None


def check_socket_file(path: Path) -> str | None:
    """Why this socket file must not be used, or None when it is ours and private."""
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    return private_file_problem(info, stat.S_ISSOCK, "a socket")


def private_file_problem(info: os.stat_result, of_kind: Callable[[int], bool], kind: str) -> str | None:
    """Why a file of the run directory must not be used (not `of_kind`, not ours, not 0600), or None."""
    if not of_kind(info.st_mode):
        return f"is not {kind}"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to this user"
    if info.st_mode & 0o077:
        return f"has mode {info.st_mode & 0o777:04o}, not 0600"
    return None


def list_socket_entries(directory: Path | None = None) -> list[SocketEntry]:
    """Every agent socket entry in the runtime directory, checked; [] when the directory is absent."""
    directory = directory or runtime_dir()
    if not os.path.lexists(directory):
        return []
    check_private_dir(directory)
    entries = []
    try:
        names = os.listdir(directory)
    except OSError as error:
        raise RunDirError(f"cannot list runtime directory {directory}: {error.strerror}") from error
    for name in names:
        match = SOCKET_PATTERN.match(name)
        if match:
            path = directory / name
            pid = int(match.group(1))
            # the name is outside input too: pid 0 would signal our own process group, a huge one overflows
            problem = None if 0 < pid <= MAX_PID else "names no possible process"
            entries.append(SocketEntry(pid, path, problem or check_socket_file(path)))
    return sorted(entries, key=lambda e: e.pid)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(entry: SocketEntry) -> bool:
    """Delete the socket of a process that is gone, if it is ours; returns whether it was removed."""
    if entry.problem is not None:
        return False
    _remove_own_file(entry.path.with_suffix(".snap"))  # its published snapshot (tpu_tools.metrics.snapfile)
    _remove_own_file(entry.path.with_suffix(".stacks"))  # where faulthandler wrote its stacks (agent/stacks.py)
    try:
        os.unlink(entry.path)
        return True
    except OSError:
        return False


def _remove_own_file(path: Path) -> None:
    """Delete a regular file of this user; anything else there is not ours to touch."""
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            os.unlink(path)
    except OSError:
        pass
