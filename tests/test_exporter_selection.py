"""Choosing the exported families: allow and deny globs on the command line and in the config file, and
--list-metrics naming every family with its type, unit and help."""

from __future__ import annotations

import json
import subprocess

import pytest
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import as_report, run_tool, tool_command
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from test_monitor_cli import _free_port, _safe_scrape

from tpu_tools.cli.monitor_config import load_config
from tpu_tools.errors import UsageError
from tpu_tools.exporter import naming
from tpu_tools.exporter.families import exported_families, unit_of
from tpu_tools.exporter.prometheus import ReportCollector, host_metrics
from tpu_tools.exporter.selection import MetricSelection, parse_globs


def test_globs_allow_and_deny_counters_by_either_name():
    selection = MetricSelection(("tpu_tools_gpu_*", "tpu_tools_process_steps_total"), ("tpu_tools_gpu_process_*",))
    assert selection.selects("tpu_tools_gpu_up")
    assert selection.selects("tpu_tools_gpu_energy_joules")
    assert selection.selects("tpu_tools_process_steps")  # a counter as the client library names it
    assert not selection.selects("tpu_tools_gpu_process_memory_used_bytes")  # deny wins
    assert not selection.selects("tpu_tools_host_cpu_percent")
    assert MetricSelection().selects("anything")
    assert not MetricSelection(deny=("tpu_tools_host_[cm]*",)).selects("tpu_tools_host_memory_used_bytes")


def test_the_collector_serves_only_the_selected_families():
    collector = ReportCollector({"host": host_metrics}, MetricSelection(deny=("tpu_tools_host_memory_*",
                                                                               "tpu_tools_group_error",
                                                                               "tpu_tools_build_info")))
    collector.update(as_report({"host": {"error": None, "cpu_percent": 3.0, "memory_total_bytes": 1}}))
    assert [family.name for family in collector.collect()] == ["tpu_tools_host_cpu_percent"]


def test_globs_are_checked_and_split_on_commas():
    assert parse_globs(["tpu_tools_gpu_*, tpu_tools_host_cpu_percent", "a?"], "--allow-metric") == (
        "tpu_tools_gpu_*", "tpu_tools_host_cpu_percent", "a?")
    for bad in ("", "tpu tools", "x" * 300, "name{label}", "\x1b[2J"):
        with pytest.raises(UsageError, match="--deny-metric: .* is not a metric name or glob"):
            parse_globs([bad], "--deny-metric")


@given(st.lists(st.text(max_size=40), max_size=5))
def test_any_text_is_globs_or_one_usage_error(values):
    try:
        globs = parse_globs(values, "--allow-metric")
    except UsageError as error:
        assert "\n" not in str(error)
        assert len(str(error)) < 200
    else:
        MetricSelection(globs).selects("tpu_tools_host_cpu_percent")


def test_the_config_file_holds_the_lists(tmp_path):
    path = tmp_path / "monitor.toml"
    path.write_text('[prometheus]\nallow = ["tpu_tools_device_*", "tpu_tools_gpu_*"]\n'
                    'deny = "tpu_tools_gpu_process_*"\n')
    config = load_config(path, ["host"])
    assert config.metrics_allow == ("tpu_tools_device_*", "tpu_tools_gpu_*")
    assert config.metrics_deny == ("tpu_tools_gpu_process_*",)
    for text, fragment in [("[prometheus]\nallow = 3\n", "prometheus.allow must be a name or a list"),
                           ("[prometheus]\nkeep = []\n", "unknown key 'keep' in prometheus"),
                           ("prometheus = 1\n", "prometheus must be a table"),
                           ('[prometheus]\ndeny = ["a b"]\n', "prometheus.deny: 'a b' is not a metric name")]:
        path.write_text(text)
        with pytest.raises(UsageError, match=fragment):
            load_config(path, ["host"])


def test_every_family_is_listed_with_type_unit_and_help():
    families = exported_families()
    names = [info.name for info in families]
    assert len(names) == len(set(names)) > 60
    assert all(info.type in ("gauge", "counter", "histogram") and info.help for info in families)
    by_name = {info.name: info for info in families}
    assert by_name["tpu_tools_libtpu_hlo_execution_time_seconds"].type == "histogram"
    assert by_name["tpu_tools_gpu_energy_joules_total"].unit == "joules"
    assert by_name["tpu_tools_process_steps_total"].type == "counter"
    assert by_name["tpu_tools_group_error"].group == "every group"
    assert unit_of("tpu_tools_libtpu_tcp_delivery_rate_bytes_per_second") == "bytes_per_second"
    # the listed families follow the naming rules (the patterns aside)
    checked = [info for info in families if "<" not in info.name]
    assert all(naming.NAME.match(info.name) for info in checked)


def test_usage_errors_are_one_line_exit_2():
    for args, fragment in [(["--allow-metric", "tpu_tools_gpu_*", "--count", "1"], "only make sense with"),
                           (["--deny-metric", "bad name", "--list-metrics"], "is not a metric name or glob")]:
        result = run_tool("tpu-monitor", *args)
        assert result.returncode == 2
        assert fragment in result.stderr
        assert len(result.stderr.splitlines()) == 1


def test_list_metrics_names_every_family_and_whether_it_is_served(rundir):  # noqa: F811
    result = run_tool("tpu-monitor", "--list-metrics", "--deny-metric", "tpu_tools_gpu_*", env=agent_env(rundir))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "tpu-tools/list-metrics/v1"
    assert "sources" in document
    served = {family["name"]: family["served"] for family in document["families"]}
    assert served["tpu_tools_gpu_up"] is False
    assert served["tpu_tools_host_cpu_percent"] is True
    assert set(document["families"][0]) == {"name", "type", "unit", "help", "group", "served"}


def test_the_exporter_serves_what_the_lists_allow(rundir, tmp_path):  # noqa: F811
    config = tmp_path / "monitor.toml"
    config.write_text('[prometheus]\nallow = ["tpu_tools_host_*"]\n')
    port = _free_port()
    command = [*tool_command("tpu-monitor"), "--config", str(config), "--prometheus", str(port), "--quiet",
               "--period", "0.2", "--deny-metric", "tpu_tools_host_load_average"]
    process = subprocess.Popen(command, env=agent_env(rundir), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        text = wait_for(lambda: _safe_scrape(port), timeout=30)
        names = {family.name for family in text_string_to_metric_families(text)}
        # the file's allow list and the command line's deny list: the host's families but its load average
        assert "tpu_tools_host_cpu_percent" in names
        assert "tpu_tools_host_memory_total_bytes" in names
        assert not names & {"tpu_tools_host_load_average", "tpu_tools_group_error", "tpu_tools_device_holder_processes"}
    finally:
        process.terminate()
        process.wait(timeout=20)
