"""Calls run ahead on daemon threads: results and errors come back, calls run side by side, and a call that never
returns does not hold the program's exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from tpu_tools.background import DaemonExecutor


def test_results_and_errors_come_back_to_the_caller():
    executor = DaemonExecutor(2, "test-background")
    assert executor.submit(lambda a, b: a + b, 2, b=3).result(timeout=30) == 5
    failing = executor.submit(int, "not a number")
    with pytest.raises(ValueError, match="not a number"):
        failing.result(timeout=30)
    assert list(executor.map(str, range(5), timeout=30)) == ["0", "1", "2", "3", "4"]


def test_calls_run_side_by_side_up_to_the_limit():
    executor = DaemonExecutor(3, "test-background")
    meeting = threading.Barrier(3, timeout=30)  # broken (an error) unless three calls wait at once
    futures = [executor.submit(meeting.wait) for _ in range(3)]
    assert sorted(f.result(timeout=60) for f in futures) == [0, 1, 2]
    names = {executor.submit(lambda: threading.current_thread().name).result(timeout=30) for _ in range(20)}
    assert names <= {"test-background-1", "test-background-2", "test-background-3"}  # kept, not started again


PROGRAM = textwrap.dedent("""
    import os, sys, threading
    from tpu_tools.background import DaemonExecutor
    executor = DaemonExecutor(2, "hung")
    executor.submit(threading.Event().wait)  # never returns
    assert executor.submit(os.getpid).result(timeout=30) == os.getpid()
    child = os.fork()
    if child == 0:  # the forked child has no thread of the parent's: its call starts one
        print("child", executor.submit(os.getpid).result(timeout=30) == os.getpid(), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
    executor.shutdown()
    print("parent done", flush=True)
""")


def test_a_call_that_never_returns_does_not_hold_the_exit_and_a_forked_child_gets_threads_of_its_own():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child True", "parent done"]
