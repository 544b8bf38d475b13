"""A visible time budget per test, reported, never failed: the tests whose body took more than their budget
are listed in a summary at the end of the run, saying by how much.

A test that honestly needs longer than 10 s (a real multi-process run, a real Prometheus filling its window)
says so with `@pytest.mark.budget(SECONDS)`, next to a reason. The budget shows a test growing slow; it is not
a verdict, since a loaded machine stretches every test alike: wall time decides no test's outcome. A hang is
caught by pytest-timeout (`timeout` in pyproject.toml), and timing targets are measured in benchmarks/.

Only the test's body counts (pytest's "call" phase): fixtures shared by a module or the session are paid
once and are not one test's cost. With xdist the workers send their findings with each test's report, and
the summary is written where the run is reported.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

DEFAULT_BUDGET_S = 10.0
PROPERTY = "over_budget"  # the name of the user property a test's report carries its overrun in
_found: list[str] = []  # this run's overruns, in the process that reports the run


def budget_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("budget")
    if marker is None:
        return DEFAULT_BUDGET_S
    (seconds,) = marker.args
    return float(seconds)


def check(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """Note on a test's report (whatever its outcome) that its body overran its budget; the outcome stays."""
    if report.when != "call":
        return
    budget = budget_of(item)
    if call.duration <= budget:
        return
    load = os.getloadavg()[0]
    report.user_properties.append((PROPERTY, f"{item.nodeid}: {call.duration:.1f} s, budget {budget:g} s "
                                             f"(load {load:.1f} on {os.cpu_count() or 1} cores)"))


def collect(report: pytest.TestReport) -> None:
    """Keep the overruns of a finished test (this process's or a worker's) for the summary."""
    _found.extend(str(value) for name, value in report.user_properties if name == PROPERTY)


def summary(write_line: Callable[[str], object]) -> None:
    """The overruns of the run, slowest first; nothing when every test kept its budget."""
    found = list(_found)
    if not found:
        return
    write_line(f"{len(found)} tests took longer than their time budget (a report, not a failure: make them "
               f"faster, or declare @pytest.mark.budget(SECONDS) with the reason; tests/budget.py):")
    for line in sorted(found, key=lambda text: -float(text.split(": ", 1)[1].split(" s", 1)[0])):
        write_line(f"  {line}")
