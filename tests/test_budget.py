"""The per-test time budget (tests/budget.py), run on a small suite of its own: a report at the end of the run,
never a failure; pytest-timeout is the hang guard."""

from __future__ import annotations

from conftest import TESTS

pytest_plugins = ["pytester"]

INNER_CONFTEST = f"""
import sys

import pytest

sys.path.insert(0, {str(TESTS)!r})
import budget


def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds): the test's time budget")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    budget.check(item, call, outcome.get_result())


def pytest_runtest_logreport(report):
    budget.collect(report)


def pytest_terminal_summary(terminalreporter):
    budget.summary(terminalreporter.write_line)
"""

INNER_TESTS = """
import time

import pytest


@pytest.mark.budget(0.001)
def test_slow():
    time.sleep(0.2)


@pytest.mark.budget(60)
def test_declared():
    time.sleep(0.01)


def test_quick():
    pass


@pytest.mark.budget(0.001)
def test_failing_on_its_own():
    time.sleep(0.2)
    assert False, "its own failure"
"""


def _run(pytester, *args: str):
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)


def test_an_overrun_is_reported_at_the_end_and_decides_no_outcome(pytester):
    result = _run(pytester)
    result.assert_outcomes(passed=3, failed=1)  # test_slow passed, over its budget; the failure is its own
    result.stdout.fnmatch_lines(["*2 tests took longer than their time budget (a report, not a failure*",
                                 "*test_inner.py::test_*: * s, budget 0.001 s (load * on * cores)",
                                 "*test_inner.py::test_*: * s, budget 0.001 s (load * on * cores)"])
    assert "its own failure" in result.stdout.str()
    assert "test_declared" not in result.stdout.str().split("time budget")[1]


def test_the_report_comes_back_from_xdist_workers(pytester):
    result = _run(pytester, "-n", "2")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*2 tests took longer than their time budget*"])


def test_a_hang_is_ended_by_the_timeout(pytester):
    pytester.makepyfile(test_hang="import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "--timeout", "1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Timeout (>1.0s) from pytest-timeout*"])
