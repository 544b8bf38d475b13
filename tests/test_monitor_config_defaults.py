"""`tpu-monitor --config FILE`: each key of the file is the default of its option, which the command line overrides.

The file is read before the other options (click's default_map), so what the command parses is checked here for
every kind of value the file carries (durations, a regular expression, addresses, a price, glob lists); the
groups, which have no option, and a whole run are checked against the real program.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentjobs import agent_env
from click.core import ParameterSource
from conftest import DEFAULT_METRICS_ADDR, assert_one_line_error, run_tool

from tpu_tools.cli.monitor import monitor_command

# (the file's text, the option's parameter, its value from the file, the command line, its value from there)
CASES = [
    ('period = "300ms"\n', "period", 0.3, ["--period", "2s"], 2.0),
    ("agent_timeout = 4\n", "agent_timeout", 4.0, ["--agent-timeout", "500ms"], 0.5),
    ('metrics_timeout = "500ms"\n', "metrics_timeout_s", 0.5, ["--metrics-timeout", "3"], 3.0),
    ('tag_filter = "^train"\n', "tag_filter", "^train", ["--tag-filter", "eval$"], "eval$"),
    ('metrics_addr = ["localhost:8432", "9000"]\n', "metrics_addr", ("localhost:8432", "localhost:9000"),
     ["--metrics-addr", "127.0.0.1:8500"], ("127.0.0.1:8500",)),
    ("price_per_hour = 4.2\n", "price_per_hour", 4.2, ["--price-per-hour", "1.5"], 1.5),
    ('[prometheus]\nallow = ["tpu_tools_device_*", "tpu_tools_gpu_*"]\n', "allow_metrics",
     ("tpu_tools_device_*", "tpu_tools_gpu_*"), ["--allow-metric", "tpu_tools_host_*"], ("tpu_tools_host_*",)),
    ('[prometheus]\ndeny = ["tpu_tools_gpu_process_*"]\n', "deny_metrics", ("tpu_tools_gpu_process_*",),
     ["--deny-metric", "tpu_tools_libtpu_*"], ("tpu_tools_libtpu_*",)),
]


def _parsed(path: Path, *args: str) -> tuple[dict[str, Any], Any]:
    context = monitor_command.make_context("tpu-monitor", ["--config", str(path), *args])
    return context.params, context.get_parameter_source


def _plain(value: Any) -> Any:
    return value.pattern if hasattr(value, "pattern") else value


@pytest.mark.parametrize(("text", "name", "from_file", "args", "from_command_line"), CASES,
                         ids=[case[1] for case in CASES])
def test_a_config_value_is_the_option_default_and_the_command_line_wins(tmp_path, text, name, from_file, args,
                                                                        from_command_line):
    path = tmp_path / "monitor.toml"
    path.write_text(text)
    params, source = _parsed(path)
    assert _plain(params[name]) == from_file
    assert source(name) is ParameterSource.DEFAULT_MAP
    params, source = _parsed(path, *args)
    assert _plain(params[name]) == from_command_line
    assert source(name) is ParameterSource.COMMANDLINE
    # without the file, the option's own default
    plain = monitor_command.make_context("tpu-monitor", [])
    assert _plain(plain.params[name]) != from_file


def test_the_same_file_in_json_gives_the_same_defaults(tmp_path):
    path = tmp_path / "monitor.json"
    path.write_text(json.dumps({"period": 0.5, "tag_filter": "^t", "prometheus": {"deny": "tpu_tools_host_*"}}))
    params, _ = _parsed(path)
    assert params["period"] == 0.5
    assert params["tag_filter"].pattern == "^t"
    assert params["deny_metrics"] == ("tpu_tools_host_*",)


def test_the_groups_have_no_option_and_stay_the_files(tmp_path):
    path = tmp_path / "monitor.toml"
    path.write_text('[groups.host]\nperiod = "5s"\n[groups.devices]\n')
    config = _parsed(path)[0]["config"]
    assert list(config.groups) == ["host", "devices"]
    assert config.groups["host"].period_s == 5.0


def test_a_whole_run_takes_every_key_and_the_lists_need_no_prometheus(tmp_path):
    # The [prometheus] lists are defaults of --allow-metric and --deny-metric: in a file read without --prometheus
    # they are no mistake, as a list given on the command line would be.
    path = tmp_path / "monitor.toml"
    path.write_text(f'period = "200ms"\ntag_filter = "^none$"\nagent_timeout = "500ms"\n'
                    f'metrics_addr = "{DEFAULT_METRICS_ADDR}"\nmetrics_timeout = "200ms"\nprice_per_hour = 2\n'
                    '[prometheus]\nallow = ["tpu_tools_host_*"]\n[groups.host]\n[groups.processes]\n')
    env = agent_env(tmp_path)
    result = run_tool("tpu-monitor", "--config", str(path), "--count", "2", env=env)
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 2
    assert all(report["processes"]["period_s"] == 0.2 for report in reports)
    assert {"host", "processes"} <= set(reports[0])
    assert "devices" not in reports[0]
    # given on the command line without --prometheus, a list is still a usage error
    result = run_tool("tpu-monitor", "--config", str(path), "--count", "1", "--allow-metric", "tpu_tools_host_*",
                      env=env)
    assert_one_line_error(result, 2, "--allow-metric and --deny-metric only make sense with --prometheus")


def test_a_bad_file_is_refused_whatever_option_comes_first(tmp_path):
    path = tmp_path / "monitor.toml"
    path.write_text('period = "soon"\n')
    result = run_tool("tpu-monitor", "--period", "1s", "--config", str(path), "--count", "1",
                      env=agent_env(tmp_path))
    message = assert_one_line_error(result, 2, str(path))
    assert "period" in message
    assert result.stdout == ""
