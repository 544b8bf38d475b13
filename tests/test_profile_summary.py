"""`tpu-profile summary` on traces written outside the tool, and on folders that are not traces."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool

PLAIN_TRACE_PROGRAM = """
    import sys
    import jax
    import jax.numpy as jnp


    @jax.jit
    def step(x):
        return jnp.tanh(x @ x).sum()


    def update(y):
        for _ in range(6):
            y = y * 0.5
        return y


    x = jnp.ones((32, 32))
    with jax.profiler.trace(sys.argv[1]):
        for _ in range(4):
            step(x).block_until_ready()
        update(x).block_until_ready()
"""


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory) -> Path:
    """A trace written by plain jax.profiler.trace in an ordinary program, without tpu-profile."""
    folder = tmp_path_factory.mktemp("plain")
    program = folder / "plain.py"
    program.write_text(textwrap.dedent(PLAIN_TRACE_PROGRAM))
    subprocess.run([sys.executable, str(program), str(folder / "logs")], check=True, timeout=120,
                   env=clean_env(JAX_PLATFORMS="cpu"), capture_output=True)
    return folder / "logs"


def summary_json(path: Path, *args: str) -> dict:
    result = run_tool("tpu-profile", "summary", str(path), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def plain_summary(plain_trace: Path) -> dict:
    """`summary --json` of the plain trace's log folder, read by the tests (none changes it)."""
    return summary_json(plain_trace)


def test_summary_of_a_plain_jax_profiler_trace(plain_summary):
    document = plain_summary
    assert document["schema"] == "tpu-tools/profile/v1"
    assert document["source"] == "trace"
    assert document["program"] is None
    assert document["window"] is None
    # Which op leads is the machine's to say: the step's fusion takes about 100 times the eager multiplies here,
    # but a busy machine has preempted a multiply for longer than that. What each op is, and the order, are not.
    ops = document["top_ops"]
    assert [op["total_us"] for op in ops] == sorted((op["total_us"] for op in ops), reverse=True)
    assert {(op["module"], op["count"]) for op in ops} >= {("jit_step", 4), ("jit_multiply", 6)}
    # (a GPU host's trace also holds its GPU's plane, unused by this CPU program)
    assert "cpu:0" in [row["device"] for row in document["devices"]]
    # What the trace alone tells about compilation: the compile inside the first call, then cache hits.
    assert document["compile_source"] == "trace"
    step = next(r for r in document["compiles"] if r["function"] == "step")
    assert step["compiles"] == 1
    assert step["calls"] == 4
    assert step["cache_hits"] == 3
    assert step["compile_time_s"] > 0
    assert step["traces"] is None
    eager = document["eager"]
    assert {op["name"]: op["count"] for op in eager["ops"]} == {"multiply": 6}
    assert eager["call_sites"][0]["function"] == "update"
    assert eager["call_sites"][0]["file"] == "plain.py"
    assert any("trace alone" in note for note in document["notes"])


def test_summary_text_of_a_plain_trace(plain_trace):
    result = run_tool("tpu-profile", "summary", str(plain_trace))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("trace: ")
    for heading in ("Devices: busy and idle", "Top ops by device time", "Host dispatch: ", "Compilation (from the "
                    "trace", "Op-by-op (eager) dispatch: 6", "update (plain.py:"):
        assert heading in result.stdout, heading
    assert "\x1b[" not in result.stdout


def test_summary_accepts_a_run_folder_or_a_single_file(plain_trace, plain_summary):
    run_dir = next((plain_trace / "plugins" / "profile").iterdir())
    xplane = next(run_dir.glob("*.xplane.pb"))
    assert summary_json(run_dir)["top_ops"] == summary_json(xplane)["top_ops"] == plain_summary["top_ops"]


def test_the_latest_of_several_runs_is_read_and_the_others_are_named(plain_trace, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(plain_trace, logs)
    run_dir = next((logs / "plugins" / "profile").iterdir())
    shutil.copytree(run_dir, run_dir.parent / "2000_01_01_00_00_00")
    document = summary_json(logs)
    assert document["trace"]["run_dir"] == str(run_dir)
    assert any("1 other trace run" in note for note in document["notes"])


def test_an_empty_folder(tmp_path):
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path)), 2, "is empty: no trace in it")


def test_a_folder_that_is_not_a_trace(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path)), 2, "is not a trace folder")
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path / "notes.txt")), 2, "is not a trace")
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path / "missing")), 2, "does not exist")


def test_a_truncated_trace(plain_trace, tmp_path):
    xplane = next(plain_trace.rglob("*.xplane.pb"))
    data = xplane.read_bytes()
    broken = tmp_path / "plugins" / "profile" / "run"
    broken.mkdir(parents=True)
    (broken / xplane.name).write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path)), 1, "is not a readable trace",
                          "truncated")


def test_a_file_that_is_not_an_xspace(tmp_path):
    (tmp_path / "host.xplane.pb").write_bytes(b"this is not a protobuf at all \xff\xfe")
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path)), 1, "is not a readable trace")


def test_an_empty_trace_file(tmp_path):
    (tmp_path / "host.xplane.pb").write_bytes(b"")
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path)), 1, "the trace is empty")


def test_a_corrupt_summary_json_is_named(tmp_path):
    (tmp_path / "summary.json").write_text("{not json")
    assert_one_line_error(run_tool("tpu-profile", "summary", str(tmp_path)), 1, "summary.json is not a readable")
