"""The isolated diagnostic process: runs the levels and streams every event as a JSON line on a pipe.

argv: the pipe's file descriptor and the settings as JSON. Events: plan, begin, check, tick, note,
coverage, then done, or error {kind: usage | runtime, message}. The supervisor (`supervise`) reads them
with a deadline, so a device that hangs in a test still gets a verdict.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from tpu_tools.diag.records import Check
from tpu_tools.diag.settings import DiagSettings
from tpu_tools.errors import UsageError


class PipeSink:
    def __init__(self, fd: int):
        self.fd = fd

    def send(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event, default=str) + "\n").encode()
        while data:
            written = os.write(self.fd, data)
            data = data[written:]

    def plan(self, info: dict[str, Any]) -> None:
        self.send({"event": "plan", **info})

    def begin(self, test: str, device: int | None) -> None:
        self.send({"event": "begin", "test": test, "device": device})

    def check(self, check: Check) -> None:
        self.send({"event": "check", "check": check.to_dict()})

    def tick(self, text: str) -> None:
        self.send({"event": "tick", "text": text})

    def note(self, text: str) -> None:
        self.send({"event": "note", "text": text})


def main() -> None:
    from tpu_tools.pjrt.child import die_with_parent

    fd = int(sys.argv[1])
    settings = DiagSettings.from_dict(json.loads(sys.argv[2]))
    die_with_parent()
    sink = PipeSink(fd)
    try:
        import jax

        from tpu_tools.diag.runner import DiagRunner

        runner = DiagRunner(jax, settings, sink)
        runner.run()
        sink.send({"event": "coverage", "coverage": runner.coverage.to_dict()})
        sink.send({"event": "done"})
    except UsageError as error:
        sink.send({"event": "error", "kind": "usage", "message": str(error)})
    except BaseException as error:  # noqa: BLE001 every failure becomes an event; the supervisor decides what it means
        sink.send({"event": "error", "kind": "runtime", "error_type": type(error).__name__,
                   "message": str(error), "traceback": traceback.format_exc()})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip teardown: some runtimes hang while shutting down
