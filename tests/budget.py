"""A visible time budget per test: a test whose body takes more than 10 s fails, saying by how much.

A test that honestly needs longer (a real multi-process run, a real Prometheus filling its window) says so
with `@pytest.mark.budget(SECONDS)`, next to a reason. The budget is a guard against a test growing slow
unnoticed, never against a busy machine, so the bound stretches with what slows every test alike:

- the machine's load: the budget is multiplied by the load average per core when that is above 1 (a CPU
  burner beside the suite, parallel workers, other users), counting at most TEST_CORES cores: a test's
  programs keep a few cores busy at once (JAX's compile and runtime threads), so on a machine of many cores
  the load beyond those few slows it too (16 workers on 16 cores doubled two 6-s tests);
- coverage: measuring every line of every child process about doubles what a test costs;
- TPU_TOOLS_TEST_BUDGET_SCALE: a factor for a machine known to be slow (0 turns the check off).

Only the test's body counts (pytest's "call" phase): fixtures shared by a module or the session are paid
once and are not one test's cost. The typical test takes well under a second, so a test near its bound is
one that should be made faster or declare its budget.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_BUDGET_S = 10.0
SCALE_VARIABLE = "TPU_TOOLS_TEST_BUDGET_SCALE"
COVERAGE_FACTOR = 2.0
TEST_CORES = 4  # the cores one test's programs keep busy at once, at most


def budget_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("budget")
    if marker is None:
        return DEFAULT_BUDGET_S
    (seconds,) = marker.args
    return float(seconds)


def stretch(config: pytest.Config) -> tuple[float, str]:
    """The factor the budget is multiplied by now, and why (for the failure message)."""
    cores = os.cpu_count() or 1
    load = max(os.getloadavg()[:2])
    factor = max(1.0, load / min(cores, TEST_CORES))
    why = [f"load {load:.1f} on {min(cores, TEST_CORES)} of {cores} cores" if cores > TEST_CORES
           else f"load {load:.1f} on {cores} cores"]
    if config.getoption("cov_source", default=None):
        factor *= COVERAGE_FACTOR
        why.append("coverage on")
    scale = float(os.environ.get(SCALE_VARIABLE) or 1.0)
    if scale != 1.0:
        factor *= scale
        why.append(f"{SCALE_VARIABLE}={scale:g}")
    return factor, ", ".join(why)


def check(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """Turn a passed test whose body overran its (stretched) budget into a failure that says so."""
    if report.when != "call" or not report.passed:
        return
    budget = budget_of(item)
    factor, why = stretch(item.config)
    if factor <= 0 or call.duration <= budget * factor:
        return
    report.outcome = "failed"
    report.longrepr = (f"{item.nodeid} passed but took {call.duration:.1f} s, over its budget of {budget:g} s "
                       f"(x{factor:.1f} allowed now: {why}). Make it faster (a smaller honest input, a shared "
                       f"fixture), or declare what it needs: @pytest.mark.budget(SECONDS) with the reason.")
