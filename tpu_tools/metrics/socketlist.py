"""The run directory's agent sockets, listed again only when the directory changed since the last round.

A monitor polling 10 times a second lists the run directory and checks every socket in it each round
(`rundir.list_socket_entries`: some syscalls per agent, each dear on a busy host right after a sleep). An
agent that starts or ends adds or removes a name, which moves the directory's modification time; a
`SocketListing` kept from round to round stats the directory and reuses its last listing while that time,
its identity, owner and mode are the same. The file system stamps a change with a coarse clock, so two
changes within one tick may share a stamp: a listing made less than `SETTLED_S` after the stamp it saw is
not reused, and the directory is listed again next round.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tpu_tools.metrics.rundir import SocketEntry, list_socket_entries, runtime_dir

SETTLED_S = 0.5


class SocketListing:
    """The last listing of the run directory, and the directory's state it was made in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: tuple[Path, int, int, int, int, int] | None = None  # path, device, inode, mtime, mode, owner
        self._entries: list[SocketEntry] = []
        self.listed = 0  # listings made (the tests count them)
        self.reused = 0

    def entries(self, directory: Path | None = None) -> list[SocketEntry]:
        """`rundir.list_socket_entries(directory)`, from the last listing while the directory has not changed."""
        directory = directory or runtime_dir()
        try:
            info = os.lstat(directory)
        except OSError:
            return list_socket_entries(directory)  # absent ([]) or unreadable (its error), as without a listing
        state = (directory, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_mode, info.st_uid)
        with self._lock:
            if state == self._seen:
                self.reused += 1
                return list(self._entries)
        listed_ns = time.time_ns()
        entries = list_socket_entries(directory)
        with self._lock:
            self.listed += 1
            settled = listed_ns - info.st_mtime_ns >= SETTLED_S * 1e9
            self._seen, self._entries = (state if settled else None), entries
        return list(entries)
