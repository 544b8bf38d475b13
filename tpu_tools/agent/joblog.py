"""This process's part of its job's durable log (tpu_tools.metrics.joblog), written off the step path.

The job's calls (`checkpoint_saved`, `checkpoint_restored`) and its step boundaries only note what happened
(a clock read, a deque append, an event set); a thread of the agent writes the lines: the process's start, and
the death of a predecessor in its place it finds without an end; its first step; each checkpoint saved and
restored; every `heartbeat_s` its last step seen (its last sign of life, so a death is known to within that
period), with its goodput ledger's figures at most every CAUSES_EVERY_S (they cost a third of a line's time),
written right after a step that ends a period without one; its end.
A write that fails (a full disk, a lost shared filesystem) is kept for the snapshot and tried again with the
next line; nothing raises into the job.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_tools.metrics.joblife import job_life
from tpu_tools.metrics.joblog import JobEvent, JobIdentity, append, host_name, log_path, read_log
from tpu_tools.parsing import parse_number

ENV_HEARTBEAT = "TPU_TOOLS_JOB_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 1.0
CAUSES_EVERY_S = 1.0
END_TIMEOUT_S = 2.0  # what the job's exit waits at most for its last lines


def heartbeat_s() -> float:
    """$TPU_TOOLS_JOB_HEARTBEAT_S (0.05 to 3600 s), else DEFAULT_HEARTBEAT_S."""
    text = os.environ.get(ENV_HEARTBEAT, "").strip()
    if not text:
        return DEFAULT_HEARTBEAT_S
    try:
        return float(parse_number(text, ENV_HEARTBEAT, minimum=0.05, maximum=3600.0))
    except ValueError:
        return DEFAULT_HEARTBEAT_S


class JobLogWriter:
    """Appends this process's events to its job's log from a thread of its own."""

    def __init__(self, identity: JobIdentity, started_unix_s: float, causes: Callable[[], dict[str, float]],
                 directory: Path | None = None, period_s: float | None = None):
        self.identity = identity
        self.path = log_path(identity.job, directory)
        self.period_s = heartbeat_s() if period_s is None else period_s
        self.error: str | None = None  # the last write that failed, for the snapshot
        self._host = host_name()
        self._pid = os.getpid()
        self._started = started_unix_s
        self._name = f"{self._host}/{self._pid}/{int(started_unix_s * 1000)}"
        self._causes = causes
        self._pending: deque[JobEvent] = deque(maxlen=1024)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_offset = 0  # job step = this process's step count + offset (checkpoint_restored)
        self._step: int | None = None
        self._step_unix_s: float | None = None
        self.last_checkpoint_step: int | None = None
        self._first_noted = False
        self._alive_written = 0.0  # time.monotonic() of the last line of life

    @property
    def job_step(self) -> int | None:
        return self._step

    def event(self, kind: Any, **fields: Any) -> JobEvent:
        return JobEvent(kind, time.time(), self._name, self._host, self._pid, self.identity.worker, **fields)

    def start(self) -> None:
        self._pending.append(self.event("start", started_unix_s=self._started,
                                        identity_source=self.identity.source, heartbeat_s=self.period_s))
        self._thread = threading.Thread(target=self._run, name="tpu-tools-joblog", daemon=True)
        self._thread.start()

    # --- what the job's thread calls: no I/O ---------------------------------------------------------------

    def at_step(self, count: int) -> None:
        """A step boundary: `count` steps done in this process."""
        self._step = count + self._step_offset
        self._step_unix_s = time.time()
        if time.monotonic() - self._alive_written >= self.period_s:
            self._wake.set()  # a step after a quiet period is written now, not up to a period later
        if not self._first_noted:
            self._first_noted = True
            self._pending.append(self.event("first_step", step=self._step, step_unix_s=self._step_unix_s))
            self._wake.set()

    def checkpoint_saved(self, step: int) -> None:
        self.last_checkpoint_step = step
        self._pending.append(self.event("checkpoint", step=step))
        self._wake.set()

    def checkpoint_restored(self, step: int, count: int) -> None:
        self._step_offset = step - count
        self._step = step if self._step is None else count + self._step_offset
        self._pending.append(self.event("restore", step=step))
        self._wake.set()

    # --- the writing thread -------------------------------------------------------------------------------

    def _write(self, event: JobEvent) -> bool:
        try:
            append(self.path, event)
            return True
        except Exception as error:  # noqa: BLE001 kept for the snapshot; the job goes on
            self.error = f"{self.path}: {type(error).__name__}: {error}"[:500]
            return False

    def _flush(self) -> None:
        while self._pending:
            if not self._write(self._pending[0]):
                return
            self._pending.popleft()
        self.error = None

    def _predecessors_died(self) -> None:
        """Say in the log that the processes before this one in its place are dead (they left no end)."""
        try:
            events = read_log(self.path).events
        except OSError:
            return
        life = job_life(events, lambda process: False)
        for place in life.places:
            for process in place.processes:
                if process.process != self._name and process.state == "running" and place.place == (
                        self.identity.worker or self._host):
                    self._pending.append(self.event("died", of_process=process.process))

    def _alive(self, with_causes: bool = True) -> JobEvent:
        causes = None
        if with_causes:
            try:
                causes = self._causes()
            except Exception:  # noqa: BLE001 the ledger's figures are a bonus of the line, never its cost
                causes = None
        return self.event("alive", step=self._step, step_unix_s=self._step_unix_s, causes_s=causes)

    def _run(self) -> None:
        self._predecessors_died()
        last_causes = -CAUSES_EVERY_S
        while not self._stopping.is_set():
            self._flush()
            now = self._alive_written = time.monotonic()  # before writing: a step meanwhile asks for no other
            with_causes = now - last_causes >= CAUSES_EVERY_S * 0.95  # a heartbeat of 1 s a little early
            if self._write(self._alive(with_causes)) and with_causes:
                last_causes = now
            self._wake.wait(self.period_s)
            self._wake.clear()

    def stop(self) -> None:
        """The process's end: its last figures and its end line, waited for at most END_TIMEOUT_S."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(END_TIMEOUT_S)
        if self._thread is not None and self._thread.is_alive():
            return  # the filesystem hangs: the job's exit does not wait for it, its next process sees it dead
        self._flush()
        alive = self._alive()
        self._write(self.event("end", step=alive.step, step_unix_s=alive.step_unix_s, causes_s=alive.causes_s))

    def forget_after_fork(self) -> None:
        self._thread = None
        self._stopping.set()

    def snapshot(self) -> dict[str, Any]:
        return {"id": self.identity.job, "source": self.identity.source, "worker": self.identity.worker,
                "log": str(self.path), "step": self._step, "last_checkpoint_step": self.last_checkpoint_step,
                "log_error": self.error}
