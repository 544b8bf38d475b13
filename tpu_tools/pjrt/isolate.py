"""Run a PJRT query in a fresh child process, with a time limit.

A runtime can hang (a stuck driver, a TPU held elsewhere) or crash (a plugin
that segfaults). Read-only commands must survive both, so they never import
jax themselves: they start `tpu_tools.pjrt.child` in a new session, give it
the query, read its JSON answer from a dedicated pipe (the runtime and plugins
may write to stdout), and kill the whole process group when time is up.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import tpu_tools
from tpu_tools.errors import PlatformUnavailable, RuntimeCrash, RuntimeFailure, RuntimeHang, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy, check_platform_installed, explain_backend_error, unknown_xla_flag

DEFAULT_TIMEOUT_S = 30.0
_CHILD_BOOT = "from tpu_tools.pjrt.child import main; main()"
_PACKAGE_ROOT = str(Path(tpu_tools.__file__).resolve().parent.parent)


@dataclass
class IsolatedCall:
    """A query started in a child process; `result()` waits for its answer."""

    target: str
    policy: RuntimePolicy
    timeout_s: float
    process: subprocess.Popen[bytes]
    result_fd: int
    stderr_file: Any
    started: float

    def result(self) -> Any:
        try:
            payload = self._read_answer()
        except BaseException:
            self.kill()
            raise
        finally:
            os.close(self.result_fd)
        stderr_text = self._stderr_text()
        if payload is None:
            self._raise_for_exit(stderr_text)
        answer = json.loads(payload)
        if answer.get("ok"):
            return answer["value"]
        raise self._error_from_answer(answer, stderr_text)

    def _read_answer(self) -> bytes | None:
        deadline = self.started + self.timeout_s
        chunks: list[bytes] = []
        with selectors.DefaultSelector() as selector:
            selector.register(self.result_fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise RuntimeHang(
                        f"the {self._platform_name()} runtime did not answer within {self.timeout_s:g} s "
                        "(raise --timeout, or check that the device is not stuck or held)"
                    )
                if not selector.select(remaining):
                    continue
                chunk = os.read(self.result_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        # The child closes the pipe when it exits; reap it without waiting long.
        try:
            self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
        return b"".join(chunks) or None

    def _platform_name(self) -> str:
        shown = self.policy.display_platform()
        return "PJRT" if shown == "auto" else shown

    def _stderr_text(self) -> str:
        self.stderr_file.seek(0)
        text: str = self.stderr_file.read().decode("utf-8", "replace")
        self.stderr_file.close()
        return text

    def _raise_for_exit(self, stderr_text: str) -> NoReturn:
        code = self.process.returncode
        flag_problem = unknown_xla_flag(stderr_text)
        if flag_problem:
            raise UsageError(flag_problem)
        last = _last_line(stderr_text)
        if code is not None and code < 0:
            name = _signal_name(-code)
            raise RuntimeCrash(f"the {self._platform_name()} runtime crashed with {name}"
                               + (f": {last}" if last else ""))
        raise RuntimeCrash(f"the {self._platform_name()} runtime exited with status {code} before answering"
                           + (f": {last}" if last else ""))

    def _error_from_answer(self, answer: dict[str, Any], stderr_text: str) -> Exception:
        message = answer.get("message", "")
        if answer.get("error_type") == "RuntimeError" and "Unable to initialize backend" in message:
            error: RuntimeFailure = PlatformUnavailable(explain_backend_error(self._platform_name(), message))
        else:
            error = RuntimeFailure(f"the {self._platform_name()} runtime query failed: "
                                   f"{answer.get('error_type')}: {_last_line(message)}")
        error.child_traceback = answer.get("traceback", "")  # type: ignore[attr-defined]
        error.child_stderr = stderr_text  # type: ignore[attr-defined]
        return error

    def kill(self) -> None:
        """Kill the child and everything it started; never leaves a process behind."""
        kill_group(self.process)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a child started in its own session, and everything it started, then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def start_isolated(target: str, params: dict[str, Any] | None, policy: RuntimePolicy,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> IsolatedCall:
    """Start `module:function(**params)` in a child under `policy`; returns at once.

    The caller can do other work (passive discovery, rendering set-up) while the
    runtime starts, then call `.result()`.
    """
    check_platform_installed(policy)
    env = policy.environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    read_fd, write_fd = os.pipe()
    request = json.dumps({"target": target, "params": params or {}})
    stderr_file = tempfile.TemporaryFile()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD_BOOT, str(write_fd), request],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
            env=env,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        stderr_file.close()
        raise
    finally:
        os.close(write_fd)
    return IsolatedCall(target, policy, timeout_s, process, read_fd, stderr_file, time.monotonic())


def run_isolated(target: str, params: dict[str, Any] | None, policy: RuntimePolicy,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """`module:function(**params)` run in an isolated child under `policy`; returns the function's JSON value.

    Raises PlatformUnavailable when the platform's plugin is not installed or its backend cannot start,
    RuntimeHang when the child does not answer within `timeout_s` (it is killed), RuntimeCrash when it
    dies before answering, and RuntimeFailure for another exception raised in the child.
    """
    return start_isolated(target, params, policy, timeout_s).result()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"
