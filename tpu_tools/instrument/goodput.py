"""The goodput ledger: where a job's wall time went, since the process started, cause by cause.

Every second of the process's life is given to exactly one cause:

- `productive`: inside a step (the block of `step_context()`, or with bare `step()` the time
  between two step boundaries);
- `startup`: before the first step began (interpreter, imports, backend start);
- `compile`: tracing, lowering and XLA compiles, as JAX reports them (wherever they happen);
- a phase the job labels (`data`, `checkpoint`, `eval` or its own name) with `phase(name)`;
- `host`: time between steps that no phase claims (with `step_context()` only);
- `idle`: a gap between steps longer than `idle_factor` times the median step time (and at least
  `idle_min_s`): the job is stuck or waiting.

Phases and compiles *claim* their time from whatever interval they fall in; the rest of the
interval goes to the interval's own cause when it closes (a step boundary). A step boundary
costs the training thread a clock read and an append: the ledger accounts it at its next use
(`end_step`); statistics are made when someone asks.

FLOPs and samples per step feed MFU, samples/s and the cost per 1M samples; a figure that
was never given is unknown (None), never 0. Without a figure from the job, a step's FLOPs are
those of its programs (`add_program`, from XLA's cost analysis as JAX builds them): the
programs compiled while a step was under way (a `step_context()` block, or with bare `step()`
the interval that ends at a step boundary, the first one included), not inside a phase, the
latest of each name. A compiled program is assumed to run once per step: executions that
reuse it are not seen, so a step that runs one program twice is counted once. Bad figures are counted in `rejected` and
never raise: this code runs inside the job's training loop.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tpu_tools.instrument.jobvalues import finite_at_least, job_name
from tpu_tools.shorten import quoted

PRODUCTIVE = "productive"
STARTUP = "startup"
COMPILE = "compile"
HOST = "host"
IDLE = "idle"
NAMED_PHASES = ("data", "checkpoint", "eval")
BUILTIN = (PRODUCTIVE, STARTUP, COMPILE, HOST, IDLE, *NAMED_PHASES)
OTHER_PHASE = "other"  # custom phases beyond MAX_CUSTOM_PHASES, and names that are not acceptable
MAX_CUSTOM_PHASES = 16
MAX_PHASE_NAME = 48
_PHASE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")

WINDOW_S = 60.0  # the "recent" figures cover the last this many seconds
_HISTORY_PERIOD_S = 1.0  # one point of history per second at most
_MEDIAN_EVERY = 32  # steps between recomputations of the median step time
_RECENT_STEPS = 255
_MAX_UNSETTLED = 64  # steps noted before the training thread accounts them itself
PROGRAMS_SOURCE = "xla_step_programs"  # step_flops_source of the FLOPs of the step's programs
MAX_PROGRAMS_SHOWN = 16
MAX_STEP_PROGRAMS = 64  # distinct program names kept as a step's programs; later ones are not counted


def process_start_unix_s() -> float | None:
    """When this process started (Linux /proc, 10 ms resolution); None where it cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields after the command name start at 3
        # The start is in ticks since boot; /proc/stat's btime is in whole seconds (up to 1 s early), so the age
        # is taken on the boot-time clock instead and subtracted from now.
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@dataclass
class LedgerSettings:
    idle_factor: float = 10.0
    idle_min_s: float = 1.0
    window_s: float = WINDOW_S


def _finite_non_negative(value: Any) -> float | None:
    return finite_at_least(value, 0.0)


class GoodputLedger:
    """Accumulates seconds per cause; `snapshot()` gives the figures. Thread-safe; never raises into callers."""

    def __init__(self, start_perf_s: float, start_unix_s: float, settings: LedgerSettings | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.settings = settings or LedgerSettings()
        self.start_unix_s = start_unix_s
        self._clock = clock
        self._start = start_perf_s
        self._lock = threading.Lock()
        self._totals: dict[str, float] = dict.fromkeys(BUILTIN, 0.0)
        self._cursor = start_perf_s  # everything before this is accounted for
        self._claimed = 0.0  # seconds after the cursor already claimed by phases and compiles
        self._claimed_total = 0.0  # every claim ever: a phase subtracts what was claimed inside it
        self._in_block = False
        self._uses_blocks = False
        self._steps = 0
        self._recent: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._median: float | None = None
        self._idle_threshold = math.inf
        self._flops_total = 0.0
        self._flops_steps = 0
        self._samples_total = 0.0
        self._samples_steps = 0
        self._pending_flops: float | None = None
        self._pending_samples: float | None = None
        self._default_flops: float | None = None
        self._default_flops_source: str | None = None
        self._interval_programs: dict[str, float | None] = {}  # compiled in the interval under way
        self._step_programs: dict[str, float | None] = {}  # the programs each step runs, by name
        self._program_flops: float | None = None  # their sum: the steps' FLOPs when the job gives none
        self._local = threading.local()  # phases open on each thread: their compiles are not the step's
        self._rejected: dict[str, int] = {}
        self._last_error: str | None = None
        self._history: deque[tuple[float, dict[str, float], float, float]] = deque()
        self._next_history = start_perf_s
        self._ended: deque[float] = deque()  # when each step not yet accounted ended (see end_step)

    # --- what the job's loop calls ---------------------------------------------------------------

    def begin_step(self, now: float | None = None) -> None:
        """A step's block begins: the gap before it goes to host (or startup before the first step)."""
        now = self._clock() if now is None else now
        with self._accounted():
            self._uses_blocks = True
            self._close(now, STARTUP if self._steps == 0 else HOST)
            self._in_block = True
            if self._interval_programs:  # compiled between steps (set-up, host work): not the step's
                self._interval_programs = {}

    def end_step(self, now: float | None = None) -> None:
        """A step ended: its block (or with bare step(), the time since the last boundary) is productive.

        Noted here and accounted by the ledger's next use (any of its calls, or the snapshot a monitor reads), in
        the order the steps ended: the training thread pays for a clock read and an append, not for the
        accounting with the caches its step left cold. A job nobody reads settles every _MAX_UNSETTLED steps.
        """
        self._ended.append(self._clock() if now is None else now)
        if len(self._ended) >= _MAX_UNSETTLED:
            with self._lock:
                self._settle()

    def note_work(self, flops: Any = None, samples: Any = None) -> None:
        """FLOPs and samples of the step about to end (`step(flops=..., samples=...)`); bad values are rejected."""
        with self._accounted():
            if flops is not None:
                value = _finite_non_negative(flops)
                if value is None:
                    self._reject("flops", f"flops={quoted(flops, 40)} is not a finite number >= 0; ignored")
                else:
                    self._pending_flops = value
            if samples is not None:
                value = _finite_non_negative(samples)
                if value is None:
                    self._reject("samples", f"samples={quoted(samples, 40)} is not a finite number >= 0; ignored")
                else:
                    self._pending_samples = value

    def set_step_flops(self, flops: Any, source: str) -> float | None:
        """FLOPs of every later step that does not give its own (from XLA's cost analysis or the user);
        returns the FLOPs taken, None when the value was rejected."""
        value = _finite_non_negative(flops)
        with self._accounted():
            if value is None:
                self._reject("flops", f"step FLOPs {quoted(flops, 40)} from {source} are not a finite number >= 0")
                return None
            self._default_flops, self._default_flops_source = value, source
            return value

    def add_program(self, name: str, flops: float | None) -> None:
        """A program JAX just built (compiled or loaded), with XLA's FLOPs of one run (None: unknown).

        Called on the thread that compiles, i.e. the thread that will run it: kept for the step under
        way unless a phase is open on that thread.
        """
        if getattr(self._local, "phases", 0):
            return
        value = _finite_non_negative(flops) if flops is not None else None
        with self._accounted():
            if name in self._interval_programs or len(self._interval_programs) < MAX_STEP_PROGRAMS:
                self._interval_programs[name] = value

    def add_compile(self, seconds: float) -> None:
        """Time JAX spent compiling (one stage of one compilation), taken from whatever it interrupted."""
        self.add_claimed(COMPILE, seconds)

    def add_claimed(self, cause: str, seconds: float) -> None:
        """Seconds that just ended, measured by someone else (JAX's compiles, Orbax's blocking saves)."""
        value = _finite_non_negative(seconds)
        if value is None:
            return
        now = self._clock()
        with self._accounted():
            self._claim(cause, value, now)

    @contextmanager
    def phase(self, name: Any) -> Iterator[None]:
        """Give the block's time (less compiles and inner phases) to the phase `name`."""
        start = self._clock()
        claimed_before = self._claimed_total
        local = self._local
        local.phases = getattr(local, "phases", 0) + 1
        try:
            yield
        finally:
            local.phases -= 1
            try:
                now = self._clock()
                with self._accounted():
                    cause = self._phase_cause(name)
                    self._claim(cause, max(0.0, (now - start) - (self._claimed_total - claimed_before)), now)
            except Exception:  # noqa: BLE001 the job's own exception, if any, goes on; ours never does
                pass

    # --- figures -------------------------------------------------------------------------------------

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """Seconds and % per cause since start and over the recent window, goodput, work rates."""
        now = self._clock() if now is None else now
        with self._accounted():
            totals = self._provisional(now)
            steps = self._steps
            flops, samples = self._flops_total, self._samples_total
            flops_known, samples_known = self._flops_steps > 0, self._samples_steps > 0
            past = self._window_base(now)
            rejected = dict(self._rejected)
            last_error = self._last_error
            median = self._median
            default_flops, source = self._default_flops, self._default_flops_source
            if default_flops is None and self._program_flops is not None:
                default_flops, source = self._program_flops, PROGRAMS_SOURCE
            programs = [{"name": name, "flops": flops} for name, flops in self._step_programs.items()]
        wall = max(now - self._start, 0.0)
        since_start = _breakdown(totals, wall)
        since_start.update(flops=flops if flops_known else None, samples=samples if samples_known else None)
        recent = None
        if past is not None:
            then, past_totals, past_flops, past_samples = past
            span = now - then
            delta = {cause: totals.get(cause, 0.0) - past_totals.get(cause, 0.0) for cause in totals}
            recent = _breakdown(delta, span)
            recent.update(flops=flops - past_flops if flops_known else None,
                          samples=samples - past_samples if samples_known else None)
        return {
            "started_unix_s": self.start_unix_s,
            "steps": steps,
            "median_step_time_s": median,
            "idle_threshold_s": self._idle_threshold if math.isfinite(self._idle_threshold) else None,
            "step_flops": default_flops,
            "step_flops_source": source,
            "step_programs": programs[:MAX_PROGRAMS_SHOWN],
            "since_start": since_start,
            "recent": recent,
            "window_s": self.settings.window_s,
            "rejected": rejected,
            "last_error": last_error,
        }

    # --- inside the lock -------------------------------------------------------------------------------

    @contextmanager
    def _accounted(self) -> Iterator[None]:
        """The ledger's lock, the steps that ended since its last use accounted first (see end_step)."""
        with self._lock:
            self._settle()
            yield

    def _settle(self) -> None:
        """Account the steps that ended since the last use, in order (inside the lock)."""
        ended = self._ended
        while ended:
            self._end_step(ended.popleft())

    def _end_step(self, now: float) -> None:
        """The step that ended at `now`: the interval it closes is productive (startup before the first)."""
        if self._in_block:
            rest = self._close(now, PRODUCTIVE)
            self._recent.append(rest)
        elif self._steps == 0:
            self._close(now, STARTUP)  # bare step(): the first step's start is unknown
        else:
            rest = self._close(now, PRODUCTIVE)
            self._recent.append(rest)
        self._in_block = False
        self._steps += 1
        if self._interval_programs:
            self._take_programs()
        flops = self._pending_flops if self._pending_flops is not None else self._default_flops
        if flops is None:
            flops = self._program_flops
        if flops is not None:
            self._flops_total += flops
            self._flops_steps += 1
        if self._pending_samples is not None:
            self._samples_total += self._pending_samples
            self._samples_steps += 1
        self._pending_flops = self._pending_samples = None
        if self._steps % _MEDIAN_EVERY == 1 and self._recent:
            ordered = sorted(self._recent)
            self._median = ordered[len(ordered) // 2]
            self._idle_threshold = max(self.settings.idle_factor * self._median, self.settings.idle_min_s)
        if now >= self._next_history:
            self._record_history(now)

    def _close(self, now: float, cause: str) -> float:
        rest = max(0.0, (now - self._cursor) - self._claimed)
        if cause != STARTUP and rest > self._idle_threshold:
            cause = IDLE
        self._totals[cause] += rest
        self._cursor, self._claimed = now, 0.0
        return rest

    def _claim(self, cause: str, seconds: float, now: float) -> None:
        # Only time after the cursor can be claimed: what lies before it (a compile or phase that began in an
        # earlier interval) was given to that interval's cause when it closed. So the causes add up to the wall.
        seconds = min(seconds, max(0.0, (now - self._cursor) - self._claimed))
        self._totals[cause] = self._totals.get(cause, 0.0) + seconds
        self._claimed += seconds
        self._claimed_total += seconds

    def _take_programs(self) -> None:
        """The programs compiled during the step that just ended become (or replace, by name) the step's."""
        for name, flops in self._interval_programs.items():
            if name in self._step_programs or len(self._step_programs) < MAX_STEP_PROGRAMS:
                self._step_programs[name] = flops
        self._interval_programs = {}
        known = [flops for flops in self._step_programs.values() if flops is not None]
        self._program_flops = sum(known) if known else None

    def _open_cause(self) -> str:
        if self._steps == 0:
            return STARTUP
        if self._in_block or not self._uses_blocks:
            return PRODUCTIVE
        return HOST

    def _provisional(self, now: float) -> dict[str, float]:
        """The totals as if the interval under way closed now."""
        totals = dict(self._totals)
        rest = max(0.0, (now - self._cursor) - self._claimed)
        cause = self._open_cause()
        if cause != STARTUP and rest > self._idle_threshold:
            cause = IDLE
        totals[cause] = totals.get(cause, 0.0) + rest
        return totals

    def _record_history(self, now: float) -> None:
        self._history.append((now, self._provisional(now), self._flops_total, self._samples_total))
        self._next_history = now + _HISTORY_PERIOD_S
        horizon = now - self.settings.window_s - 2 * _HISTORY_PERIOD_S
        while len(self._history) > 2 and self._history[1][0] <= horizon:
            self._history.popleft()

    def _window_base(self, now: float) -> tuple[float, dict[str, float], float, float] | None:
        """The newest point of history at least a window old (else the oldest one); None without history."""
        base = None
        for point in self._history:
            if point[0] <= now - self.settings.window_s or base is None:
                base = point
            else:
                break
        return base if base is not None and now - base[0] > 0 else None

    def _phase_cause(self, given: Any) -> str:
        name = job_name(given)
        if (name is None or len(name) > MAX_PHASE_NAME or not _PHASE_NAME.match(name)
                or name in (PRODUCTIVE, STARTUP, COMPILE, HOST, IDLE)):
            self._reject("phase", f"phase name {quoted(given, 40)} is not a name of letters, digits, '_', '.', '-' "
                                  f"(at most {MAX_PHASE_NAME}, not a built-in cause); counted as {OTHER_PHASE!r}")
            return OTHER_PHASE
        if name in self._totals:
            return name
        if len(self._totals) - len(BUILTIN) - (OTHER_PHASE in self._totals) >= MAX_CUSTOM_PHASES:
            self._reject("phase", f"more than {MAX_CUSTOM_PHASES} phase names; {quoted(name, 40)} counted as "
                                  f"{OTHER_PHASE!r}")
            return OTHER_PHASE
        return name

    def _reject(self, what: str, message: str) -> None:
        self._rejected[what] = self._rejected.get(what, 0) + 1
        self._last_error = message



def _breakdown(totals: dict[str, float], wall: float) -> dict[str, Any]:
    causes = {cause: seconds for cause, seconds in totals.items() if seconds > 0 or cause in BUILTIN}
    return {
        "wall_s": wall,
        "goodput_percent": 100.0 * totals.get(PRODUCTIVE, 0.0) / wall if wall > 0 else None,
        "causes_s": causes,
        "causes_percent": {cause: 100.0 * seconds / wall for cause, seconds in causes.items()} if wall > 0 else {},
    }


def work_rates(breakdown: dict[str, Any], peak_flops_per_s: float | None,
               price_per_hour: float | None) -> dict[str, float | None]:
    """MFU, samples/s and cost per 1M samples of one span of `GoodputLedger.snapshot()`; None when unknown."""
    wall = breakdown.get("wall_s") or 0.0
    flops, samples = breakdown.get("flops"), breakdown.get("samples")
    flops_per_s = flops / wall if flops is not None and wall > 0 else None
    samples_per_s = samples / wall if samples is not None and wall > 0 else None
    mfu = (100.0 * flops_per_s / peak_flops_per_s
           if flops_per_s is not None and peak_flops_per_s else None)
    cost = (price_per_hour / 3600.0 / samples_per_s * 1e6
            if price_per_hour is not None and samples_per_s else None)
    return {"flops_per_s": flops_per_s, "mfu_percent": mfu, "samples_per_s": samples_per_s,
            "cost_per_million_samples": cost}
