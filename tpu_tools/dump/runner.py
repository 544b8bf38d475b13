"""Run collectors side by side, each in a child process with its own time limit.

A thread that blocks in `read()` on a hung mount or a FIFO cannot be stopped,
so every collector runs in its own process. `tpu-dump` has no threads and
never imports jax, so it forks: cheap. A caller that runs other threads (a
process that started JAX has XLA's thread pools) must not fork, since the child
could inherit a lock that a vanished thread held: there each collector runs in
a fresh interpreter (`dump/spawned.py`) instead. The child sends each file as
soon as it is added, framed on a pipe, so what a collector gathered before it
hung is kept. At its deadline the child's process group is killed with
SIGKILL and the dump goes on: a hung collector costs its timeout, never the
bundle. Every child asks the kernel to kill it if the dump itself dies.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from tpu_tools.dump.collector import (
    STATUS_FAILED,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_TIMED_OUT,
    CollectContext,
    CollectedFile,
    Collector,
    DumpOptions,
    Skipped,
    TimedOut,
)
from tpu_tools.dump.redact import Redactor
from tpu_tools.errors import ToolError

_HEADER = struct.Struct("!Q")
_TICK_S = 0.25
_REAP_WAIT_S = 0.5  # a child that closed its pipe is exiting
_KILLED_REAP_WAIT_S = 0.1  # a killed child stuck in the kernel (state D) is not waited for
# A spawned interpreter's start-up is not the collector's time: its deadline starts when it says "started",
# and this long is allowed for the start itself (a loaded machine, a slow disk).
_SPAWN_START_S = 30.0


@dataclass
class CollectorResult:
    name: str
    status: str
    error: str | None = None
    duration_s: float | None = None  # None: not run
    files: list[CollectedFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    traceback: str | None = None


@dataclass
class Progress:
    """What the runner reports while it waits (for a progress line on a terminal)."""

    done: int
    total: int
    running: list[tuple[str, float]]  # (name, seconds since it started)


# --- the child -------------------------------------------------------------------------------------

def _send(fd: int, message: tuple) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _error_text(error: BaseException) -> str:
    if isinstance(error, (ToolError, Skipped, TimedOut)):
        return str(error)
    return f"{type(error).__name__}: {error}"


def child_main(collector: Collector, options: DumpOptions, redactor: Redactor, write_fd: int) -> None:
    """Runs in the child (forked or spawned); never returns."""
    code = 0
    try:
        os.setsid()  # its own process group: the deadline kills whatever it started too
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # nothing a collector (or a library it calls) prints can reach the dump's output
            os.dup2(devnull, fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from tpu_tools.pjrt.child import die_with_parent

        die_with_parent()
        _send(write_fd, ("started",))
        context = CollectContext(collector.name, options, redactor,
                                 emit=lambda f: _send(write_fd, ("file", f)),
                                 emit_note=lambda n: _send(write_fd, ("note", n)))
        status, error, trace = STATUS_OK, None, None
        try:
            collector.collect(context)
        except Skipped as exc:
            status, error = STATUS_SKIPPED, str(exc)
        except TimedOut as exc:
            status, error = STATUS_TIMED_OUT, str(exc)
        except BaseException as exc:  # noqa: BLE001 a collector's failure is a result, not the dump's failure
            status, error, trace = STATUS_FAILED, _error_text(exc), traceback.format_exc()
        _send(write_fd, ("done", status, redactor.text(error) if error else None,
                         redactor.text(trace) if trace else None))
    except BaseException:  # noqa: BLE001 a forked collector leaves through os._exit, whatever happened
        code = 1
    finally:
        os._exit(code)  # no atexit handlers, no flushing the parent's buffers twice


# --- the parent ------------------------------------------------------------------------------------

@dataclass
class _Running:
    collector: Collector
    pid: int
    fd: int
    started: float
    deadline: float
    timeout_s: float
    result: CollectorResult
    buffer: bytearray = field(default_factory=bytearray)
    finished: bool = False  # the child said "done"
    closed: bool = False
    ended: float | None = None

    def messages(self) -> list[tuple]:
        found = []
        while len(self.buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + length:
                break
            payload = bytes(self.buffer[_HEADER.size:_HEADER.size + length])
            del self.buffer[:_HEADER.size + length]
            found.append(pickle.loads(payload))
        return found


def fork_is_safe() -> bool:
    """True when this process runs one thread: a fork then copies all of it (no lock held by a lost thread)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: judge by what Python knows
        return threading.active_count() == 1 and "jax" not in sys.modules


def _spawn(collector: Collector, options: DumpOptions, redactor: Redactor, write_fd: int) -> int:
    """A fresh interpreter runs the collector (`dump/spawned.py`); its file descriptor 3 is the result pipe."""
    try:
        payload = pickle.dumps((collector, options, redactor), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # a collector built from a lambda cannot cross to another interpreter
        raise OSError(f"it cannot be sent to a fresh process ({type(error).__name__}: {error})") from error
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)  # the caller's modules too
    stdin_read, stdin_write = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        pid = os.posix_spawn(sys.executable, [sys.executable, "-m", "tpu_tools.dump.spawned"], env, file_actions=[
            (os.POSIX_SPAWN_DUP2, stdin_read, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
            (os.POSIX_SPAWN_DUP2, devnull, 2), (os.POSIX_SPAWN_DUP2, write_fd, 3)])
    finally:
        os.close(stdin_read)
        os.close(devnull)
    try:
        with os.fdopen(stdin_write, "wb") as pipe:
            pipe.write(payload)
    except BrokenPipeError:
        pass  # the child died at start: its exit is reported like any other
    return pid


def _start(collector: Collector, options: DumpOptions, redactor: Redactor, fork: bool) -> _Running:
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork() if fork else _spawn(collector, options, redactor, write_fd)
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:
        os.close(read_fd)
        child_main(collector, options, redactor, write_fd)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    now = time.monotonic()
    deadline = now + options.timeout_s + (0.0 if fork else _SPAWN_START_S)
    return _Running(collector, pid, read_fd, now, deadline, options.timeout_s,
                    result=CollectorResult(collector.name, STATUS_FAILED))


def _kill(running: _Running) -> None:
    for kill in (lambda: os.killpg(running.pid, signal.SIGKILL), lambda: os.kill(running.pid, signal.SIGKILL)):
        try:
            kill()
            return
        except (ProcessLookupError, PermissionError):
            continue


def _reap(pid: int, wait_s: float) -> int | None:
    """The child's wait status, or None if it has not exited within `wait_s` (a stuck read: left behind)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _exit_description(status: int | None) -> str:
    if status is None:
        return "stopped answering"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"was killed by {name}"
    return f"exited with status {os.WEXITSTATUS(status)}"


def _drain(running: _Running) -> None:
    """What a killed child wrote before it died is still in the pipe: keep it."""
    while True:
        try:
            chunk = os.read(running.fd, 1 << 20)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        running.buffer += chunk


def _absorb(running: _Running) -> None:
    result = running.result
    assert result is not None
    for message in running.messages():
        kind = message[0]
        if kind == "started":  # the collector's own time starts now (a spawned child took a while to start)
            running.deadline = time.monotonic() + running.timeout_s
        elif kind == "file":
            result.files.append(message[1])
        elif kind == "note":
            result.notes.append(message[1])
        elif kind == "done":
            _, result.status, result.error, result.traceback = message
            running.finished = True


def _close(running: _Running, selector: selectors.BaseSelector) -> None:
    if running.closed:
        return
    running.closed = True
    running.ended = time.monotonic()
    try:
        selector.unregister(running.fd)
    except (KeyError, ValueError):
        pass
    os.close(running.fd)


def run_collectors(collectors: list[Collector], options: DumpOptions, redactor: Redactor,
                   on_progress: Callable[[Progress], None] | None = None) -> list[CollectorResult]:
    """Run every collector at once; returns their results in the given order.

    The run ends by the latest deadline (options.timeout_s after the last child
    started, which is milliseconds after the first when forked). Ctrl-C kills every child.
    """
    order = sorted(collectors, key=lambda c: not c.starts_first)
    fork = fork_is_safe()
    running: list[_Running] = []
    unstarted: list[CollectorResult] = []
    selector = selectors.DefaultSelector()
    try:
        for collector in order:
            try:
                item = _start(collector, options, redactor, fork)
            except OSError as error:  # no more processes or file descriptors: this one is lost, not the dump
                unstarted.append(CollectorResult(collector.name, STATUS_FAILED,
                                                 f"could not start a process for it: {error.strerror or error}"))
                continue
            running.append(item)
            selector.register(item.fd, selectors.EVENT_READ, item)
        pending = {item.fd: item for item in running}
        while pending:
            now = time.monotonic()
            for item in [i for i in pending.values() if now >= i.deadline]:
                _kill(item)
                _drain(item)
                _absorb(item)
                if not item.finished:
                    item.result.status = STATUS_TIMED_OUT
                    item.result.error = f"did not finish within {options.timeout_s:g} s; stopped"
                del pending[item.fd]
                _close(item, selector)
                _reap(item.pid, _KILLED_REAP_WAIT_S)
            if not pending:
                break
            if on_progress is not None:
                on_progress(Progress(len(running) - len(pending), len(running),
                                     [(i.collector.name, now - i.started) for i in pending.values()]))
            wait = min(_TICK_S, max(0.0, min(i.deadline for i in pending.values()) - time.monotonic()))
            for key, _ in selector.select(wait):
                item = key.data
                try:
                    chunk = os.read(item.fd, 1 << 20)
                except BlockingIOError:
                    continue
                if chunk:
                    item.buffer += chunk
                    _absorb(item)
                    continue
                _absorb(item)  # end of file: the child finished or died
                del pending[item.fd]
                _close(item, selector)
                status = _reap(item.pid, _REAP_WAIT_S)
                if not item.finished:
                    item.result.status = STATUS_FAILED
                    item.result.error = f"the collector process {_exit_description(status)} before finishing"
    finally:
        for item in running:
            if not item.closed:  # interrupted: nothing may outlive the dump
                _kill(item)
                _close(item, selector)
                _reap(item.pid, _KILLED_REAP_WAIT_S)
        selector.close()
    by_name = {result.name: result for result in unstarted}
    for item in running:
        item.result.duration_s = round((item.ended or time.monotonic()) - item.started, 3)
        by_name[item.collector.name] = item.result
    return [by_name[collector.name] for collector in collectors]
