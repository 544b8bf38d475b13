"""`--launch N`: N local processes joined by jax.distributed on 127.0.0.1, supervised.

Each process is the same command line a user would type on N hosts (with
--coordinator, --num-processes and --process-id added), running on its own
CPU devices with collectives over gloo: the real multi-controller path, on one
machine. Process 0 prints; the others stay quiet. The launcher reads every
process's stderr, passes process 0's notes through, and when something fails
it composes one sentence: which process died and how, and what the surviving
processes found. A process that outlives the first failure by more than
--timeout (plus a grace) is stopped, so the launcher never hangs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tpu_tools
from tpu_tools.errors import EXIT_FAILURE, UsageError

LAUNCHER_ENV = "TPU_TOOLS_LAUNCHER_PID"
MAX_PROCESSES = 64
GRACE_S = 2.0
INTERRUPT_GRACE_S = 10.0  # for process 0 to report what it has after Ctrl-C or SIGTERM
_ERROR_LINE = re.compile(r"^\S*: error: (?P<message>.*)$")
_PACKAGE_ROOT = str(Path(tpu_tools.__file__).resolve().parent.parent)


def devices_per_process(total: int, processes: int) -> int:
    """CPU devices per launched process, so that the run keeps about `total` devices."""
    return max(1, total // processes)


def strip_option(args: list[str], name: str) -> list[str]:
    """The arguments without `name VALUE` / `name=VALUE`."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            kept.append(arg)
    return kept


def rank_command(args: list[str], coordinator: str, processes: int, process_id: int,
                 module: str = "tpu_tools.cli.collectives") -> list[str]:
    return [sys.executable, "-m", module, *args, "--coordinator", coordinator,
            "--num-processes", str(processes), "--process-id", str(process_id)]


@dataclass
class RankOutcome:
    process_id: int
    pid: int
    returncode: int | None = None
    error: str | None = None  # the sentence of its error line
    tail: deque = field(default_factory=lambda: deque(maxlen=40))
    stopped_by_launcher: bool = False

    @property
    def ended_by_jax(self) -> bool:
        """Aborted by JAX's coordination client (it ends the process when the service fails)."""
        return self.returncode == -signal.SIGABRT and any("JAX distributed service" in line for line in self.tail)

    def describe_death(self) -> str | None:
        """How it ended, when that is news of its own (a signal, or a silent failure)."""
        who = f"process {self.process_id} (pid {self.pid})"
        if self.stopped_by_launcher:
            return f"{who} did not stop after the first failure and was killed"
        code = self.returncode
        if code is None or code == 0:
            return None
        if code < 0:
            number = -code
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
            if self.ended_by_jax:
                return f"{who} was ended by the JAX runtime when its coordination service failed"
            return f"{who} was killed by {name}"
        return None if self.error else f"{who} exited with status {code}"


@dataclass
class LaunchOutcome:
    exit_code: int
    message: str | None
    ranks: list[RankOutcome]


class Launcher:
    def __init__(self, processes: int, args: list[str], coordinator: str, timeout_s: float,
                 on_stderr: Callable[[str], None], debug: bool = False, module: str = "tpu_tools.cli.collectives",
                 forward_interrupt: bool = False):
        if processes < 1:
            raise UsageError(f"--launch must be at least 1, got {processes}")
        if processes > MAX_PROCESSES:
            raise UsageError(f"--launch {processes} is more than {MAX_PROCESSES} local processes")
        self.processes = processes
        self.args = args
        self.coordinator = coordinator
        self.timeout_s = timeout_s
        self.on_stderr = on_stderr
        self.debug = debug
        self.module = module  # the command each process runs (python -m MODULE ARGS)
        self.forward_interrupt = forward_interrupt  # Ctrl-C/SIGTERM reach the processes, which report what they have
        self.children: list[subprocess.Popen] = []
        self.ranks: list[RankOutcome] = []
        self._readers: list[threading.Thread] = []

    def run(self) -> LaunchOutcome:
        try:
            self._start()
            self._supervise()
        except KeyboardInterrupt:
            if self.forward_interrupt:
                self._interrupt_all()
            raise
        finally:
            self._kill_all()
        for reader in self._readers:
            reader.join(timeout=5)
        return self._outcome()

    def _start(self) -> None:
        env = dict(os.environ)
        env[LAUNCHER_ENV] = str(os.getpid())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        from tpu_tools import signals

        for process_id in range(self.processes):
            command = rank_command(self.args, self.coordinator, self.processes, process_id, self.module)
            # Held until the process is recorded: a signal that raised inside Popen, after the process began,
            # would leave it running unrecorded, neither passed the signal nor killed.
            with signals.deferred() as held:
                child = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                         stdout=None if process_id == 0 else subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, env=env, start_new_session=True)
                self.children.append(child)
                rank = RankOutcome(process_id, child.pid)
                self.ranks.append(rank)
                reader = threading.Thread(target=self._read, args=(child, rank), daemon=True)
                reader.start()
                self._readers.append(reader)
            if held.held is not None:
                signal.raise_signal(held.held)

    def _read(self, child: subprocess.Popen, rank: RankOutcome) -> None:
        assert child.stderr is not None
        for raw in child.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            rank.tail.append(line)
            match = _ERROR_LINE.match(line)
            if match:
                rank.error = match.group("message")
            elif self.debug:
                self.on_stderr(f"[process {rank.process_id}] {line}")
            elif rank.process_id == 0 and line.startswith(("note: ", "warning: ")):
                self.on_stderr(line)

    def _supervise(self) -> None:
        """Wait for every process; after a failure, stop the ones that outlive their own time limit."""
        deadline: float | None = None
        reported = False
        while True:
            codes = [child.poll() for child in self.children]
            if all(code is not None for code in codes):
                return
            now = time.monotonic()
            failed = any(code not in (None, 0) for code in codes)
            if failed and deadline is None:
                deadline = now + self.timeout_s + GRACE_S  # the survivors' watchdogs speak before this
            if failed and codes[0] is not None and not reported:
                reported = True  # process 0 has said what happened: the rest have a grace to follow
                deadline = min(deadline or now, now + GRACE_S)
            if deadline is not None and now > deadline:
                for child, rank, code in zip(self.children, self.ranks, codes):
                    if code is None:
                        rank.stopped_by_launcher = True
                        _kill(child)
            time.sleep(0.05)

    def _interrupt_all(self) -> None:
        """Pass the signal on and give process 0 a grace to print and keep its partial results."""
        from tpu_tools import signals

        number = signals.received() or signal.SIGINT
        for child in self.children:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, number)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while self.children and self.children[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def _kill_all(self) -> None:
        for child in self.children:
            if child.poll() is None:
                _kill(child)
        for child, rank in zip(self.children, self.ranks):
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            rank.returncode = child.returncode

    def _outcome(self) -> LaunchOutcome:
        failures = [r for r in self.ranks if r.returncode != 0]
        if not failures:
            return LaunchOutcome(0, None, self.ranks)
        first = self.ranks[0]
        # Once process 0 has explained the failure, the processes that ended after it (stopped by
        # the launcher, or by the JAX runtime when process 0's coordinator went away) are its echo.
        deaths = [d for d in (r.describe_death() for r in failures
                              if not (first.error and (r.stopped_by_launcher or r.ended_by_jax))) if d]
        if first.error:
            primary: str | None = first.error
        else:
            speaker = next((r for r in failures if r.error), None)
            primary = f"process {speaker.process_id}: {speaker.error}" if speaker else None
        message = "; ".join(deaths + ([primary] if primary else []))
        code = first.returncode if first.error and first.returncode and first.returncode > 0 else EXIT_FAILURE
        return LaunchOutcome(code, message or "a launched process failed", self.ranks)


def _kill(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def adopt_launcher() -> None:
    """In a launched process: die with the launcher, so no rank outlives it."""
    if os.environ.get(LAUNCHER_ENV) == str(os.getppid()):
        from tpu_tools.pjrt.child import die_with_parent

        die_with_parent()
