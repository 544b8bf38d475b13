"""`program`: a user's own program run under the agent for a bounded time, reported with the agent's figures.

The program runs as `python -m tpu_tools.agent --tag TAG PROGRAM ARGS...` (the runtime policy's environment:
--platform, --host-devices) before this process opens the device, its output in a log file. Its steps are what
it marks (`tpu_tools.agent.step()` or `step_context()`). Every `sample_interval_s` the agent is asked for its
figures over its socket: each answer with steps gives one sample of its steps/s (the agent's rate over its last
10 s) and of its median step time; the second half of them (the first is the warm-up, while the rate window
still holds the compiles) make the case's figures and spread. At `duration_s` (or when the program ends by itself)
the last answer gives the reported figures, the agent's own: steps, steps/s, step time p50 and p99, MFU and
goodput since the start, compile count and time. Then the program is asked to stop with SIGINT (its atexit
handlers and the agent's job summary run), SIGTERM after `STOP_GRACE_S`, SIGKILL after as long again.
A program that exits with a failure before the duration is a failed case with the last line of its output, and
so is one whose agent has not answered within the run's --timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tools.bench.interrupts import raise_kept_interrupt
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.stats import summarize
from tpu_tools.errors import RuntimeFailure
from tpu_tools.metrics.agent_client import AgentQueryError, query_snapshot
from tpu_tools.metrics.records.agent import AgentSnapshot, Compiles, GoodputSpan, Steps
from tpu_tools.pjrt.runtime import RuntimePolicy
from tpu_tools.shorten import one_line

STOP_GRACE_S = 10.0
ASK_TIMEOUT_S = 2.0
LOG_TAIL_BYTES = 4096


@dataclass(frozen=True)
class ProgramOptions:
    command: tuple[str, ...] = ()  # script.py ARGS, or -m module ARGS
    duration_s: float = 30.0
    sample_interval_s: float = 1.0


def program_name(command: tuple[str, ...]) -> str:
    """The script or module, which names the case (its arguments are in the params, not the id)."""
    if command[:1] == ("-m",) and len(command) > 1:
        return command[1]
    return command[0] if command else "?"


def plan(options: ProgramOptions) -> list[Case]:
    return [Case("program", program_name(options.command),
                 {"command": list(options.command), "duration_s": options.duration_s,
                  "sample_interval_s": options.sample_interval_s})]


@dataclass
class Reading:
    """One answer of the agent: its snapshot, and when it came (seconds since the program started)."""

    at_s: float
    snapshot: AgentSnapshot

    @property
    def steps(self) -> Steps:
        return self.snapshot.steps or Steps()


def run_out_of_process(case: Case, policy: RuntimePolicy, timeout_s: float) -> CaseResult:
    duration_s, interval_s = float(case.params["duration_s"]), float(case.params["sample_interval_s"])
    command = [sys.executable, "-m", "tpu_tools.agent", "--tag", f"tpu-bench-program-{os.getpid()}",
               *case.params["command"]]
    with tempfile.TemporaryDirectory(prefix="tpu-bench-program-") as folder:
        log_path = Path(folder) / "output.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, env=policy.environment(), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        started = time.monotonic()
        readings: list[Reading] = []
        silent = False  # the agent never answered within --timeout
        try:
            while process.poll() is None and time.monotonic() - started < duration_s:
                raise_kept_interrupt()
                remaining = duration_s - (time.monotonic() - started)
                try:
                    process.wait(timeout=max(0.01, min(interval_s, remaining)))
                    break
                except subprocess.TimeoutExpired:
                    pass
                reading = _ask(process.pid, started)
                if reading is not None:
                    readings.append(reading)
                elif not readings and time.monotonic() - started > timeout_s:
                    silent = True
                    break
            ended_itself = process.poll() is not None
            if not ended_itself:
                last = _ask(process.pid, started)
                if last is not None:
                    readings.append(last)
        finally:
            _stop(process)
        wall_s = time.monotonic() - started
        tail = _tail(log_path)
    if silent:
        raise RuntimeFailure(f"the program's agent did not answer within --timeout {timeout_s:g} s; the program "
                             "was stopped" + (f" (its last output: {tail})" if tail else ""))
    if ended_itself and process.returncode != 0:
        raise RuntimeFailure(f"the program exited with status {process.returncode} after {wall_s:.1f} s"
                             + (f": {tail}" if tail else ""))
    return _result(case, readings, wall_s, ended_itself, process.returncode)


def _ask(pid: int, started: float) -> Reading | None:
    try:
        snapshot = query_snapshot(pid, ASK_TIMEOUT_S)
    except (AgentQueryError, OSError, ValueError):  # not started yet, or gone: the loop goes on
        return None
    return Reading(time.monotonic() - started, snapshot)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (the program's own exit, atexit included), then SIGTERM, then SIGKILL; its whole session."""
    for sign in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sign)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    """The last line of the program's output, made one printable line."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return one_line(lines[-1], 240) if lines else ""


def _result(case: Case, readings: list[Reading], wall_s: float, ended_itself: bool, exit_code: int | None,
            ) -> CaseResult:
    stepping = [r for r in readings if (r.steps.count or 0) >= 2 and r.steps.steps_per_second]
    if not stepping:
        why = "it ended" if ended_itself else f"{case.params['duration_s']:g} s"
        raise RuntimeFailure(f"the program marked fewer than 2 steps the agent could time before {why} "
                             "(mark each step with tpu_tools.agent.step() or step_context(), and give it a "
                             "longer --duration)")
    last = stepping[-1]
    steps = last.steps
    # The first half of the readings is the warm-up: the agent's rate window still holds the first steps, which
    # carry the compiles and the program's start.
    steady = stepping[len(stepping) // 2:] if len(stepping) >= 6 else stepping
    result = CaseResult(case, primary="steps_per_s")
    result.stats["steps_per_s"] = summarize([r.steps.steps_per_second or 0.0 for r in steady], higher_is_better=True)
    medians = [r.steps.p50_step_time_s * 1e3 for r in steady if r.steps.p50_step_time_s is not None]
    if medians:
        result.stats["step_time_ms"] = summarize(medians)
    since_start = (last.snapshot.goodput.since_start if last.snapshot.goodput else None) or GoodputSpan()
    compiles = last.snapshot.compiles or Compiles()
    result.values.update({
        "timing": "agent",
        "steps": steps.count,
        "agent_steps_per_s": steps.steps_per_second,
        "step_time_p50_ms": _ms(steps.p50_step_time_s),
        "step_time_p99_ms": _ms(steps.p99_step_time_s),
        "mfu_percent": since_start.mfu_percent,
        "goodput_percent": since_start.goodput_percent,
        "compile_count": compiles.compile_count,
        "recompile_count": compiles.recompile_count,
        "compile_time_s": compiles.compile_time_s,
        "run_s": wall_s,
        "ended": "by itself" if ended_itself else "stopped at the duration",
        "exit_code": exit_code if ended_itself else None,
        "agent_reads": len(readings),
        "warmup_reads": len(stepping) - len(steady),
    })
    if len(steady) < 3:
        result.warn(f"only {len(steady)} reading(s) of the agent with steps: the spread is not known and a "
                    "baseline comparison does not gate it (give a longer --duration)")
    return result


def _ms(seconds: Any) -> float | None:
    return seconds * 1e3 if isinstance(seconds, (int, float)) else None
