"""What a test owns, so that tests pass in any order and in parallel (pytest-xdist workers, pytest-randomly).

- `refused_address()`: an address on 127.0.0.1 that refuses connections for as long as the test holds it (a
  socket bound and never listening), where a test needs "nothing answers there". Never a default port such as
  libtpu's 8431: a TPU VM serves there.
- `tmux_command(socket)`: tmux on a server of the test's own (`tmux -L`), never the user's default server,
  whose first environment would win and which parallel tests would share.
- `unique_name(prefix)`: a name no other test process uses at the same time (tmux sockets, sessions).

Temporary directories come from pytest's `tmp_path` (per test, per worker); a server started for a test binds
port 0 and reports the port it got.
"""

from __future__ import annotations

import os
import socket
import subprocess
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


def settled_screen(capture: Callable[[], str], predicate: Callable[[str], bool]) -> str | None:
    """A captured screen that satisfies the predicate and reads the same on the next capture, else None: a
    whole frame, not one that tmux is still painting (a row cut short by a capture in the middle of a redraw).
    Poll it with a deadline: `wait_for(lambda: settled_screen(tmux.screen, predicate))`."""
    screen = capture()
    return screen if predicate(screen) and capture() == screen else None
