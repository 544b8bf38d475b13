"""Where every Python thread of the job is: the answer to a `stacks` request, and a signal for a stuck job.

A job whose interpreter is stuck holding its lock cannot answer on the socket.
For that job `faulthandler` is registered on STACKS_SIGNAL (SIGUSR2 unless
$TPU_TOOLS_STACKS_SIGNAL names another, or "0" for none): the signal makes the
interpreter's C handler write every thread's stack into `agent-<pid>.stacks` in
the run directory without taking the lock. The registration chains to the
handler that was there (`chain=True`), so a job's own SIGUSR2 handler still
runs; a job that installs its own handler after the agent starts replaces this
one, and the snapshot then still names the signal: readers send it only to a
process whose live agent publishes that it is registered.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

ENV_STACKS_SIGNAL = "TPU_TOOLS_STACKS_SIGNAL"
DEFAULT_SIGNAL = signal.SIGUSR2
MAX_THREADS = 256
MAX_FRAMES = 64  # the innermost ones: where a thread is, not how it got there
AGENT_THREAD_PREFIX = "tpu-tools-"  # the agent's own threads are not the job's


def thread_stacks() -> dict[str, Any]:
    """{"time_unix_s", "threads": [{"name", "id", "main", "daemon", "frames": [{"file", "line", "function"}]}]},
    frames outermost first; the agent's own threads left out."""
    known = {thread.ident: thread for thread in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        thread = known.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        if name.startswith(AGENT_THREAD_PREFIX):
            continue
        frames = [{"file": entry.filename, "line": entry.lineno, "function": entry.name}
                  for entry in traceback.extract_stack(frame, limit=MAX_FRAMES)]
        threads.append({"name": name, "id": ident, "main": ident == main,
                        "daemon": thread.daemon if thread is not None else None, "frames": frames})
        if len(threads) >= MAX_THREADS:
            break
    threads.sort(key=lambda entry: not entry["main"])
    return {"time_unix_s": time.time(), "threads": threads}


def chosen_signal() -> int | None:
    """The signal faulthandler listens on: $TPU_TOOLS_STACKS_SIGNAL (a number or a name such as SIGUSR1), SIGUSR2
    by default, None when it says "0" or names no signal this platform has."""
    value = os.environ.get(ENV_STACKS_SIGNAL, "").strip()
    if not value:
        return int(DEFAULT_SIGNAL)
    if value.isdigit():
        number = int(value)
        return number if 0 < number < signal.NSIG and number not in (signal.SIGKILL, signal.SIGSTOP) else None
    named = getattr(signal, value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}", None)
    return int(named) if isinstance(named, signal.Signals) and named not in (signal.SIGKILL, signal.SIGSTOP) else None


class FaultStacks:
    """faulthandler registered on a signal, writing into the run directory's `agent-<pid>.stacks`."""

    def __init__(self, path: Path):
        self.path = path
        self.signal: int | None = None
        self._file: IO[str] | None = None
        self._owner_pid = os.getpid()

    def start(self) -> None:
        """Register (when a signal is chosen); an OSError or ValueError leaves the job without it, nothing else."""
        number = chosen_signal()
        if number is None:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        stream = os.fdopen(fd, "w")
        # Chain only to a handler of the job's (a Python one, or None: installed outside Python): chaining to the
        # default action would end the job, which is what SIGUSR2's default action does.
        chain = signal.getsignal(number) not in (signal.SIG_DFL, signal.SIG_IGN)
        try:
            faulthandler.register(number, file=stream, all_threads=True, chain=chain)
        except (OSError, ValueError, RuntimeError):
            stream.close()
            os.unlink(self.path)
            raise
        self._file, self.signal = stream, number

    def stop(self) -> None:
        """Unregister and remove the file (from the process that created it)."""
        if self.signal is not None:
            faulthandler.unregister(self.signal)
            self.signal = None
        if self._file is not None:
            self._file.close()
            self._file = None
            if os.getpid() == self._owner_pid:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass

    def forget_after_fork(self) -> None:
        """In a forked child: not the parent's file to write into."""
        self._owner_pid = -1
        self.stop()
