"""Device memory by allocation: a real JAX job's agent answers the arrays request, read by tpu-monitor --arrays."""

from __future__ import annotations

import json
import os

from agentjobs import agent_env, running_job
from conftest import run_tool
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_tools.agent.arrays import allocation_sites


def test_the_largest_arrays_and_the_lines_that_made_them():
    with running_job(tag="arrays", host_devices=4) as (job, rundir):
        result = run_tool("tpu-monitor", "--arrays", str(job.pid), env=agent_env(rundir))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "tpu-tools/arrays/v1"
    assert document["pid"] == job.pid
    assert document["tag"] == "arrays"
    biggest = document["arrays"][0]
    # the job's 1024 x 1024 f32 array sharded over 4 devices on "d": the largest group
    assert (biggest["shape"], biggest["dtype"], biggest["bytes"]) == ("(1024, 1024)", "float32", 4 << 20)
    assert "NamedSharding" in biggest["sharding"]
    assert "'d'" in biggest["sharding"]
    assert "job.py:" in biggest["source"]  # the job's own line that made it, from the array's traceback
    assert document["arrays_looked_at"] >= 1
    assert document["truncated"] is False
    assert document["sites_error"] is None, document
    assert document["sites"], document
    assert any("job.py:" in site["source"] for site in document["sites"])  # a line of the job's own code


def test_a_job_without_jax_or_no_agent_is_one_line_exit_1():
    with running_job(tag="light", light=True, launcher=False) as (job, rundir):
        result = run_tool("tpu-monitor", "--arrays", str(job.pid), env=agent_env(rundir))
        assert result.returncode == 1
        assert "has not started a JAX backend" in result.stderr
        assert len(result.stderr.splitlines()) == 1
        gone = run_tool("tpu-monitor", "--arrays", str(os.getpid()), env=agent_env(rundir))
        assert gone.returncode == 1
        assert "no agent is registered" in gone.stderr


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_profile_bytes_give_sites_or_a_value_error(data):
    try:
        sites = allocation_sites(data, 5)
    except (ValueError, IndexError, OSError, EOFError):
        return
    assert isinstance(sites, list)
    assert len(sites) <= 5
