"""`tpu-bench program -- PROGRAM ARGS`: a real program run under the real agent for a bounded time, reported with
the agent's own figures, and gated with --baseline."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool

STEADY = '''
import sys, time
import jax, jax.numpy as jnp
import tpu_tools.agent as agent

step = jax.jit(lambda x: jnp.tanh(x @ x))
x = jnp.ones((64, 64))
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10**9
for _ in range(steps):
    with agent.step_context():
        step(x).block_until_ready()
        time.sleep(0.02)
print("finished", steps)
'''
NO_STEPS = "import time\ntime.sleep(60)\n"
FAILING = "import sys\nprint('loss is nan at step 3', file=sys.stderr)\nsys.exit(3)\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("program")
    for name, text in (("steady.py", STEADY), ("idle.py", NO_STEPS), ("failing.py", FAILING)):
        (folder / name).write_text(text)
    return folder


def bench(workdir: Path, *args: str, timeout: float = 240):
    return run_tool("tpu-bench", "program", *args, cwd=workdir, timeout=timeout)


@pytest.fixture(scope="module")
def steady_run(workdir) -> dict:
    path = workdir / "steady.json"
    result = bench(workdir, "--duration", "8", "--sample-interval", "0.25", "--json", str(path), "--", "steady.py")
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text())


def test_the_reported_steps_per_second_are_the_agents_own(steady_run):
    (case,) = steady_run["results"]
    assert case["status"] == "ok"
    assert case["id"] == "program/steady.py"
    assert case["params"]["command"] == ["steady.py"]
    assert case["params"]["duration_s"] == 8
    values, rate = case["values"], case["stats"]["steps_per_s"]
    assert case["primary"] == "steps_per_s"
    assert rate["count"] >= 3
    # the same job's figure, read by the agent: the reported median is within 5 % of the agent's last figure
    assert rate["median"] == pytest.approx(values["agent_steps_per_s"], rel=0.05)
    assert values["steps"] >= 20
    assert values["ended"] == "stopped at the duration"
    assert values["exit_code"] is None
    # each step sleeps 20 ms: its time is at least that, and the rate at most 50 steps/s
    assert values["step_time_p50_ms"] >= 20
    assert values["step_time_p99_ms"] >= values["step_time_p50_ms"]
    assert rate["median"] <= 50
    assert case["stats"]["step_time_ms"]["median"] >= 20
    assert values["compile_count"] >= 1
    assert values["compile_time_s"] > 0
    assert values["mfu_percent"] is None  # the CPU has no peak


def test_a_program_that_ends_by_itself_is_reported_with_its_exit(workdir):
    result = bench(workdir, "--duration", "120", "--sample-interval", "0.1", "--json", "-", "--", "steady.py", "60")
    assert result.returncode == 0, result.stderr
    (case,) = json.loads(result.stdout)["results"]
    assert case["values"]["ended"] == "by itself"
    assert case["values"]["exit_code"] == 0
    assert case["values"]["steps"] >= 2
    assert "finished" not in result.stdout  # the program's output is its log's, not the JSON's


def test_the_baseline_gate_fails_a_slower_program(workdir, steady_run):
    faster = copy.deepcopy(steady_run)
    for summary in faster["results"][0]["stats"].values():
        scale = 1000.0 if summary["higher_is_better"] else 1 / 1000.0
        for key in ("median", "p25", "p75", "p90", "p99", "min", "max", "mean"):
            summary[key] *= scale
    path = workdir / "faster.json"
    path.write_text(json.dumps(faster))
    result = bench(workdir, "--duration", "6", "--sample-interval", "0.25", "--baseline", str(path), "--",
                   "steady.py")
    assert_one_line_error(result, 3, "regressed beyond 5%", "program/steady.py steps_per_s")


def test_a_failing_program_is_a_failed_case_with_its_last_line(workdir):
    result = bench(workdir, "--duration", "30", "--json", "-", "--", "failing.py")
    assert result.returncode == 1
    (case,) = json.loads(result.stdout)["results"]
    assert case["status"] == "failed"
    assert "exited with status 3" in case["message"]
    assert "loss is nan at step 3" in case["message"]


def test_a_program_that_marks_no_steps_is_told_how_to(workdir):
    result = bench(workdir, "--duration", "2", "--sample-interval", "0.2", "--json", "-", "--", "idle.py")
    assert result.returncode == 1
    (case,) = json.loads(result.stdout)["results"]
    assert case["status"] == "failed"
    assert "tpu_tools.agent.step()" in case["message"]


def test_a_missing_program_is_a_usage_error(workdir):
    assert_one_line_error(bench(workdir, "--", "nowhere.py"), 2, "no such program file")


@pytest.mark.parametrize("option", [("--min-time", "2"), ("--warmup", "5"), ("--seed", "3"), ("--suite", "full")])
def test_the_timing_loops_options_are_refused_not_ignored(workdir, option):
    assert_one_line_error(bench(workdir, *option, "--", "steady.py"), 2, f"{option[0]} does not apply")
    given_first = run_tool("tpu-bench", *option, "program", "--", "steady.py", cwd=workdir)
    assert_one_line_error(given_first, 2, f"{option[0]} does not apply")


def test_a_program_whose_agent_never_answers_is_stopped_at_the_timeout(workdir, tmp_path):
    unusable = tmp_path / "not-a-directory"
    unusable.write_text("")  # the agent cannot make its socket here, and nothing can be asked
    result = run_tool("tpu-bench", "program", "--duration", "120", "--timeout", "3", "--json", "-", "--",
                      "steady.py", cwd=workdir, env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(unusable)), timeout=240)
    assert result.returncode == 1
    (case,) = json.loads(result.stdout)["results"]
    assert case["status"] == "failed"
    assert "did not answer within --timeout 3 s" in case["message"]
