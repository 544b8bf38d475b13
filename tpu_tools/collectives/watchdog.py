"""Ends a run that makes no progress, with a sentence saying where it stopped and who is missing.

A collective whose peer died or hung never returns, and a blocked runtime call
cannot be interrupted from Python. So a thread watches the main thread's
progress marks; when none came for `timeout_s` it asks for a diagnosis (which
ranks stopped), hands the sentence to `on_expire` (the CLI reports it) and
ends the process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

EXIT_STATUS = 1
_TICK_S = 0.1


class Watchdog:
    def __init__(self, timeout_s: float, on_expire: Callable[[str], None],
                 diagnose: Callable[[str, float], str] | None = None,
                 presample: Callable[[], None] | None = None, presample_lead_s: float = 2.0,
                 before_exit: Callable[[], None] | None = None, exit_margin_s: float = 0.0):
        # Speak this much before the time limit, so that `before_exit` (process 0 lingering for
        # the others to read its coordinator) still ends the process within the limit.
        self.timeout_s = max(0.5, timeout_s - exit_margin_s)
        self._on_expire = on_expire
        self._diagnose = diagnose or plain_diagnosis
        self._presample = presample
        # Liveness is judged from two samples this far apart, the second at the deadline.
        self.presample_lead_s = min(presample_lead_s, timeout_s / 2)
        self._before_exit = before_exit
        self._lock = threading.Lock()
        self._activity = "starting"
        self._last = time.monotonic()
        self._sampled = False
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tpu-tools-watchdog", daemon=True)

    def start(self, activity: str) -> Watchdog:
        self.progress(activity)
        self._thread.start()
        return self

    def progress(self, activity: str | None = None) -> None:
        """The work moved on (optionally to a new activity, named in the error)."""
        with self._lock:
            self._last = time.monotonic()
            self._sampled = False
            self._armed = True
            if activity is not None:
                self._activity = activity

    def pause(self) -> None:
        """Waiting for something with its own time limit: stop watching until the next progress mark."""
        with self._lock:
            self._armed = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2)

    def _watch(self) -> None:
        while not self._stop.wait(_TICK_S):
            with self._lock:
                if not self._armed:
                    continue
                elapsed = time.monotonic() - self._last
                activity = self._activity
                presample = not self._sampled and elapsed >= self.timeout_s - self.presample_lead_s
                if presample:
                    self._sampled = True
            if presample and self._presample is not None:
                self._safely(self._presample)
            if elapsed >= self.timeout_s:
                self._expire(activity, elapsed)
                return

    def _expire(self, activity: str, elapsed: float) -> None:
        try:
            message = self._diagnose(activity, elapsed)
        except Exception as error:  # noqa: BLE001 the diagnosis is best effort; the exit is not
            message = plain_diagnosis(activity, elapsed) + f" (diagnosis failed: {error})"
        try:
            self._on_expire(message)
        finally:
            if self._before_exit is not None:
                self._safely(self._before_exit)
            os._exit(EXIT_STATUS)

    @staticmethod
    def _safely(function: Callable[[], None]) -> None:
        try:
            function()
        except Exception:  # noqa: BLE001 the watchdog's exit path must run whatever a step raises
            pass


def plain_diagnosis(activity: str, elapsed: float) -> str:
    return (f"no progress for {elapsed:.0f} s in {activity}: the runtime hung "
            "(raise --timeout if this step needs longer)")
