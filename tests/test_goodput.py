"""The goodput ledger: cause by cause against a clock the test moves, and against a real job that sleeps
known amounts in each phase (every cause within 1 % or 20 ms of the truth, steps of 5 ms)."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from agentjobs import make_rundir, remove_rundir
from conftest import clean_env
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_tools.instrument.goodput import (
    MAX_CUSTOM_PHASES,
    GoodputLedger,
    LedgerSettings,
    work_rates,
)
from tpu_tools.metrics.jobsummary import MAX_RECORDS, read_summaries, write_summary

JOB = Path(__file__).with_name("goodput_job.py")


class Clock:
    """A clock the test sets: the ledger's time source (time.perf_counter in a job)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ledger(clock: Clock, **settings: float) -> GoodputLedger:
    return GoodputLedger(clock.now, 1.7e9, LedgerSettings(**settings), clock=clock)


def causes(book: GoodputLedger) -> dict[str, float]:
    return {k: round(v, 9) for k, v in book.snapshot()["since_start"]["causes_s"].items() if v}


def test_blocks_phases_compiles_and_host_time_each_go_to_their_cause():
    clock = Clock()
    book = ledger(clock)
    clock.advance(2.5)  # imports, backend start and a compile of 0.5 s
    book.add_compile(0.5)  # a compile before the first step is compile, not start-up
    for _ in range(4):
        with book.phase("data"):
            clock.advance(0.1)
        book.begin_step()
        clock.advance(0.3)
        book.add_compile(0.0)
        book.end_step()
        clock.advance(0.05)  # unlabelled host work between steps
    with book.phase("checkpoint"):
        clock.advance(0.4)
        book.add_compile(0.1)  # a compile inside a phase stays compile time
    assert causes(book) == {"startup": 2.0, "compile": 0.6, "data": 0.4, "productive": 1.2, "host": 0.2,
                            "checkpoint": 0.3}
    figures = book.snapshot()["since_start"]
    assert math.isclose(sum(figures["causes_s"].values()), figures["wall_s"])
    assert math.isclose(figures["goodput_percent"], 100 * 1.2 / 4.7)


def test_bare_step_marks_intervals_and_a_long_gap_is_idle():
    clock = Clock()
    book = ledger(clock, idle_factor=10.0, idle_min_s=0.5)
    clock.advance(1.0)
    book.end_step()  # the first step's start is unknown: start-up
    for _ in range(40):
        clock.advance(0.01)
        book.end_step()
    clock.advance(3.0)  # no step for 300 median step times
    assert causes(book) == {"startup": 1.0, "productive": 0.4, "idle": 3.0}  # live: the open gap is already idle
    book.end_step()
    assert causes(book) == {"startup": 1.0, "productive": 0.4, "idle": 3.0}
    assert book.snapshot()["idle_threshold_s"] == 0.5


def test_recent_window_covers_only_the_last_window():
    clock = Clock()
    book = ledger(clock, window_s=10.0)
    book.begin_step()
    for _ in range(100):  # 20 s of steps and host work, then 20 s of data loading
        clock.advance(0.1)
        book.end_step()
        clock.advance(0.1)
        book.begin_step()
    for _ in range(20):
        with book.phase("data"):
            clock.advance(1.0)
        book.begin_step()
        book.end_step()
    recent = book.snapshot()["recent"]
    assert recent["goodput_percent"] == 0.0
    assert recent["causes_s"]["data"] == pytest.approx(recent["wall_s"])
    assert 10.0 <= recent["wall_s"] <= 12.0


def test_bad_input_is_counted_and_reported_never_raised():
    clock = Clock()
    book = ledger(clock)
    book.note_work(flops=float("nan"), samples=-1)
    book.note_work(flops="many", samples=math.inf)
    for name in ["\x1b[31mred", "productive", 7, "x" * 200, *[f"p{i}" for i in range(MAX_CUSTOM_PHASES + 5)]]:
        with book.phase(name):
            clock.advance(0.01)
    book.begin_step()
    book.end_step()
    figures = book.snapshot()
    assert figures["rejected"]["flops"] == 2
    assert figures["rejected"]["samples"] == 2
    assert figures["rejected"]["phase"] == 9
    assert "\x1b" not in json.dumps(figures["last_error"])
    assert len(figures["last_error"]) < 200
    named = set(figures["since_start"]["causes_s"])
    assert "other" in named
    assert len(named) <= 9 + MAX_CUSTOM_PHASES + 1
    assert figures["since_start"]["flops"] is None
    assert figures["since_start"]["samples"] is None  # unknown, not 0
    with pytest.raises(KeyError, match="the job's"):  # the job's own exception goes through a phase unchanged
        with book.phase("data"):
            raise KeyError("the job's")


def test_work_rates_unknown_stays_unknown():
    span = {"wall_s": 10.0, "flops": 2e12, "samples": 5000.0}
    assert work_rates(span, 1e12, 3.6) == {"flops_per_s": 2e11, "mfu_percent": 20.0, "samples_per_s": 500.0,
                                           "cost_per_million_samples": pytest.approx(2.0)}
    assert work_rates({"wall_s": 10.0, "flops": None, "samples": None}, None, None) == {
        "flops_per_s": None, "mfu_percent": None, "samples_per_s": None, "cost_per_million_samples": None}


def test_summaries_are_private_bounded_and_checked(tmp_path):
    base = tmp_path / "run"
    for index in range(MAX_RECORDS + 3):
        path = write_summary({"pid": 10 + index, "ended_unix_s": 1000.0 + index, "value": math.nan}, base)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    (path.parent / "1-1.json").write_text("{not json")
    records, errors = read_summaries(base)
    assert len(records) == MAX_RECORDS
    assert records[0]["pid"] == 10 + MAX_RECORDS + 2
    assert records[0]["value"] is None  # NaN is not JSON: unknown
    assert len(errors) == 1
    assert "1-1.json" in errors[0]


def test_a_real_job_every_cause_within_one_percent_or_20ms():
    rundir = make_rundir()
    try:
        env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir), TPU_TOOLS_PRICE_PER_HOUR="7.2",
                        TPU_TOOLS_PEAK_FLOPS="1e11")
        result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", "--tag", "truth", str(JOB), "100"],
                                env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        truth, figures = report["truth"], report["ledger"]["since_start"]
        measured = figures["causes_s"]
        # Each cause's truth is a range (tests/goodput_job.py): its sleeps alone, and its whole blocks, entering
        # and leaving included. The ledger reads its clock between the two, so where a loaded machine preempted
        # the job there, that time is the block's; on an idle machine the range is microseconds wide.
        low, high = report["low"], report["high"]
        others = ("productive", "data", "checkpoint", "eval", "warmup", "idle", "startup")
        low["host"] = low["wall"] - sum(high[c] for c in others)  # host work is what the other causes leave
        high["host"] = high["wall"] - sum(low[c] for c in others)
        for cause in ("productive", "startup", "data", "checkpoint", "eval", "warmup", "idle", "host"):
            tolerance = max(0.01 * low[cause], 0.020)
            assert low[cause] - tolerance <= measured[cause] <= high[cause] + tolerance, \
                (cause, measured[cause], low[cause], high[cause])
        assert measured["startup"] >= truth["startup_sleep"]
        assert figures["samples"] == 3200
        assert figures["flops"] == 1e11
        assert figures["mfu_percent"] == pytest.approx(100 * figures["flops_per_s"] / 1e11)
        assert figures["cost_per_million_samples"] == pytest.approx(7.2 / 3600 / figures["samples_per_s"] * 1e6)
        records, errors = read_summaries(rundir)
        assert not errors
        assert len(records) == 1
        summary = records[0]
        assert summary["tag"] == "truth"
        assert summary["steps"]["count"] == 100
        assert summary["goodput"]["since_start"]["causes_s"]["idle"] >= truth["idle"]
        files = list((rundir / "jobs-ended").iterdir())
        assert [stat.S_IMODE(f.stat().st_mode) for f in files] == [0o600]
    finally:
        remove_rundir(rundir)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                                 st.text(max_size=20), st.binary(max_size=8)), max_size=6),
       names=st.lists(st.one_of(st.text(max_size=70), st.integers(), st.none()), max_size=6))
def test_whatever_the_job_passes_the_ledger_and_metrics_never_raise(values, names):
    from tpu_tools.agent.metrics import MetricStore

    clock = Clock()
    book = ledger(clock)
    store = MetricStore()
    for value in values:
        book.note_work(flops=value, samples=value)
        book.set_step_flops(value, "given")
        book.add_compile(value)
        store.record("m", value, "global", 1)
    for name in names:
        with book.phase(name):
            clock.advance(0.001)
        store.record(name, 1.0, None, 1)
    book.begin_step()
    clock.advance(0.01)
    book.end_step()
    figures = book.snapshot()
    json.dumps(figures, allow_nan=False)  # always JSON: unknown is None, never NaN
    json.dumps(store.snapshot(), allow_nan=False)
    assert math.isclose(sum(figures["since_start"]["causes_s"].values()), figures["since_start"]["wall_s"],
                        rel_tol=1e-9, abs_tol=1e-9)
