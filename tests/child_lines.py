"""Which lines of tpu-tools a program the tests start runs: a line recorder far cheaper to start than coverage.

The suite starts some 1,300 Python programs. Under coverage's own start-up in each (`import coverage` pulls in
its reporters, `inspect`, `multiprocessing` and `sqlite3`; at exit it looks for the files never run), a program
paid 110-370 ms of CPU more, a fifth of the suite's CPU. This module records the same thing through the same
interface coverage's `sysmon` core uses on Python 3.12+ (`sys.monitoring`: a PY_START event per code object, LINE
events only in tpu-tools' own code, each location reported once) and costs 10-22 ms
(benchmarks/child_coverage_cost.py). At exit it writes the lines as JSON; the test session turns those files
into coverage data before coverage combines and reports (tests/child_coverage.py), so the report, the floor
and `coverage` itself are unchanged.

It is installed into the test environment's site-packages with a `.pth` file, and starts only in a process
whose environment names the directory to write into (RECORD_VARIABLE). Like coverage's own start-up it never
raises into the program: a recorder that cannot start or write leaves the program as it was.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
from types import CodeType, FrameType
from typing import Any, NoReturn

RECORD_VARIABLE = "TPU_TOOLS_TEST_LINES"  # "DIRECTORY<pathsep>SOURCE": where to write, what to record
_lines: set[tuple[str, int]] = set()
_started = False


def start() -> None:
    """Record from now on, if the environment asks; called by the `.pth` file at interpreter start (where a
    virtual environment's site-packages is seen twice, through `lib` and `lib64`, twice: the first call wins)."""
    global _started
    setting = os.environ.get(RECORD_VARIABLE, "")
    directory, _, source = setting.partition(os.pathsep)
    monitoring = getattr(sys, "monitoring", None)
    if _started or not directory or not source or monitoring is None:
        return
    _started = True
    tool = next((tool for tool in (monitoring.COVERAGE_ID, 3, 4) if monitoring.get_tool(tool) is None), None)
    if tool is None:
        return
    monitoring.use_tool_id(tool, "tpu-tools test lines")
    prefix = source.rstrip(os.sep) + os.sep
    line_event = monitoring.events.LINE
    disable = monitoring.DISABLE

    def on_start(code: CodeType, offset: int) -> Any:
        if code.co_filename.startswith(prefix):
            monitoring.set_local_events(tool, code, line_event)
        return disable

    def on_line(code: CodeType, line: int) -> Any:
        _lines.add((code.co_filename, line))
        return disable

    monitoring.register_callback(tool, monitoring.events.PY_START, on_start)
    monitoring.register_callback(tool, line_event, on_line)
    monitoring.set_events(tool, monitoring.events.PY_START)
    atexit.register(save, directory)
    _save_before_os_exit(directory)
    _save_on_fatal_signals(directory)


def save(directory: str) -> None:
    """Write the lines recorded so far into a file of their own in DIRECTORY (atomically: complete or absent)."""
    try:
        by_file: dict[str, list[int]] = {}
        for filename, line in list(_lines):
            by_file.setdefault(filename, []).append(line)
        if not by_file:
            return
        # One file per save: a forked child saves what it inherited as well, which a union of the files absorbs.
        name = os.path.join(directory, f"lines.{os.getpid()}.{os.urandom(4).hex()}.json")
        text = json.dumps({os.path.realpath(filename): lines for filename, lines in by_file.items()})
        with open(name + ".partial", "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(name + ".partial", name)
    except Exception:  # noqa: BLE001  (the program under test must not notice the recorder)
        pass


def _save_before_os_exit(directory: str) -> None:
    """os._exit skips atexit handlers (a forked child exits so): save first, as coverage's `_exit` patch does."""
    exit_now = os._exit

    def save_then_exit(status: int) -> NoReturn:
        save(directory)
        exit_now(status)

    os._exit = save_then_exit


def _save_on_fatal_signals(directory: str) -> None:
    """A program killed by SIGTERM (coverage's `sigterm` option) or hung up by its terminal (a tmux server that a
    test ends) with no handler of its own saves, then dies of the signal as it would have."""

    def save_then_die(signum: int, frame: FrameType | None) -> None:
        save(directory)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, save_then_die)
