"""Finding and asking the agents of this user: the API below tpu-monitor, tpu-top and tpu-dump.

    list_agents()                -> [AgentRecord(pid, tag, socket_path)] of live agents
    query_snapshot(pid)          -> the agent's snapshot (records.agent.AgentSnapshot, schema tpu-tools/agent/v1)
    query_agent(pid)             -> the same as its JSON document
    query_agents(tag_filter=...) -> AgentScan: every agent's snapshot or error, in parallel

`query_agents` reads each snapshot from the file the agent publishes beside its
socket (tpu_tools.metrics.snapfile), which wakes nothing in the job; it asks the
socket only where there is no such file (an agent with it turned off, or older).
`query_snapshot`, on demand, asks the socket: for the arrays, or a snapshot made
now. Every call has a deadline. Sockets of processes that are gone are removed on
the way; sockets that are not ours or not private are reported, never used.
Before sending anything the client checks, with the kernel's peer
credentials, that the listening process is this user's and has the PID the
socket is registered under.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tpu_tools.background import DaemonExecutor
from tpu_tools.errors import first_line
from tpu_tools.metrics import wire
from tpu_tools.metrics.agent_snapshot import NOT_JSON, decode_snapshot
from tpu_tools.metrics.records.agent import AgentSnapshot, Stacks
from tpu_tools.metrics.rundir import SocketEntry, list_socket_entries, pid_alive, remove_stale
from tpu_tools.metrics.snapfile import SnapshotFileError, read_snapshot_file, snapshot_file_for
from tpu_tools.metrics.snapreader import PublishedSnapshot, SnapshotFiles, decode_published
from tpu_tools.metrics.socketlist import SocketListing
from tpu_tools.outside import OutsideError
from tpu_tools.units import format_bytes

DEFAULT_TIMEOUT_S = 1.0
# A snapshot is a few KiB per device plus one record per jitted function; an answer past this is refused
# for that agent alone (reading and checking costs about 0.1 s per MiB, paid again every report).
DEFAULT_MAX_BYTES = 16 << 20
_MAX_WORKERS = 16


class AgentQueryError(Exception):
    """An agent could not be asked; the message says why in one sentence."""


class AgentGone(AgentQueryError):
    """The process behind a socket has exited (its stale socket was removed)."""


@dataclass
class AgentRecord:
    pid: int
    tag: str | None
    socket_path: Path


@dataclass
class AgentResult:
    """One agent's answer: `snapshot` on success, else `error`."""

    pid: int
    socket_path: Path
    snapshot: AgentSnapshot | None = None
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def tag(self) -> str | None:
        return self.snapshot.tag if self.snapshot else None


@dataclass
class IgnoredSocket:
    path: Path
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"socket": str(self.path), "reason": self.reason}


@dataclass
class AgentScan:
    results: list[AgentResult] = field(default_factory=list)  # answered, or failed while alive
    ignored: list[IgnoredSocket] = field(default_factory=list)  # not ours, wrong mode, not a socket
    removed_stale: list[int] = field(default_factory=list)  # PIDs whose leftover socket was deleted


def _peer(sock: socket.socket) -> tuple[int, int]:
    pid, uid, _ = wire.peer_credentials(sock)
    return pid, uid


class AgentConnections:
    """Connections to agents kept open between rounds (one per socket), for a client that asks again and again:
    a monitor asking 10 times a second then costs the job no connection set-up per request. A connection is
    used by one request at a time; one the agent closed meanwhile (an agent that does not keep connections, or
    a restarted one) is replaced by a new one within the same request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[Path, tuple[int, socket.socket]] = {}  # socket path -> (its pid, the connection)
        self.files = SnapshotFiles()  # the agents' snapshot files, open, with what was last read from each
        self.listing = SocketListing()  # the run directory's sockets, listed again when it changed

    def take(self, entry: SocketEntry) -> socket.socket | None:
        """The kept connection to `entry`'s agent, now the caller's (None when there is none)."""
        with self._lock:
            kept = self._open.pop(entry.path, None)
        if kept is not None and kept[0] != entry.pid:  # another process registered at that path since
            kept[1].close()
            return None
        return kept[1] if kept is not None else None

    def keep(self, entry: SocketEntry, sock: socket.socket) -> None:
        with self._lock:
            replaced = self._open.pop(entry.path, None)
            self._open[entry.path] = (entry.pid, sock)
        if replaced is not None:
            replaced[1].close()

    def forget_except(self, paths: Collection[Path]) -> None:
        """Close the connections to every other agent (gone, or no longer asked)."""
        with self._lock:
            closing = [self._open.pop(path) for path in [p for p in self._open if p not in paths]]
        for _, sock in closing:
            sock.close()
        self.files.forget_except({snapshot_file_for(path) for path in paths})

    def close(self) -> None:
        self.forget_except(())


def _connect(entry: SocketEntry, timeout_s: float) -> socket.socket:
    """A connection to `entry`'s agent, once the kernel says it is this user's process with the registered PID."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(entry.path))
        except (ConnectionRefusedError, FileNotFoundError) as error:
            if not pid_alive(entry.pid) or error.errno == errno.ECONNREFUSED:
                raise AgentGone(f"process {entry.pid} is gone") from error
            raise AgentQueryError(f"cannot connect to {entry.path}: {error.strerror}") from error
        except TimeoutError as error:
            raise AgentQueryError(f"timed out connecting after {timeout_s:g} s") from error
        peer_pid, peer_uid = _peer(sock)
        if peer_uid != os.getuid():
            raise AgentQueryError(f"the socket is served by uid {peer_uid}, not by this user; not asking it")
        if peer_pid != entry.pid:
            raise AgentQueryError(f"the socket is served by process {peer_pid}, not {entry.pid}; not asking it")
    except BaseException:
        sock.close()
        raise
    return sock


def _send_and_read(sock: socket.socket, line: bytes, deadline: float, timeout_s: float, max_bytes: int) -> bytearray:
    """Send one request line and read its answer line (or up to the agent's close); what was received."""
    sock.settimeout(max(deadline - time.monotonic(), 1e-3))
    sock.sendall(line)
    received = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AgentQueryError(f"no complete answer within {timeout_s:g} s")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError as error:
            raise AgentQueryError(f"no complete answer within {timeout_s:g} s") from error
        if not chunk:
            return received
        received += chunk
        if len(received) > max_bytes:
            raise AgentQueryError(f"the answer is larger than {format_bytes(max_bytes)}; not reading it")
        if received.endswith(b"\n"):
            return received


def _on_kept(connections: AgentConnections, entry: SocketEntry, line: bytes, deadline: float, timeout_s: float,
             max_bytes: int) -> tuple[socket.socket | None, bytearray]:
    """(the kept connection, the answer read on it), or (None, empty) when there is none or the agent closed it."""
    sock = connections.take(entry)
    if sock is None:
        return None, bytearray()
    try:
        received = _send_and_read(sock, line, deadline, timeout_s, max_bytes)
    except ConnectionError:  # closed by the agent since the last request: ask on a new connection
        received = bytearray()
    except BaseException:
        sock.close()
        raise
    if not received:
        sock.close()
        return None, received
    return sock, received


def _checked(data: bytes | bytearray | memoryview, not_json: str) -> AgentSnapshot:
    """The record of an answer's JSON bytes, decoded straight into it; AgentQueryError says what is wrong."""
    try:
        snapshot = decode_snapshot(data)
    except OutsideError as error:
        raise AgentQueryError(not_json if str(error) == NOT_JSON else str(error)) from error
    return _no_error(snapshot)


def _no_error(snapshot: AgentSnapshot) -> AgentSnapshot:
    if snapshot.error:
        raise AgentQueryError(f"the agent failed: {first_line(RuntimeError(snapshot.error), limit=500)}")
    return snapshot


def _published(entry: SocketEntry, max_bytes: int, files: SnapshotFiles | None = None) -> AgentSnapshot | None:
    """The snapshot the agent published in its file, checked as a socket answer is; None when there is none.
    Read through `files` where given (kept between rounds: what did not change since is not read again)."""
    path = snapshot_file_for(entry.path)
    try:
        read = files.read(path, max_bytes) if files is not None else _read_once(path, max_bytes)
    except (SnapshotFileError, OutsideError) as error:  # the file's fault, or its snapshot's
        raise AgentQueryError(str(error)) from error
    if read is None:
        return None
    snapshot = _no_error(read.snapshot)
    if snapshot.pid != entry.pid:
        raise AgentQueryError(f"the snapshot file names process {snapshot.pid}, not {entry.pid}; not using it")
    return _age(snapshot, read.published_unix_s)


def _read_once(path: Path, max_bytes: int) -> PublishedSnapshot | None:
    published = read_snapshot_file(path, max_bytes)
    if published is None:
        return None
    return PublishedSnapshot(decode_published(published.document), published.published_unix_s)


def _age(snapshot: AgentSnapshot, published_unix_s: float) -> AgentSnapshot:
    """The snapshot with the figures that count time since something brought to now: the file was written up to a
    second ago. A new record, the nested ones replaced, not changed: a kept reader shares them between rounds."""
    age = max(0.0, time.time() - published_unix_s)
    steps, sdk = snapshot.steps, snapshot.tpu_sdk
    return msgspec.structs.replace(
        snapshot, published_unix_s=published_unix_s,
        uptime_s=None if snapshot.uptime_s is None else snapshot.uptime_s + age,
        steps=steps if steps is None or steps.last_step_age_s is None else msgspec.structs.replace(
            steps, last_step_age_s=steps.last_step_age_s + age),
        tpu_sdk=sdk if sdk is None or sdk.read_age_s is None else msgspec.structs.replace(
            sdk, read_age_s=sdk.read_age_s + age))


def _exchange(entry: SocketEntry, request: str, timeout_s: float, max_bytes: int = wire.MAX_RESPONSE_BYTES,
              connections: AgentConnections | None = None, published: bool = True) -> AgentSnapshot:
    if request == wire.REQUEST_SNAPSHOT and published:
        snapshot = _published(entry, max_bytes)
        if snapshot is not None:
            return snapshot
    deadline = time.monotonic() + timeout_s
    line = wire.encode_request(request, keep=connections is not None)
    sock, received = None, bytearray()
    if connections is not None:
        sock, received = _on_kept(connections, entry, line, deadline, timeout_s, max_bytes)
    if sock is None:
        try:
            sock = _connect(entry, timeout_s)
            try:
                received = _send_and_read(sock, line, deadline, timeout_s, max_bytes)
            except BaseException:
                sock.close()
                raise
        except ConnectionError as error:
            if not pid_alive(entry.pid):
                raise AgentGone(f"process {entry.pid} is gone") from error
            raise AgentQueryError(f"the connection failed: {error.strerror or error}") from error
    if connections is not None and received.endswith(b"\n"):
        connections.keep(entry, sock)
    else:
        sock.close()
    if not received:
        if not pid_alive(entry.pid):
            raise AgentGone(f"process {entry.pid} is gone")
        raise AgentQueryError("closed the connection without answering")
    return _checked(received, NOT_JSON)


def _ask(entry: SocketEntry, request: str, timeout_s: float, max_bytes: int,
         connections: AgentConnections | None = None, published: bool = True) -> AgentResult:
    started = time.monotonic()
    result = AgentResult(entry.pid, entry.path)
    try:
        result.snapshot = _exchange(entry, request, timeout_s, max_bytes, connections, published)
    except AgentGone:
        remove_stale(entry)
        raise
    except AgentQueryError as error:
        result.error = str(error)
    except OSError as error:
        result.error = f"{error.strerror or error}"
    result.elapsed_s = time.monotonic() - started
    return result


def _ask_all(entries: list[SocketEntry], request: str, timeout_s: float, scan: AgentScan,
             max_bytes: int = wire.MAX_RESPONSE_BYTES, connections: AgentConnections | None = None) -> None:
    def one(entry: SocketEntry) -> AgentResult | None:
        try:
            return _ask(entry, request, timeout_s, max_bytes, connections, published=False)
        except AgentGone:
            scan.removed_stale.append(entry.pid)
            return None

    if request == wire.REQUEST_SNAPSHOT:
        entries = _read_published(entries, max_bytes, scan, connections.files if connections is not None else None)
    if not entries:
        return
    # One agent is asked in this thread; several in parallel, on threads kept for the next round (a
    # monitor polling 10 times a second should not start threads each time).
    results = [one(entries[0])] if len(entries) == 1 else list(_pool().map(one, entries))
    scan.results.extend(r for r in results if r is not None)


def _read_published(entries: list[SocketEntry], max_bytes: int, scan: AgentScan,
                    files: SnapshotFiles | None = None) -> list[SocketEntry]:
    """Read the published snapshots, one after another in this thread (a file read waits on nothing a pool would
    hide); returns the entries that have none, to be asked on their sockets."""
    unpublished = []
    for entry in entries:
        started = time.monotonic()
        result = AgentResult(entry.pid, entry.path)
        try:
            result.snapshot = _published(entry, max_bytes, files)
        except AgentQueryError as error:
            result.error = str(error)
        except OSError as error:
            result.error = f"{error.strerror or error}"
        if result.snapshot is None and result.error is None:
            unpublished.append(entry)
            continue
        result.elapsed_s = time.monotonic() - started
        scan.results.append(result)
    return unpublished


_executor: DaemonExecutor | None = None


def _pool() -> DaemonExecutor:
    global _executor
    if _executor is None:  # daemon threads: a hung agent never holds the program's exit
        _executor = DaemonExecutor(_MAX_WORKERS, "tpu-tools-agent-query")
    return _executor


def _usable_entries(directory: Path | None, scan: AgentScan, listing: SocketListing | None = None) -> list[SocketEntry]:
    usable = []
    for entry in (listing.entries(directory) if listing is not None else list_socket_entries(directory)):
        if not entry.usable:
            scan.ignored.append(IgnoredSocket(entry.path, f"{entry.path.name} {entry.problem}; ignored"))
        elif not pid_alive(entry.pid):
            if remove_stale(entry):
                scan.removed_stale.append(entry.pid)
        else:
            usable.append(entry)
    return usable


def query_agents(timeout_s: float = DEFAULT_TIMEOUT_S, *, tag_filter: str | re.Pattern[str] | None = None,
                 directory: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 pids: Collection[int] | None = None, connections: AgentConnections | None = None) -> AgentScan:
    """Ask every live agent of this user (of `pids` alone, when given) for its snapshot, in parallel, each within
    `timeout_s` and `max_bytes`; on the connections kept in `connections`, where given, and kept there.

    `tag_filter` (a regex, searched in the tag) drops agents whose tag does not
    match, and agents that failed to answer (their tag is unknown). Raises
    rundir.RunDirError when the runtime directory itself is unsafe.
    """
    scan = AgentScan()
    entries = _usable_entries(directory, scan, connections.listing if connections is not None else None)
    if pids is not None:
        entries = [entry for entry in entries if entry.pid in pids]
    if connections is not None:
        connections.forget_except({entry.path for entry in entries})
    _ask_all(entries, wire.REQUEST_SNAPSHOT, timeout_s, scan, max_bytes, connections)
    if tag_filter is not None:
        pattern = re.compile(tag_filter) if isinstance(tag_filter, str) else tag_filter
        scan.results = [r for r in scan.results if r.tag is not None and pattern.search(r.tag)]
    scan.results.sort(key=lambda r: r.pid)
    return scan


def list_agents(timeout_s: float = DEFAULT_TIMEOUT_S, *, directory: Path | None = None) -> list[AgentRecord]:
    """The live agents of this user (PID, tag, socket path); agents that do not answer have tag None."""
    scan = AgentScan()
    _ask_all(_usable_entries(directory, scan), wire.REQUEST_PING, timeout_s, scan)
    return sorted((AgentRecord(r.pid, r.tag, r.socket_path) for r in scan.results), key=lambda r: r.pid)


def query_agent(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, directory: Path | None = None,
                request: str = wire.REQUEST_SNAPSHOT) -> dict[str, Any]:
    """`query_snapshot`'s answer as its JSON document: every field of the record, None where the agent sent none
    (for callers that write or compare the answer as JSON)."""
    document: dict[str, Any] = msgspec.to_builtins(query_snapshot(pid, timeout_s, directory=directory,
                                                                  request=request))
    return document


def query_snapshot(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, directory: Path | None = None,
                   request: str = wire.REQUEST_SNAPSHOT) -> AgentSnapshot:
    """The answer of the agent in process `pid` to `request` (its snapshot by default), asked on its socket: made
    now, not the one it published last; raises AgentQueryError (AgentGone if it exited)."""
    from tpu_tools.metrics.rundir import check_socket_file, socket_path

    path = socket_path(pid, directory)
    if not os.path.lexists(path):
        raise AgentGone(f"no agent is registered for process {pid}")
    problem = check_socket_file(path)
    if problem:
        raise AgentQueryError(f"{path} {problem}; not using it")
    entry = SocketEntry(pid, path)
    try:
        return _exchange(entry, request, timeout_s, DEFAULT_MAX_BYTES, published=False)
    except AgentGone:
        remove_stale(entry)
        raise
    except OSError as error:
        raise AgentQueryError(f"{error.strerror or error}") from error


@dataclass
class StacksAnswer:
    """Where every Python thread of a job is (records.agent.Stacks, as JSON), how it was read, and its main frame."""

    pid: int
    stacks: Stacks
    source: str  # "agent": its answer; "faulthandler": written on a signal, the job being stuck holding its lock
    where: str | None


def query_stacks(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, directory: Path | None = None) -> StacksAnswer:
    """Every Python thread's stack in the job `pid`: asked on its socket, else (no answer within `timeout_s`: a job
    stuck holding its interpreter's lock) written by faulthandler on the signal its live agent published that it
    registered. Raises AgentQueryError (AgentGone if it exited)."""
    from tpu_tools.metrics.rundir import socket_path
    from tpu_tools.metrics.stacks import StacksError, read_fault_stacks, where

    try:
        stacks = query_snapshot(pid, timeout_s, directory=directory, request=wire.REQUEST_STACKS).stacks
        if stacks is None:
            raise AgentQueryError("answered without stacks (an agent of an earlier version)")
        return StacksAnswer(pid, stacks, "agent", where(stacks))
    except AgentGone:
        raise
    except AgentQueryError as error:
        unanswered = error
    entry = SocketEntry(pid, socket_path(pid, directory))
    published = _published(entry, DEFAULT_MAX_BYTES)
    number = published.stacks_signal if published is not None else None
    if number is None:
        raise AgentQueryError(f"{unanswered}; and its agent publishes no signal for its stacks")
    try:
        stacks = read_fault_stacks(pid, number, entry.path.with_suffix(".stacks"), max(timeout_s, 1.0))
    except StacksError as error:
        raise AgentQueryError(f"{unanswered}; {error}") from error
    return StacksAnswer(pid, stacks, "faulthandler", where(stacks))
