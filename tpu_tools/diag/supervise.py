"""Run the diagnostics in an isolated child and read its events with a deadline.

As tpu-ls does with its runtime queries, the runtime lives in a child process of its own session: a
device that hangs (or a plugin that crashes) ends that child, not this process, and the test it was in
gets a verdict: failed, hung or crashed, naming the test and the device. Every event resets the
deadline, so --timeout bounds one test, not the whole run. The report is filled in place: whatever has
arrived is kept when the run is interrupted.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tpu_tools
from tpu_tools.diag.records import FAIL, Check, Coverage, DiagReport
from tpu_tools.diag.settings import DiagSettings
from tpu_tools.errors import PlatformUnavailable, RuntimeFailure, UsageError
from tpu_tools.pjrt.isolate import kill_group
from tpu_tools.pjrt.runtime import RuntimePolicy, check_platform_installed, explain_backend_error, unknown_xla_flag

_BOOT = "from tpu_tools.diag.worker import main; main()"
_PACKAGE_ROOT = str(Path(tpu_tools.__file__).resolve().parent.parent)

Listener = Callable[[dict[str, Any]], None]


def apply_event(report: DiagReport, event: dict[str, Any]) -> None:
    """Record one event of the worker (or of a process of a multi-process run) in the report."""
    kind = event.get("event")
    if kind == "plan":
        report.platform, report.device_kind = event.get("platform"), event.get("device_kind")
        report.device_ids = list(event.get("device_ids") or [])
        report.process_count = int(event.get("process_count") or 1)
        report.runtime = dict(event.get("runtime") or {})
    elif kind == "check":
        report.checks.append(Check.from_dict(event["check"]))
    elif kind == "coverage":
        report.coverage = Coverage.from_dict(event["coverage"])
    elif kind == "note":
        report.notes.append(str(event.get("text")))


class Supervisor:
    def __init__(self, settings: DiagSettings, policy: RuntimePolicy, timeout_s: float,
                 listener: Listener | None = None):
        self.settings = settings
        self.policy = policy
        self.timeout_s = timeout_s
        self.listener = listener or (lambda event: None)
        self.current: tuple[str, int | None] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def run(self, report: DiagReport) -> None:
        """Fill `report` from the child's events; raises UsageError for bad input the child found
        (an --inject device that does not exist), PlatformUnavailable when the runtime cannot start."""
        check_platform_installed(self.policy)
        env = self.policy.environment()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        read_fd, write_fd = os.pipe()
        stderr_file = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(write_fd), json.dumps(self.settings.to_dict())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr_file, env=env,
                pass_fds=(write_fd,), start_new_session=True)
        except BaseException:
            os.close(read_fd)
            stderr_file.close()
            raise
        finally:
            os.close(write_fd)
        try:
            finished = self._read(read_fd, report)
            if not finished:
                self._crashed(report, stderr_file)
        finally:
            os.close(read_fd)
            self.kill()
            stderr_file.close()

    def _read(self, fd: int, report: DiagReport) -> bool:
        """Events until done (True), the pipe closes (False), or the deadline passes (a verdict)."""
        pending = b""
        deadline = time.monotonic() + self.timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._hung(report)
                    return True
                if not selector.select(remaining):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return False
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    deadline = time.monotonic() + self.timeout_s
                    if self._handle(event, report):
                        return True

    def _handle(self, event: dict[str, Any], report: DiagReport) -> bool:
        kind = event.get("event")
        if kind == "begin":
            self.current = (str(event.get("test")), event.get("device"))
        elif kind == "error":
            self._error(event, report)
            return True
        apply_event(report, event)
        self.listener(event)
        return kind == "done"

    def _error(self, event: dict[str, Any], report: DiagReport) -> None:
        message = str(event.get("message") or "")
        if event.get("kind") == "usage":
            raise UsageError(message)
        if "Unable to initialize backend" in message:
            raise PlatformUnavailable(explain_backend_error(self._platform(), message))
        last = message.strip().splitlines()[-1][:300] if message.strip() else ""
        report.error = f"the diagnostics failed: {event.get('error_type')}: {last}"
        if self.current is not None:
            test, device = self.current
            report.checks.append(Check(test, FAIL, report.error, device=device))

    def _where(self) -> str:
        if self.current is None:
            return "while the runtime started"
        test, device = self.current
        return f"in {test}" + (f" on device {device}" if device is not None else "")

    def _hung(self, report: DiagReport) -> None:
        self.kill()
        report.error = (f"the {self._platform()} runtime did not answer within {self.timeout_s:g} s {self._where()} "
                        "(a hung device; raise --timeout if it is only slow)")
        if self.current is not None:
            test, device = self.current
            report.checks.append(Check(test, FAIL, f"hung: no answer within {self.timeout_s:g} s", device=device))

    def _crashed(self, report: DiagReport, stderr_file: Any) -> None:
        assert self.process is not None
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        stderr_file.seek(0)
        text = stderr_file.read().decode("utf-8", "replace")
        flag_problem = unknown_xla_flag(text)
        if flag_problem:
            raise UsageError(flag_problem)
        code = self.process.returncode
        how = (f"crashed with {_signal_name(-code)}" if code is not None and code < 0
               else f"exited with status {code}")
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        report.error = f"the {self._platform()} runtime {how} {self._where()}" + (f": {lines[-1][:300]}" if lines
                                                                                 else "")
        if self.current is not None:
            test, device = self.current
            report.checks.append(Check(test, FAIL, f"the runtime {how}", device=device))
        if self.current is None and code == 0:
            raise RuntimeFailure(report.error)

    def _platform(self) -> str:
        shown = self.policy.display_platform()
        return "PJRT" if shown == "auto" else shown

    def kill(self) -> None:
        if self.process is not None:
            kill_group(self.process)


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"
