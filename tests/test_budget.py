"""The per-test time budget (tests/budget.py), run on a small suite of its own."""

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
"""

INNER_TESTS = """
import time

import pytest


@pytest.mark.budget(0.001)
def test_slow():
    time.sleep(1.0)  # a thousand times its budget: no load average stretches it that far


@pytest.mark.budget(60)
def test_declared():
    time.sleep(0.01)


def test_quick():
    pass


@pytest.mark.budget(0.001)
def test_failing_on_its_own():
    time.sleep(1.0)
    assert False, "its own failure"
"""


def test_a_test_over_its_budget_fails_saying_so_and_others_pass(pytester, monkeypatch):
    monkeypatch.delenv("TPU_TOOLS_TEST_BUDGET_SCALE", raising=False)
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*test_slow passed but took * s, over its budget of 0.001 s (x* allowed now: "
                                 "load * on * cores)*@pytest.mark.budget(SECONDS)*"])
    assert "its own failure" in result.stdout.str()  # a test's own failure is reported as it was


def test_the_scale_variable_turns_the_check_off(pytester, monkeypatch):
    monkeypatch.setenv("TPU_TOOLS_TEST_BUDGET_SCALE", "0")
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider").assert_outcomes(passed=3, failed=1)
