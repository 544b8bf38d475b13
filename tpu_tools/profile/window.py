"""When the trace is on: the whole run, a time window, or a window of steps.

`TraceController` opens and closes one trace from events, whatever their
source: the runtime coming up (a device trace can only start once the PJRT
backends exist), its own timers (`--delay`, `--duration`), step boundaries
(`step(index, step_time_s)`, the signature of a step-marker callback), and
the end of the program. The tracer itself is anything with start() and stop().
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

WAITING, TRACING, DONE = "waiting", "tracing", "done"


class Tracer(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class WindowSpec:
    delay_s: float = 0.0
    duration_s: float | None = None  # None: until the program ends
    start_step: int | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        if self.delay_s < 0 or (self.duration_s is not None and self.duration_s <= 0):
            raise ValueError("delay must be >= 0 and duration > 0")
        if (self.start_step is None) != (self.steps is None):
            raise ValueError("a step window needs both a first step and a number of steps")
        if self.start_step is not None and (self.start_step < 0 or (self.steps or 0) < 1):
            raise ValueError("the first step must be >= 0 and the number of steps >= 1")

    @property
    def mode(self) -> str:
        if self.start_step is not None:
            return "steps"
        return "time" if self.delay_s or self.duration_s is not None else "whole"

    def describe(self) -> str:
        if self.mode == "steps":
            return f"steps {self.start_step} to {self.start_step + self.steps - 1}"  # type: ignore[operator]
        if self.mode == "time":
            end = f"for {self.duration_s:g} s" if self.duration_s is not None else "to the end"
            return f"from {self.delay_s:g} s {end}"
        return "the whole run"


@dataclass
class WindowResult:
    mode: str
    delay_s: float
    duration_s: float | None
    start_step: int | None
    steps: int | None
    opened: bool = False
    opened_at_s: float | None = None  # since the program started
    closed_at_s: float | None = None
    first_step: int | None = None  # step boundaries the window opened and closed at
    last_step: int | None = None
    closed_by: str | None = None  # "duration", "steps", "program end"
    note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TraceController:
    spec: WindowSpec
    tracer: Tracer
    clock: Callable[[], float] = time.monotonic
    state: str = WAITING
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _runtime_ready: bool = False
    _due: bool = False  # the delay passed before the runtime was up
    _begun_at: float = 0.0
    _timers: list[threading.Timer] = field(default_factory=list)
    _result: WindowResult | None = None

    def __post_init__(self) -> None:
        s = self.spec
        self._result = WindowResult(s.mode, s.delay_s, s.duration_s, s.start_step, s.steps)

    @property
    def result(self) -> WindowResult:
        assert self._result is not None
        return self._result

    # --- events -------------------------------------------------------------------------------------

    def begin(self) -> None:
        """The program starts: arm the delay."""
        with self._lock:
            self._begun_at = self.clock()
            if self.spec.mode == "time" and self.spec.delay_s > 0:
                self._timer(self.spec.delay_s, self._delay_passed)
            elif self.spec.mode in ("time", "whole") or self.spec.start_step == 0:
                self._due = True  # step 0 begins with the program

    def runtime_ready(self) -> None:
        """The PJRT backends are up; a trace can start from now on."""
        with self._lock:
            self._runtime_ready = True
            if self._due:
                self._open()

    def step(self, step_index: int, step_time_s: float | None = None) -> None:
        """Step `step_index` (0 for the first) just ended: the boundary before step `step_index + 1`.

        The signature of `tpu_tools.agent.on_step` callbacks. A window of steps
        N..N+M-1 opens at the end of step N-1 and closes at the end of step N+M-1.
        """
        spec = self.spec
        if spec.mode != "steps":
            return
        first, count = spec.start_step or 0, spec.steps or 0
        beginning = step_index + 1
        with self._lock:
            if self.state == WAITING and beginning >= first and self._runtime_ready:
                if self._open():
                    self.result.first_step = beginning
            elif self.state == TRACING and beginning >= (self.result.first_step or 0) + count:
                self.result.last_step = step_index
                self._close("steps")

    def finish(self) -> WindowResult:
        """The program ended (or was interrupted): close the trace if it is open."""
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            if self.state == TRACING:
                self._close("program end")
            elif self.state == WAITING:
                self.state = DONE
                self.result.note = self.result.note or self._never_opened_reason()
            return self.result

    # --- internals ----------------------------------------------------------------------------------

    def _timer(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _delay_passed(self) -> None:
        with self._lock:
            self._due = True
            if self._runtime_ready:
                self._open()

    def _open(self) -> bool:
        if self.state != WAITING:
            return False
        try:
            self.tracer.start()
        except Exception as error:  # noqa: BLE001 e.g. the program runs a jax.profiler trace of its own
            self.state = DONE
            self.result.note = f"the trace could not start: {error}"
            return False
        self.state = TRACING
        self.result.opened = True
        if self.spec.mode == "steps" and self.result.first_step is None:
            self.result.first_step = 0  # opened with the runtime: the window starts at step 0
        self.result.opened_at_s = self.clock() - self._begun_at
        if self.spec.mode == "time" and self.spec.duration_s is not None:
            self._timer(self.spec.duration_s, lambda: self._close_from_timer("duration"))
        return True

    def _close_from_timer(self, reason: str) -> None:
        with self._lock:
            if self.state == TRACING:
                self._close(reason)

    def _close(self, reason: str) -> None:
        self.state = DONE
        self.result.closed_at_s = self.clock() - self._begun_at
        self.result.closed_by = reason
        try:
            self.tracer.stop()
        except Exception as error:  # noqa: BLE001 the profiler fails its own ways: the result's note says so
            self.result.note = f"the trace could not be written: {error}"

    def _never_opened_reason(self) -> str:
        elapsed = self.clock() - self._begun_at
        if not self._runtime_ready:
            return "the program never started a JAX runtime, so there was nothing to trace"
        if self.spec.mode == "steps":
            return f"the program ended before step {self.spec.start_step} was marked"
        return f"the program ended after {elapsed:.1f} s, before the trace window opened at {self.spec.delay_s:g} s"
