"""The exporter's `tpu_tools_build_info` series and the process series' `command` label
(`tpu-monitor --prometheus --process-command-label`), on the real report of fixture hosts and a real agent job:
promtool passes the whole exposition as the other exposition tests check it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sysroot
from agentjobs import agent_env, rundir, start_job  # noqa: F401 (rundir is a fixture)
from conftest import TESTS, assert_one_line_error, run_tool
from fakenvml import nvml_env
from libtpu_server import FIXTURES, FakeMetricsService
from prometheus_client.parser import text_string_to_metric_families
from promstack import needs_promtool
from test_exporter_exposition import check

import tpu_tools
from tpu_tools.metrics.labeltext import MAX_LABEL_VALUE
from tpu_tools.versions import stack_versions


def exposition(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, str(TESTS / "exposition_once.py"), *args], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


@needs_promtool
def test_build_info_of_a_cpu_host_names_this_stack(tmp_path, rundir):  # noqa: F811
    sysroot.empty_host(tmp_path)
    text = exposition(agent_env(rundir, TPU_TOOLS_SYSROOT=str(tmp_path)))
    check(text)
    (info,) = samples(text, "tpu_tools_build_info")
    versions = stack_versions()
    assert info.value == 1.0
    assert info.labels == {"version": tpu_tools.__version__, "jax": versions.jax, "jaxlib": versions.jaxlib,
                           "libtpu": "", "driver": "", "platform": "cpu", "accelerator_type": ""}


@needs_promtool
def test_build_info_of_a_tpu_vm_names_its_platform_and_accelerator_type(tmp_path, rundir):  # noqa: F811
    _, environment = sysroot.tpu_vm(tmp_path, "v5e")
    with FakeMetricsService(FIXTURES["v5e"]()) as service:
        text = exposition(agent_env(rundir, TPU_TOOLS_SYSROOT=str(tmp_path), **environment), service.address)
    check(text)
    (info,) = samples(text, "tpu_tools_build_info")
    assert info.labels["platform"] == "tpu"
    assert info.labels["accelerator_type"] == "v5litepod-16"


@needs_promtool
def test_build_info_of_a_gpu_host_names_the_driver(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    sysroot.nvidia_host(tmp_path)
    text = exposition(nvml_env(fake_nvml_dir, tmp_path, TPU_TOOLS_RUNTIME_DIR=str(rundir)))
    check(text)
    (info,) = samples(text, "tpu_tools_build_info")
    assert info.labels["driver"] == "580.159.04"
    assert info.labels["platform"] == "cuda"
    assert info.labels["accelerator_type"] == "NVIDIA H100 80GB HBM3"


@needs_promtool
def test_the_command_label_is_asked_for_cut_and_printable(tmp_path, rundir):  # noqa: F811
    sysroot.empty_host(tmp_path)
    long_argument = "--out=" + "x" * 300
    job = start_job(rundir, tag="labelled", extra_args=("--note=a\x1bb", "two  spaces", long_argument)).wait_ready()
    try:
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(tmp_path))
        plain = exposition(env)
        labelled = exposition(env, "--process-command-label")
    finally:
        job.stop()
    check(plain)
    check(labelled)
    (up,) = samples(plain, "tpu_tools_agent_up")
    assert "command" not in up.labels  # off by default: it multiplies series
    for name in ("tpu_tools_agent_up", "tpu_tools_process_rss_bytes", "tpu_tools_process_steps_total"):
        (sample,) = samples(labelled, name)
        command = sample.labels["command"]
        assert sample.labels["tag"] == "labelled"
        assert "job.py" in command
        assert "--note=a?b two spaces --out=xxx" in command
        assert len(command) == MAX_LABEL_VALUE
        assert command.endswith("...")
        assert command.isprintable()


def test_the_command_label_needs_the_exporter():
    assert_one_line_error(run_tool("tpu-monitor", "--process-command-label", "--count", "1"), 2,
                          "--process-command-label only makes sense with --prometheus")


@pytest.mark.parametrize("command", ["python train.py", None, "a\tb\n\x00c"])
def test_command_label_values(command):
    from tpu_tools.exporter.processlabels import process_label_values, process_labels
    from tpu_tools.metrics.records.jobs import AgentEntry, PodOwner

    agent = AgentEntry(pid=7, tag="t", command=command, kubernetes=PodOwner(namespace="", pod="p"))
    labels = process_labels([agent], command=True)
    assert labels == ["pid", "tag", "command", "namespace", "pod", "container"]
    values = dict(zip(labels, process_label_values(agent, labels), strict=True))
    assert values["pod"] == "p"
    assert values["namespace"] == ""
    assert values["command"] == {"python train.py": "python train.py", None: "", "a\tb\n\x00c": "a b ?c"}[command]
