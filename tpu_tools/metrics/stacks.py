"""Reading where a job's threads are: faulthandler's text, and the frame a stalled worker is in.

Stacks come from the agent's `stacks` answer or, for a job stuck holding its
interpreter's lock, from the text faulthandler writes into the run directory's
`agent-<pid>.stacks` on the signal the agent registered
(tpu_tools.agent.stacks). Both become the same record (records.agent.Stacks):
threads, each with its frames outermost first.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from tpu_tools.metrics.records.agent import Frame, Stacks, Thread
from tpu_tools.metrics.rundir import private_file_problem

MAX_FAULT_TEXT = 4 << 20
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
# Where a frame is library code, not the job's: the standard library, installed packages, frozen modules
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
_SETTLE_S = 0.05  # faulthandler writes without pause; a file unchanged this long is whole


class StacksError(Exception):
    """The stacks could not be read; the message says why in one sentence."""


def parse_fault_text(text: str) -> Stacks:
    """faulthandler's all-threads dump as a Stacks record; the thread whose outermost frame is `<module>` is main."""
    threads: list[Thread] = []
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            threads.append(Thread(name=f"thread {header.group(2)}", id=int(header.group(2), 16), main=False,
                                  frames=[]))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            frames = threads[-1].frames
            assert frames is not None  # made with a list just above
            frames.insert(0, Frame(file=frame.group(1), line=int(frame.group(2)), function=frame.group(3)))
    for thread in threads:
        thread.main = bool(thread.frames) and thread.frames is not None and thread.frames[0].function == "<module>"
    threads.sort(key=lambda entry: not entry.main)
    return Stacks(time_unix_s=time.time(), threads=threads)


def is_library(file: str) -> bool:
    return any(marker in file for marker in _LIBRARY)


def main_thread(stacks: Stacks) -> Thread | None:
    """The job's main thread, else its first; None without threads."""
    threads = stacks.threads or []
    return next((t for t in threads if t.main), threads[0] if threads else None)


def where(stacks: Stacks) -> str | None:
    """"function (file:line)" of the innermost frame of the job's own code in its main thread (else its first
    thread; else the innermost frame of any kind); None without frames."""
    thread = main_thread(stacks)
    frames = (thread.frames if thread is not None else None) or []
    if not frames:
        return None
    frame = next((f for f in reversed(frames) if not is_library(f.file or "")), frames[-1])
    return f"{frame.function} ({os.path.basename(frame.file or '?')}:{frame.line})"


def read_fault_stacks(pid: int, signal_number: int, path: Path, timeout_s: float) -> Stacks:
    """Send `signal_number` to `pid` and read what faulthandler appends to `path` (this user's private file)
    within `timeout_s`, as a Stacks record. Raises StacksError."""
    fd = _open_private(path)
    try:
        before = os.fstat(fd).st_size
        try:
            os.kill(pid, signal_number)
        except OSError as error:
            raise StacksError(f"cannot signal process {pid}: {error.strerror}") from error
        deadline = time.monotonic() + timeout_s
        size, changed = before, time.monotonic()
        while True:
            now_size = os.fstat(fd).st_size
            if now_size != size:
                size, changed = now_size, time.monotonic()
            elif size > before and time.monotonic() - changed >= _SETTLE_S:
                break
            if time.monotonic() >= deadline:
                if size > before:
                    break
                raise StacksError(f"process {pid} wrote no stacks within {timeout_s:g} s of the signal")
            time.sleep(0.01)
        text = os.pread(fd, min(size - before, MAX_FAULT_TEXT), before).decode("utf-8", "replace")
    finally:
        os.close(fd)
    stacks = parse_fault_text(text)
    if not stacks.threads:
        raise StacksError(f"process {pid} wrote something that is not faulthandler's stacks")
    return stacks


def _open_private(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise StacksError(f"{path.name} cannot be opened ({error.strerror})") from error
    problem = private_file_problem(os.fstat(fd), stat.S_ISREG, "a regular file")
    if problem:
        os.close(fd)
        raise StacksError(f"{path.name} {problem}; not using it")
    return fd
