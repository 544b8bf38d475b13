"""The comparison gate fails on what it could not judge: no results, or baseline cases that were not measured."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_tool

FAST = ("dispatch", "--mode", "compiled", "--min-time", "0.02", "--warmup", "1")


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("gate") / "base.json"
    result = run_tool("tpu-bench", *FAST, "--json", str(path), timeout=240)
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text())


def _slower(document: dict, factor: float = 50.0) -> dict:
    """The same run with every time `factor` times longer: no load on this host makes it a regression."""
    forged = copy.deepcopy(document)
    for case in forged["results"]:
        for summary in case["stats"].values():
            for key in ("median", "p25", "p75", "p90", "p99", "min", "max", "mean"):
                summary[key] *= factor
    return forged


def _with_extra_case(document: dict) -> dict:
    forged = copy.deepcopy(document)
    extra = copy.deepcopy(forged["results"][0])
    extra.update(id="dispatch/gone", name="gone")
    forged["results"].append(extra)
    return forged


def _write(folder: Path, name: str, document: dict) -> str:
    path = folder / name
    path.write_text(json.dumps(document))
    return str(path)


def test_compare_with_nothing_measured_or_cases_missing_fails_the_gate(measured, tmp_path):
    base = _write(tmp_path, "base.json", _slower(measured))
    empty = _write(tmp_path, "empty.json", {**measured, "results": []})
    assert_one_line_error(run_tool("tpu-bench", "compare", base, empty), 3, "was not measured", "dispatch/compiled")
    both_empty = run_tool("tpu-bench", "compare", empty, empty)
    assert_one_line_error(both_empty, 3, "no figure was compared")
    allowed = run_tool("tpu-bench", "compare", base, empty, "--allow-missing", "--json", "-")
    assert allowed.returncode == 0, allowed.stderr
    document = json.loads(allowed.stdout)
    assert document["missing"] == ["dispatch/compiled"]
    assert document["judged_count"] == 0
    # a baseline case that was not measured, beside one that was compared and passed
    wider = _write(tmp_path, "wider.json", _with_extra_case(_slower(measured)))
    current = _write(tmp_path, "current.json", measured)
    assert_one_line_error(run_tool("tpu-bench", "compare", wider, current), 3, "dispatch/gone", "--allow-missing")
    assert run_tool("tpu-bench", "compare", wider, current, "--allow-missing").returncode == 0
    # a baseline case that did not run in the baseline either is not missing
    failed = _with_extra_case(_slower(measured))
    failed["results"][1].update(status="failed", stats={}, message="boom")
    assert run_tool("tpu-bench", "compare", _write(tmp_path, "failed.json", failed), current).returncode == 0


def test_a_run_with_missing_baseline_cases_fails_the_gate(measured, tmp_path):
    wider = _write(tmp_path, "wider.json", _with_extra_case(_slower(measured)))
    result = run_tool("tpu-bench", *FAST, "--baseline", wider, timeout=240)
    assert_one_line_error(result, 3, "1 baseline case was not measured this time: dispatch/gone")
    allowed = run_tool("tpu-bench", *FAST, "--baseline", wider, "--allow-missing", timeout=240)
    assert allowed.returncode == 0, allowed.stderr
