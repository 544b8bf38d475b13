"""What a test owns, so that tests pass in any order and in parallel (pytest-xdist workers, pytest-randomly).

- `refused_address()`: an address on 127.0.0.1 that refuses connections for as long as the test holds it (a
  socket bound and never listening), where a test needs "nothing answers there". Never a default port such as
  libtpu's 8431: a TPU VM serves there.
- `tmux_command(socket)`: tmux on a server of the test's own (`tmux -L`), never the user's default server,
  whose first environment would win and which parallel tests would share.
- `unique_name(prefix)`: a name no other test process uses at the same time (tmux sockets, sessions).
- `wait_for_screen(capture, predicate)`: a whole terminal frame that shows all the test reads from it.

Temporary directories come from pytest's `tmp_path` (per test, per worker); a server started for a test binds
port 0 and reports the port it got.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def unique_name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def refused_address() -> Iterator[str]:
    """"127.0.0.1:PORT" where a connection is refused until the block ends: the port is bound, never listened
    on, so no other program can take it meanwhile."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{holder.getsockname()[1]}"
    finally:
        holder.close()


def tmux_command(socket_name: str) -> list[str]:
    """The start of a tmux command line on the test's own server (end it with `kill-server`)."""
    return ["tmux", "-L", socket_name]


def kill_tmux_server(socket_name: str) -> None:
    subprocess.run([*tmux_command(socket_name), "kill-server"], capture_output=True, timeout=30)


def wait_for_screen(capture: Callable[[], str], predicate: Callable[[str], bool], timeout: float = 20.0) -> str:
    """The first captured screen that satisfies the predicate and reads the same on the next capture: a whole
    frame, not one that tmux is still painting. A frame is painted from the top down and can arrive in pieces,
    so a capture can hold its first rows and the last frame's rest; on a busy machine even two captures can
    land in that gap. The predicate therefore names everything the test reads from the screen, its lowest rows
    included, not only a line near the top. Raises AssertionError, with the last screen, after `timeout`."""
    deadline = time.monotonic() + timeout
    screen = ""
    while True:
        screen = capture()
        if predicate(screen) and capture() == screen:
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"the screen did not show what the test waits for in {timeout:g} s; "
                                 f"its last capture:\n{screen}")
        time.sleep(0.1)


def showing(*texts: str) -> Callable[[str], bool]:
    """A screen predicate: every one of the texts is on the screen."""
    return lambda screen: all(text in screen for text in texts)
