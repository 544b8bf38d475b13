"""Records read from outside (bench results and baselines, summary.json) and the JSON the tools write."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_tools import jsonout
from tpu_tools.bench.compare import INVALID, compare, load_result
from tpu_tools.bench.records import BenchDevice, BenchEnvironment, BenchSettings, Case, CaseResult, RunResult
from tpu_tools.bench.stats import summarize
from tpu_tools.errors import RuntimeFailure, UsageError
from tpu_tools.profile.summary import SCHEMA as SUMMARY_SCHEMA
from tpu_tools.profile.summary import load_summary


def result_document(scale: float = 1.0) -> dict:
    case = CaseResult(Case("dispatch", "compiled"), primary="latency_us",
                      stats={"latency_us": summarize([10.0 * scale, 11.0 * scale, 12.0 * scale, 10.5 * scale])})
    device = BenchDevice(platform="cpu", kind="cpu", count=1)
    return RunResult(environment=BenchEnvironment(host="h"), device=device, settings=BenchSettings(min_time_s=0.5),
                     results=[case], suite="quick", time="t").to_dict()


def with_figure(document: dict, **figures: float) -> dict:
    changed = copy.deepcopy(document)
    changed["results"][0]["stats"]["latency_us"].update(figures)
    return changed


def write(path: Path, document: dict | str) -> str:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


# --- bug 2: NaN passes the regression gate ----------------------------------------------------------------

@pytest.mark.parametrize("side", ["current", "baseline"])
def test_a_nan_figure_fails_the_comparison_with_exit_3(tmp_path, side):
    good = write(tmp_path / "good.json", result_document())
    bad = write(tmp_path / "nan.json", with_figure(result_document(), median=math.nan, p25=math.nan, p75=math.nan))
    files = (good, bad) if side == "current" else (bad, good)
    result = run_tool("tpu-bench", "compare", *files, "--json", str(tmp_path / "cmp.json"), env=clean_env())
    assert_one_line_error(result, 3, "not a finite number")
    text = (tmp_path / "cmp.json").read_text()
    assert "NaN" not in text
    assert "Infinity" not in text
    document = json.loads(text)
    assert document["changes"][0]["verdict"] == INVALID
    assert document["regression_count"] == 1
    assert any("written as null" in note for note in document["notes"])


def test_a_figure_written_as_null_reads_back_as_not_finite(tmp_path):
    path = write(tmp_path / "r.json", jsonout.dumps(with_figure(result_document(), median=math.nan)))
    loaded = load_result(path, "current")
    comparison = compare(result_document(), loaded, 0.05)
    assert [c.verdict for c in comparison.changes] == [INVALID]


def test_an_infinite_figure_is_a_failed_comparison_in_process():
    comparison = compare(result_document(), with_figure(result_document(), p75=math.inf), 0.05)
    assert [c.verdict for c in comparison.changes] == [INVALID]
    assert comparison.regressions


@pytest.mark.parametrize(("mutate", "fragment"), [
    (lambda d: d.update(environment=5), "Expected `object | null`, got `int` - at `$.environment`"),
    (lambda d: d["results"][0]["stats"]["latency_us"].update(median="fast"), "got `str` - at `$.results[0].stats"),
    (lambda d: d["results"][0]["stats"]["latency_us"].update(count=True), "count"),
    (lambda d: d["results"][0].update(status="great"), "status"),
    (lambda d: d.update(results={"a": 1}), "results"),
])
def test_a_damaged_result_file_is_a_usage_error_naming_the_field(tmp_path, mutate, fragment):
    document = result_document()
    mutate(document)
    path = write(tmp_path / "bad.json", document)
    with pytest.raises(UsageError) as caught:
        load_result(path, "baseline")
    assert fragment in str(caught.value)


@pytest.mark.parametrize("content", ["[" * 100_000, '{"schema": "tpu-tools/bench/v1", "results": ' + "[" * 50_000])
def test_deeply_nested_or_huge_result_files_are_one_line(tmp_path, content):
    path = write(tmp_path / "deep.json", content)
    with pytest.raises(UsageError, match="is nested too deeply to be a tpu-bench result"):
        load_result(path, "current")


def test_compare_refuses_dev_zero_in_one_line():
    result = run_tool("tpu-bench", "compare", "/dev/zero", "/dev/zero", env=clean_env(), timeout=60)
    assert_one_line_error(result, 2, "is a character device, not a regular file")


RESULT_PATHS = st.sampled_from([
    ("environment",), ("device",), ("settings",), ("results",), ("notes",), ("suite",), ("time",),
    ("results", 0), ("results", 0, "status"), ("results", 0, "stats"), ("results", 0, "params"),
    ("results", 0, "values"), ("results", 0, "message"), ("results", 0, "duration_s"),
    ("results", 0, "stats", "latency_us"), ("results", 0, "stats", "latency_us", "median"),
    ("results", 0, "stats", "latency_us", "count"), ("results", 0, "stats", "latency_us", "higher_is_better"),
    ("environment", "versions"), ("device", "kind"),
])
HOSTILE = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30), st.floats(),
                    st.text(max_size=5), st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(RESULT_PATHS, HOSTILE), min_size=1, max_size=3))
def test_any_damaged_result_compares_or_is_one_usage_error(tmp_path, edits):
    document = result_document()
    for path, value in edits:
        target = document
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    file = write(tmp_path / "r.json", jsonout.dumps(document))
    try:
        loaded = load_result(file, "current")
    except UsageError as error:
        assert "\n" not in str(error)
        return
    comparison = compare(result_document(), loaded, 0.05, allow_mismatch=True)
    json.loads(jsonout.dumps(comparison.to_dict()))  # strict JSON, whatever the figures were


# --- summary.json (tpu-profile summary) --------------------------------------------------------------

def test_profile_summary_of_dev_zero_is_one_line():
    result = run_tool("tpu-profile", "summary", "/dev/zero", env=clean_env(JAX_PLATFORMS="cpu"), timeout=60)
    assert_one_line_error(result, 2, "is not a trace")


def test_a_summary_json_of_wrong_types_is_one_line(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"schema": SUMMARY_SCHEMA, "devices": "x",
                                                       "top_ops": [{"name": 5}]}))
    result = run_tool("tpu-profile", "summary", str(tmp_path), env=clean_env(JAX_PLATFORMS="cpu"), timeout=60)
    assert_one_line_error(result, 1, "damaged tpu-profile summary", "summary.devices")


SUMMARY_KEYS = st.sampled_from(["program", "window", "trace", "devices", "device_time_us", "top_ops", "modules",
                                "host_dispatch", "compile_source", "compiles", "recompilations", "eager", "notes"])
SUMMARY_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["name", "device", "count", "argv", "status", "reasons", "ops", "duration_us", "hosts",
                         "dir", "function", "recompiles", "dispatches", "host_time_us", "call_sites", "total_us"]),
        inner, max_size=4),
    max_leaves=15)


def test_a_summary_read_back_is_the_record_written_and_reports_alike(tmp_path):
    from tpu_tools.profile.summary import build_summary, write_summary
    from tpu_tools.profile.window import WindowResult
    from tpu_tools.render.profile_view import report_text

    window = WindowResult(mode="time", delay_s=1.0, duration_s=2.0, start_step=None, steps=None, opened=True,
                          opened_at_s=1.0, closed_at_s=3.0, closed_by="duration")
    written = build_summary(source="run", notes=["a note"], window=window.to_dict(),
                            program={"argv": ["train.py", "--steps", "3"], "module": None, "status": "exited",
                                     "exit_code": 3, "error": None, "wall_time_s": 4.25})
    write_summary(written, tmp_path)
    read = load_summary(tmp_path)
    assert read == written
    assert read is not None
    assert read.program is not None
    assert read.program.exit_code == 3
    text = report_text(read)
    assert text == report_text(written)
    assert "program: train.py --steps 3  (exit 3, 4.25 s)" in text
    assert "window 1.0 s to 3.0 s" in text

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.dictionaries(SUMMARY_KEYS, SUMMARY_VALUES, max_size=5))
def test_any_summary_json_renders_or_is_one_error(tmp_path, fields):
    from tpu_tools.render.profile_view import report_text

    (tmp_path / "summary.json").write_text(jsonout.dumps({"schema": SUMMARY_SCHEMA, **fields}))
    try:
        document = load_summary(tmp_path)
    except RuntimeFailure as error:
        assert "\n" not in str(error)
        return
    assert isinstance(report_text(document), str)


# --- strict JSON out (bug 15) ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(document=st.recursive(st.none() | st.floats() | st.integers() | st.text(max_size=4),
                             lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                          max_size=3)))
def test_written_json_is_always_strict(document):
    text = jsonout.dumps({"value": document})
    json.loads(text, parse_constant=lambda token: pytest.fail(f"{token} in the output"))


def test_dump_timeout_inf_never_reaches_the_manifest():
    result = run_tool("tpu-dump", "--timeout", "inf", "--json", env=clean_env(), timeout=60)
    assert_one_line_error(result, 2, "--timeout")
