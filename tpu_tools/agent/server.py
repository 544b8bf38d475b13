"""The agent's Unix socket server: one thread that sleeps in `select` until a client connects.

Between requests it costs nothing. A connecting process of another user is
dropped at once (kernel peer credentials), and so is a client that sends a
malformed or oversized request, or none within the time limit. Requests only
select which snapshot to return; nothing received is ever run.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.metrics import wire
from tpu_tools.metrics.rundir import ensure_private_dir
from tpu_tools.metrics.wire import peer_credentials

MAX_CONNECTIONS = 64
_READ_CHUNK = 4096


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    outgoing: memoryview | None = None
    keep: bool = False  # the client asked to keep the connection for its next request

    @property
    def idle(self) -> bool:
        """Kept open between requests, with nothing of the next one received yet."""
        return self.keep and self.outgoing is None and not self.received


@dataclass
class ServerCounters:
    served: int = 0
    accepted: int = 0  # connections; fewer than `served` where clients keep theirs
    refused_other_user: int = 0
    malformed: int = 0
    timed_out: int = 0


class AgentServer:
    """Serves `answer(request_name)` on `path` from a daemon thread."""

    def __init__(self, path: Path, answer: Callable[[str], dict[str, Any]], keep_idle_s: float = wire.KEEP_IDLE_S):
        self.path = path
        self._answer = answer
        self._keep_idle_s = keep_idle_s
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._owner_pid = os.getpid()
        self._inode: int | None = None
        self.counters = ServerCounters()

    def start(self) -> None:
        ensure_private_dir(self.path.parent)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bind under a temporary name, restrict it, then rename: no client ever sees a socket
        # with looser permissions, and a stale file of an earlier process with our PID is replaced.
        staging = self.path.with_name(f".{self.path.name}.{threading.get_ident()}")
        try:
            if os.path.lexists(staging):
                os.unlink(staging)
            listener.bind(str(staging))
            os.chmod(staging, 0o600)
            listener.listen(MAX_CONNECTIONS)
            os.replace(staging, self.path)
        except BaseException:
            listener.close()
            try:
                os.unlink(staging)
            except OSError:
                pass
            raise
        listener.setblocking(False)
        self._inode = os.stat(self.path).st_ino
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="tpu-tools-agent", daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The kernel's id of the serving thread (None before it runs)."""
        return self._thread.native_id if self._thread is not None else None

    def stop(self) -> None:
        """Stop serving and remove the socket (only from the process that created it)."""
        if self._thread is None:
            return
        if os.getpid() == self._owner_pid:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
            self._thread.join(timeout=5)
            self._unlink()
        self._close_fds()
        self._thread = None

    def forget_after_fork(self) -> None:
        """In a forked child: drop the inherited descriptors, leave the parent's socket alone."""
        self._close_fds()
        self._thread = None

    def _close_fds(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._wake_r = self._wake_w = -1

    def _unlink(self) -> None:
        try:
            if os.stat(self.path).st_ino == self._inode:  # still our socket, not a successor's
                os.unlink(self.path)
        except OSError:
            pass

    # --- the serving thread -------------------------------------------------------------------------
    # A monitor connects and sends its one-line request at once, so the request is usually there when the
    # connection is accepted: it is answered then and there, without registering the connection with the
    # selector (fewer system calls and less Python while the job may be waiting for the GIL). Only a slow
    # client, an answer larger than the socket's buffer, or a connection the client keeps waits in the selector.

    def _serve(self) -> None:
        assert self._listener is not None
        connections: dict[int, _Connection] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ, "listen")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while True:
                timeout = None
                if connections:
                    timeout = max(0.0, min(c.deadline for c in connections.values()) - time.monotonic())
                for key, _ in selector.select(timeout):
                    if key.data == "wake":
                        for connection in connections.values():
                            connection.sock.close()
                        return
                    if key.data == "listen":
                        self._accept(selector, connections)
                    else:
                        self._continue(selector, connections, key.data)
                if connections:
                    now = time.monotonic()
                    for fd in [fd for fd, c in connections.items() if c.deadline <= now]:
                        if not connections[fd].idle:  # an idle kept connection is closed, not a fault
                            self.counters.timed_out += 1
                        self._drop(selector, connections, fd)

    def _accept(self, selector: selectors.BaseSelector, connections: dict[int, _Connection]) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        self.counters.accepted += 1
        try:
            _, uid, _ = peer_credentials(sock)
        except OSError:
            uid = -1
        ours = uid == os.getuid()
        if ours and len(connections) >= MAX_CONNECTIONS:
            self._make_room(selector, connections)
        if not ours or len(connections) >= MAX_CONNECTIONS:
            if not ours:
                self.counters.refused_other_user += 1
            sock.close()
            return
        sock.setblocking(False)
        connection = _Connection(sock, time.monotonic() + wire.REQUEST_TIMEOUT_S)
        waits_for = self._advance(connection)
        if waits_for is None:
            sock.close()
            return
        connections[sock.fileno()] = connection
        selector.register(sock, waits_for, sock.fileno())

    def _make_room(self, selector: selectors.BaseSelector, connections: dict[int, _Connection]) -> None:
        """Close the kept connection idle the longest (soonest to time out), if any: a new client comes first."""
        idle = [(c.deadline, fd) for fd, c in connections.items() if c.idle]
        if idle:
            self._drop(selector, connections, min(idle)[1])

    def _continue(self, selector: selectors.BaseSelector, connections: dict[int, _Connection], fd: int) -> None:
        connection = connections.get(fd)
        if connection is None:
            return
        waits_for = self._advance(connection)
        if waits_for is None:
            self._drop(selector, connections, fd)
        elif waits_for != selector.get_key(connection.sock).events:
            selector.modify(connection.sock, waits_for, fd)

    def _advance(self, connection: _Connection) -> int | None:
        """Read the request, answer it, send the answer, as far as the socket allows now.

        Returns the event the connection waits for next, or None when it is finished (answered or dropped).
        A kept connection goes back to waiting for its next request once its answer is sent.
        """
        while True:
            if connection.outgoing is None:
                if not self._receive(connection):
                    return None
                if connection.outgoing is None:
                    return selectors.EVENT_READ
            try:
                sent = connection.sock.send(connection.outgoing)
            except BlockingIOError:
                return selectors.EVENT_WRITE
            except OSError:
                return None
            connection.outgoing = connection.outgoing[sent:]
            if len(connection.outgoing):
                return selectors.EVENT_WRITE
            if not connection.keep:
                return None
            connection.outgoing = None
            # idle: the keep time; part of the next request here: that request's time limit
            connection.deadline = time.monotonic() + (wire.REQUEST_TIMEOUT_S if connection.received
                                                      else self._keep_idle_s)
            if b"\n" not in connection.received:  # else the next request is already here: answer it now
                return selectors.EVENT_READ

    def _receive(self, connection: _Connection) -> bool:
        """Take what the client sent; once its request line is whole, make the answer. False: drop it."""
        if b"\n" not in connection.received:
            try:
                chunk = connection.sock.recv(_READ_CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:  # the client closed (a kept connection ends so)
                return False
            if connection.idle:  # the first bytes of a kept connection's next request: the request's time limit
                connection.deadline = min(connection.deadline, time.monotonic() + wire.REQUEST_TIMEOUT_S)
            connection.received += chunk
        newline = connection.received.find(b"\n")
        if newline < 0:
            if len(connection.received) > wire.MAX_REQUEST_BYTES:
                self.counters.malformed += 1
                return False
            return True
        line = bytes(connection.received[:newline])
        del connection.received[:newline + 1]
        try:
            request, connection.keep = wire.decode_request(line)
        except wire.MalformedRequest:
            self.counters.malformed += 1
            return False
        try:
            answer = wire.encode_response(self._answer(request))
        except Exception as error:  # noqa: BLE001 a bug in a collector, or a figure no JSON can hold, must not take the server down
            answer = wire.encode_response({"schema": wire.SNAPSHOT_SCHEMA, "error": f"{type(error).__name__}: {error}"})
        connection.outgoing = memoryview(answer)
        connection.deadline = time.monotonic() + wire.REPLY_TIMEOUT_S
        self.counters.served += 1
        return True

    @staticmethod
    def _drop(selector: selectors.BaseSelector, connections: dict[int, _Connection], fd: int) -> None:
        connection = connections.pop(fd, None)
        if connection is None:
            return
        try:
            selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()
