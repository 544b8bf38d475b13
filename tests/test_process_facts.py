"""Per-process facts are read once per process and age, and a forgotten process is read afresh."""

from __future__ import annotations

import time

from tpu_tools.metrics.processfacts import ProcessFacts


def test_a_fact_is_read_once_until_it_ages_or_the_process_is_forgotten() -> None:
    reads: list[int] = []

    def read(pid: int) -> str:
        reads.append(pid)
        return f"job of {pid} (read {len(reads)})"

    facts = ProcessFacts(read, max_age_s=3600)
    assert facts.get(7) == "job of 7 (read 1)"
    assert facts.get(7) == "job of 7 (read 1)"
    assert facts.get(8) == "job of 8 (read 2)"
    facts.forget_except({8})
    assert facts.get(8) == "job of 8 (read 2)"
    assert facts.get(7) == "job of 7 (read 3)"  # PID 7 ended (or was reused): read again
    assert reads == [7, 8, 7]


def test_a_fact_older_than_its_age_is_read_again() -> None:
    values = iter(["old", "new"])
    facts = ProcessFacts(lambda pid: next(values), max_age_s=0.001)
    assert facts.get(1) == "old"
    read_at = time.monotonic()
    while time.monotonic() < read_at + 0.002:  # until the fact is older than its age
        pass
    assert facts.get(1) == "new"
