"""Publishing the agent's snapshot into a file monitors read, so that reading a job never wakes it.

A step boundary, when the last publication is PUBLISH_INTERVAL_S old or more,
wakes the agent's publishing thread (setting an event: a microsecond in the
thread that marked the step), which builds and writes the snapshot while the
job goes on with its next step, most of which runs outside the interpreter's
lock; a change outside a step (a compile, a metric the job publishes) asks
for one too, and a job that marks no step (compiling, loading, hung in a
collective) is published every IDLE_PUBLISH_S. The cost to the job is then at
most 1 / PUBLISH_INTERVAL_S snapshots a second, whatever the number of monitors
and however often they look. Most of those publications follow only new steps:
they read again what steps change (the steps, goodput, the devices' memory, the
process) and give the rest as the last full snapshot had it
(`_Agent.step_snapshot`); a change outside a step (a compile, a metric, a
checkpoint), and every REFRESH_S, reads everything again.
`TPU_TOOLS_SNAPSHOT_FILE=0` turns the file off: monitors then ask the socket,
as agents before the file did. Nothing here raises into the job: a failure is
kept and reported in the next snapshot.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_tools.metrics import wire
from tpu_tools.metrics.snapfile import SnapshotWriter, snapshot_file_for

ENV_SNAPSHOT_FILE = "TPU_TOOLS_SNAPSHOT_FILE"
PUBLISH_INTERVAL_S = 0.1
IDLE_PUBLISH_S = 1.0
REFRESH_S = 1.0  # every figure of the snapshot is read again at least this often


class PublishOnCompile:
    """A compile listener's sink (tpu_tools.instrument.compiles): the running publisher publishes each record."""

    def add_event(self, event: Any) -> None:
        publisher = _running
        if publisher is not None:
            publisher.request()

    def add_miss(self, miss: Any) -> None:
        self.add_event(miss)


PUBLISH_SINK = PublishOnCompile()  # one per process: the compile listener keeps its sinks for good
_running: Publisher | None = None  # this process's started publisher


def publishing_wanted() -> bool:
    """False when $TPU_TOOLS_SNAPSHOT_FILE turns the snapshot file off ("0", "no", "off", "false")."""
    return os.environ.get(ENV_SNAPSHOT_FILE, "").strip().lower() not in ("0", "no", "off", "false")


class Publisher:
    """Writes `build()` into the snapshot file beside `socket` at step boundaries and when the job is idle."""

    def __init__(self, socket: Path, build: Callable[[], dict[str, Any]], build_since: Callable[[], dict[str, Any]],
                 *, refresh_s: float = REFRESH_S, idle_s: float = IDLE_PUBLISH_S):
        """build: a full snapshot; build_since: the last full one with what steps change read again; a full one
        at least every `refresh_s`, and a publication every `idle_s` when nothing asks for one."""
        self._build = build
        self._build_since = build_since
        self._refresh_s = refresh_s
        self._idle_s = idle_s
        self._writer = SnapshotWriter(snapshot_file_for(socket), wire.MAX_RESPONSE_BYTES)
        self._last = 0.0
        self._refreshed = 0.0  # time.monotonic() of the last full publication
        self._changed = True  # something outside a step changed since the last full publication
        self._busy = threading.Lock()  # one publication at a time; a step boundary never waits for another
        self._due = threading.Event()  # a step boundary or a change asks for a publication, or stop() for the end
        self._stopped = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.published = 0
        self.last_error: str | None = None

    @property
    def path(self) -> Path:
        return self._writer.path

    def start(self) -> None:
        """Create the file, publish a first snapshot and start the publishing thread; raises OSError when it
        cannot."""
        global _running
        self._writer.create()
        self.publish()
        _running = self
        self._thread = threading.Thread(target=self._run, name="tpu-tools-agent-publish", daemon=True)
        self._thread.start()

    def at_step(self, index: int, step_time_s: float | None) -> None:
        """A step callback: ask for a publication when the last one is PUBLISH_INTERVAL_S old or more."""
        if time.monotonic() - self._last >= PUBLISH_INTERVAL_S:
            self._due.set()

    def publish(self) -> None:
        if not self._busy.acquire(blocking=False):
            return
        try:
            self._last = now = time.monotonic()
            refresh = self._changed or now - self._refreshed >= self._refresh_s
            if refresh:  # cleared before the build: a change while it runs is in the next publication
                self._changed, self._refreshed = False, now
            document = {**(self._build() if refresh else self._build_since()), "published_unix_s": time.time()}
            if self.last_error is not None:
                document["publish_error"] = self.last_error
            if self._writer.publish(wire.encode_response(document)):
                self.published += 1
                self.last_error = None  # said once, in the snapshot just published
            else:
                self.last_error = "a snapshot larger than the file allows was not published"
        except Exception as error:  # noqa: BLE001 never into the job: the next snapshot (or the socket) says why
            self.last_error = f"{type(error).__name__}: {error}"
        finally:
            self._busy.release()

    def request(self) -> None:
        """Something the snapshot shows changed outside a step (a compile, a metric): publish it
        soon, PUBLISH_INTERVAL_S after the last publication at the earliest, every figure read again."""
        self._changed = True
        self._due.set()

    def _run(self) -> None:
        while True:
            asked = self._due.wait(max(0.0, self._last + self._idle_s - time.monotonic()))
            if self._stopping:
                return
            if asked:
                early = self._last + PUBLISH_INTERVAL_S - time.monotonic()
                if early > 0 and self._stopped.wait(early):
                    return
                self._due.clear()
            if asked or time.monotonic() - self._last >= self._idle_s:
                self.publish()

    def stop(self) -> None:
        """Stop the publishing thread and remove the file (from the process that created it)."""
        global _running
        if _running is self:
            _running = None
        self._stopping = True
        self._stopped.set()
        self._due.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        self._writer.close()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's file and thread are not the child's."""
        global _running
        _running = None
        self._thread = None
        self._writer.forget_after_fork()
