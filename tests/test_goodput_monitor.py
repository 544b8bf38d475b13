"""A job's goodput where people look: tpu-monitor's agent entries, Prometheus, --jobs-ended and tpu-dump."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest
from agentjobs import agent_env, rundir, start_job  # noqa: F401 (rundir is a fixture)
from conftest import assert_one_line_error, run_tool
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from test_dump_cli import _members

from tpu_tools.cli.monitor_config import load_config
from tpu_tools.errors import UsageError
from tpu_tools.exporter.prometheus import process_metrics
from tpu_tools.metrics.records.jobs import ProcessesGroup

JOB = Path(__file__).with_name("goodput_job.py")


class _Families:
    def __init__(self, data: dict) -> None:
        self.data = data

    def collect(self):
        return process_metrics(msgspec.convert(self.data, ProcessesGroup))


def exposition(agents: list[dict]) -> str:
    registry = CollectorRegistry()
    registry.register(_Families({"agents": agents}))
    return generate_latest(registry).decode()


def test_live_goodput_in_the_monitor_with_its_price_and_in_prometheus(rundir):  # noqa: F811
    config = rundir / "monitor.toml"
    config.write_text("price_per_hour = 7.2\n")
    job = start_job(rundir, light=True, tag="live").wait_ready()
    try:
        from_config = run_tool("tpu-monitor", "--count", "1", "--config", str(config), env=agent_env(rundir))
        result = run_tool("tpu-monitor", "--count", "1", "--config", str(config), "--price-per-hour", "3.6",
                          env=agent_env(rundir))
    finally:
        job.stop()
    assert from_config.returncode == 0, from_config.stderr
    [agent] = json.loads(from_config.stdout)["processes"]["agents"]
    assert agent["goodput"]["price_per_hour"] == 7.2
    assert agent["goodput"]["price_source"] == "monitor"
    assert result.returncode == 0, result.stderr  # the flag overrides the config file
    [agent] = json.loads(result.stdout)["processes"]["agents"]
    goodput = agent["goodput"]
    since = goodput["since_start"]
    assert since["wall_s"] > 0
    assert 0 <= since["goodput_percent"] <= 100
    assert abs(sum(since["causes_s"].values()) - since["wall_s"]) < 1e-6 * since["wall_s"] + 1e-9
    assert goodput["price_per_hour"] == 3.6
    assert goodput["price_source"] == "monitor"
    # the job gives no samples and no FLOPs: unknown, never 0
    assert since["samples_per_s"] is None
    assert since["cost_per_million_samples"] is None
    assert since["mfu_percent"] is None
    text = exposition([agent])
    assert f'tpu_tools_process_goodput_seconds_total{{cause="productive",pid="{job.pid}",tag="live"}}' in text
    assert 'tpu_tools_process_goodput_ratio{pid=' in text
    assert 'window="since_start"' in text
    assert "tpu_tools_process_mfu_ratio{" not in text  # unknown: no series
    assert "tpu_tools_process_cost_per_million_samples{" not in text


@pytest.mark.parametrize(("text", "fragment"), [
    ("price_per_hour = 0\n", "price_per_hour must be greater than 0"),
    ("price_per_hour = -1.5\n", "price_per_hour must be greater than 0"),
    ("price_per_hour = inf\n", "price_per_hour must be a finite number"),
    ("price_per_hour = nan\n", "price_per_hour must be a finite number"),
    ('price_per_hour = "4.2"\n', "price_per_hour must be a number, not text ('4.2')"),
    ('price_per_hour = "cheap"\n', "price_per_hour must be a number, not text ('cheap')"),
    ("price_per_hour = true\n", "price_per_hour must be a number"),
    ("price_per_hour = 1e12\n", "price_per_hour"),
])
def test_a_bad_price_in_the_config_file_is_one_line(tmp_path, text, fragment):
    path = tmp_path / "monitor.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_config(path, ["processes"])
    assert fragment in str(caught.value)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_config_price_is_taken_and_a_bad_one_stops_tpu_monitor(tmp_path):
    path = tmp_path / "monitor.json"
    path.write_text('{"price_per_hour": 4.2}')
    assert load_config(path, ["processes"]).price_per_hour == 4.2
    path.write_text('{"price_per_hour": 0}')
    result = run_tool("tpu-monitor", "--count", "1", "--config", str(path), env=agent_env(tmp_path))
    assert_one_line_error(result, 2, "price_per_hour must be greater than 0", str(path))
    assert result.stdout == ""


def test_prometheus_families_of_known_work():
    figures = {"wall_s": 10.0, "goodput_percent": 50.0, "causes_s": {"productive": 5.0, "data": 5.0},
               "mfu_percent": 40.0, "samples_per_s": 100.0, "flops_per_s": 4e11, "cost_per_million_samples": 10.0}
    text = exposition([{"pid": 7, "tag": "t", "goodput": {"since_start": figures, "recent": None}}])
    assert 'tpu_tools_process_goodput_seconds_total{cause="data",pid="7",tag="t"} 5.0' in text
    assert 'tpu_tools_process_mfu_ratio{pid="7",tag="t",window="since_start"} 0.4' in text
    assert 'tpu_tools_process_cost_per_million_samples{pid="7",tag="t",window="since_start"} 10.0' in text


def test_jobs_ended_listed_by_the_monitor_and_kept_by_tpu_dump(rundir, tmp_path):  # noqa: F811
    import subprocess

    env = agent_env(rundir)
    ran = subprocess.run([sys.executable, "-m", "tpu_tools.agent", "--tag", "ended", "--price-per-hour", "3.6",
                          str(JOB), "20", "0.005", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    result = run_tool("tpu-monitor", "--jobs-ended", env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "tpu-tools/jobs-ended/v1"
    assert document["errors"] == []
    [job] = document["jobs"]
    assert job["tag"] == "ended"
    assert job["steps"]["count"] == 20
    assert job["goodput"]["since_start"]["samples"] == 640
    assert job["goodput"]["price_per_hour"] == 3.6
    assert job["goodput"]["since_start"]["cost_per_million_samples"] > 0
    assert job["goodput"]["since_start"]["causes_s"]["checkpoint"] > 0.05
    output = tmp_path / "bundle.tar.gz"
    dumped = run_tool("tpu-dump", "--only", "accelerators.agents", "-o", str(output), env=env)
    assert dumped.returncode == 0, dumped.stderr
    kept = json.loads(_members(output)["accelerators/jobs_ended.json"])
    assert [j["tag"] for j in kept["jobs"]] == ["ended"]


def test_a_hostile_agent_snapshot_of_goodput_and_metrics_is_refused_with_one_sentence():
    import pytest

    from tpu_tools.metrics.agent_snapshot import SCHEMA, parse_snapshot
    from tpu_tools.outside import OutsideError

    base = {"schema": SCHEMA, "pid": 7}
    good = parse_snapshot({**base, "goodput": {"since_start": {"wall_s": 1.0, "causes_s": {"productive": 1.0}},
                                               "recent": None},
                           "metrics": {"values": [{"name": "loss", "value": 1.0, "kind": "host"}]}})
    assert good["goodput"]["since_start"]["causes_s"] == {"productive": 1.0}
    for bad, fragment in [
        ({"goodput": {"since_start": {"wall_s": "long"}}}, "goodput.since_start.wall_s: expected a number"),
        ({"goodput": {"since_start": {"causes_s": {f"c{i}": 1.0 for i in range(40)}}}}, "more than 32"),
        ({"metrics": {"values": [{"name": "loss", "kind": "global-ish"}]}}, "is not one of"),
        ({"metrics": {"values": [{"name": "x", "kind": "host"}] * 300}}, "more than 256"),
    ]:
        with pytest.raises(OutsideError, match="malformed snapshot") as caught:
            parse_snapshot({**base, **bad})
        assert fragment in str(caught.value)
