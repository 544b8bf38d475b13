"""The exporter's whole output on every fixture host: `promtool check metrics` passes and the naming rules hold.

Each host is the real report of a fixture (sysfs tree, libtpu's metrics service, the stand-in NVML and amdsmi
libraries, a real agent job), exported by the real collector in a child process (tests/exposition_once.py).
"""

from __future__ import annotations

import http.client
import math
import subprocess
import sys
from pathlib import Path

import pytest
import sysroot
from agentjobs import agent_env, rundir, start_job  # noqa: F401 (rundir is a fixture)
from conftest import TESTS, as_report
from fakeamdsmi import amdsmi_env
from fakenvml import nvml_env
from libtpu_server import FIXTURES, FakeMetricsService
from programs import require_program
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from promstack import needs_promtool

from tpu_tools.exporter import naming
from tpu_tools.exporter.families import exported_families
from tpu_tools.exporter.prometheus import ReportCollector, host_metrics, serve
from tpu_tools.exporter.webconfig import WebConfig
from tpu_tools.exporter.webserver import serve_secure
from tpu_tools.metrics.libtpu.distribution import DistributionSummary
from tpu_tools.metrics.libtpu.export import MEGABIT_PER_SECOND, MICROSECOND, histogram
from tpu_tools.metrics.samplefamilies import histogram_families

SYSROOT_HOSTS = {"v4": sysroot.v4_host, "v5e": sysroot.v5e_host, "v5p": sysroot.v5p_host, "v6e": sysroot.v6e_host,
                 "tpu7x": sysroot.tpu7x_host}


def exposition(env: dict[str, str], *addresses: str) -> str:
    result = subprocess.run([sys.executable, str(TESTS / "exposition_once.py"), *addresses], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def check(text: str) -> set[str]:
    """promtool's verdict and the naming rules on a whole exposition; returns the family names. Skips the test
    where promtool is not installed (tools/test.sh installs it), as the tests marked `needs_promtool` are."""
    promtool = require_program("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == "", checked.stdout + checked.stderr
    families = list(text_string_to_metric_families(text))
    assert naming.problems(families) == []
    # every family served is in --list-metrics' list (drawn from the exporters' code)
    listed = {info.name for info in exported_families()}
    assert {f.name + ("_total" if f.type == "counter" else "") for f in families} <= listed
    return {family.name for family in families}


@needs_promtool
@pytest.mark.parametrize("generation", sorted(SYSROOT_HOSTS))
def test_tpu_hosts_pass_promtool(generation, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    SYSROOT_HOSTS[generation](root, holders={3001: [0]})
    with FakeMetricsService(FIXTURES[generation]()) as service:
        text = exposition(agent_env(rundir, TPU_TOOLS_SYSROOT=str(root)), service.address)
    names = check(text)
    assert {"tpu_tools_libtpu_up", "tpu_tools_device_memory_used_bytes", "tpu_tools_device_holder_processes"} <= names
    assert "tpu_tools_libtpu_hlo_execution_time_seconds" in names or generation == "tpu7x"  # its libtpu has none
    assert not any(name.endswith(("_us", "_mbps", "_samples")) for name in names)
    assert "tpu_tools_gpu_up" not in names
    assert "tpu_tools_agent_up" not in names  # no family without samples


@needs_promtool
def test_v5p_distributions_are_histograms_in_base_units(tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.v5p_host(root)
    with FakeMetricsService(FIXTURES["v5p"]()) as service:
        text = exposition(agent_env(rundir, TPU_TOOLS_SYSROOT=str(root)), service.address)
    check(text)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in ("tpu_tools_libtpu_transfer_latency_seconds", "tpu_tools_libtpu_tcp_delivery_rate_bytes_per_second",
                 "tpu_tools_libtpu_hlo_execution_time_seconds"):
        family = families[name]
        assert family.type == "histogram"
        counts = [s for s in family.samples if s.name.endswith("_count")]
        assert counts, name
        assert any(s.value > 0 for s in counts), name
        assert {s.name for s in family.samples} == {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    # libtpu's HLO layout is 1 us .. 1 s doubling: its bounds, in seconds
    bounds = {s.labels["le"] for s in families["tpu_tools_libtpu_hlo_execution_time_seconds"].samples
              if s.name.endswith("_bucket")}
    assert {"1e-06", "2e-06", "0.524288", "+Inf"} <= bounds


@needs_promtool
def test_nvidia_host_passes_promtool_with_one_name_per_figure(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.nvidia_host(root).process(sysroot.FakeProcess(4574, 1000, ["python3", "torchjob.py"], []))
    env = nvml_env(fake_nvml_dir, root, FAKE_NVML_PROCS="0:4574:12190000000", FAKE_NVML_LOST="1",
                   TPU_TOOLS_RUNTIME_DIR=str(rundir))
    text = exposition(env)
    names = check(text)
    assert {"tpu_tools_gpu_up", "tpu_tools_gpu_sm_clock_hertz", "tpu_tools_gpu_energy_joules",
            "tpu_tools_device_utilization_ratio", "tpu_tools_device_memory_used_bytes"} <= names
    # each GPU figure once: the devices group's memory and utilization, the GPU group's own figures
    assert not {"tpu_tools_gpu_utilization_ratio", "tpu_tools_gpu_memory_used_bytes",
                "tpu_tools_gpu_memory_total_bytes", "tpu_tools_device_clock_sm_hz", "tpu_tools_device_energy_joules",
                "tpu_tools_device_temperature_celsius", "tpu_tools_device_utilization_percent",
                "tpu_tools_device_power_draw_watts"} & names
    assert 'tpu_tools_gpu_temperature_celsius{device="gpu:0",gpu="0"' in text  # joins the device series


@needs_promtool
def test_amd_host_passes_promtool(fake_amdsmi_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.amd_host(root).process(sysroot.FakeProcess(4574, 1000, ["python3", "train.py"], ["/dev/kfd"]))
    env = amdsmi_env(fake_amdsmi_dir, root, FAKE_AMDSMI_PROCS="0:4574:61203283968", TPU_TOOLS_RUNTIME_DIR=str(rundir))
    names = check(exposition(env))
    assert {"tpu_tools_gpu_up", "tpu_tools_device_utilization_ratio"} <= names


@needs_promtool
def test_cpu_host_with_an_agent_job_passes_promtool(tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.empty_host(root)
    job = start_job(rundir, tag="checked", light=True, launcher=False).wait_ready()
    try:
        names = check(exposition(agent_env(rundir, TPU_TOOLS_SYSROOT=str(root))))
    finally:
        job.stop()
    assert {"tpu_tools_agent_up", "tpu_tools_process_rss_bytes", "tpu_tools_process_steps",
            "tpu_tools_host_memory_total_bytes", "tpu_tools_group_error"} <= names


def test_the_naming_rules_catch_what_they_are_for():
    def gauge(name: str, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, "help", labels=list(labels or {}))
        family.add_metric(list((labels or {}).values()), 1.0)
        return family

    assert naming.problems([gauge("tpu_tools_gpu_clock_sm_hz")]) == [
        "tpu_tools_gpu_clock_sm_hz: an abbreviated unit; convert the figure to base units"]
    assert naming.problems([gauge("tpu_tools_link_rate_mbps")])
    assert naming.problems([gauge("tpu_tools_latency_us", {"quantile": "0.5"})]) == [
        "tpu_tools_latency_us: an abbreviated unit; convert the figure to base units",
        "tpu_tools_latency_us: label 'quantile' belongs to histograms and summaries only"]
    assert naming.problems([gauge("tpu_tools_goodput_percent")]) == [
        "tpu_tools_goodput_percent: a share is a _ratio from 0 to 1, not a percent"]
    assert naming.problems([gauge("tpu_tools_errors_total")])
    assert naming.problems([gauge("node_cpu_ratio")])
    assert naming.problems([GaugeMetricFamily("tpu_tools_empty_bytes", "help", labels=["a"])]) == [
        "tpu_tools_empty_bytes: a family without samples"]
    assert naming.problems([gauge("tpu_tools_a_bytes"), gauge("tpu_tools_a_bytes")]) == [
        "tpu_tools_a_bytes: served twice"]
    counter = CounterMetricFamily("tpu_tools_link_errors", "help", value=3)
    latency = HistogramMetricFamily("tpu_tools_link_latency_seconds", "help", buckets=[("+Inf", 1)], sum_value=0.1)
    assert naming.problems([counter, latency, gauge("tpu_tools_ici_link_up", {"link": "0"})]) == []


def test_a_distribution_becomes_cumulative_buckets_in_base_units():
    summary = DistributionSummary(count=6, mean=3.0, buckets=((1.0, 1), (2.0, 0), (4.0, 3), (math.inf, 2)))
    sample = histogram("transfer_latency_seconds", "h", {"address": "a"}, summary, MICROSECOND)
    assert sample.buckets == ((1e-6, 1), (2e-6, 1), (4e-6, 4), (math.inf, 6))
    assert sample.sum == pytest.approx(18e-6)
    [family] = histogram_families([sample])
    assert [(s.labels.get("le"), s.value) for s in family.samples][-3:] == [("+Inf", 6.0), (None, 6.0), (None, 18e-6)]
    # a layout that could not be read: the count and sum stay, in the +Inf bucket alone
    unreadable = histogram("tcp_delivery_rate_bytes_per_second", "h", {}, DistributionSummary(count=4, mean=8.0),
                           MEGABIT_PER_SECOND)
    assert unreadable.buckets == ((math.inf, 4),)
    assert unreadable.sum == pytest.approx(4 * 8.0 * 125000)
    empty = histogram("hlo_execution_time_seconds", "h", {}, DistributionSummary(count=0), MICROSECOND)
    assert empty.buckets == ((math.inf, 0),)
    assert empty.sum == 0.0
    assert Path(TESTS / "exposition_once.py").is_file()


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "web-config"])
def test_head_answers_like_get_without_the_body(secure):
    collector = ReportCollector({"host": host_metrics})
    collector.update(as_report({"host": {"error": None, "cpu_percent": 12.5, "memory_total_bytes": 1 << 30}}))
    server = serve_secure(collector, "127.0.0.1", 0, WebConfig()) if secure else serve(collector, "127.0.0.1", 0)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        connection.request("GET", "/metrics")
        got = connection.getresponse()
        body = got.read()
        connection.request("HEAD", "/metrics")
        head = connection.getresponse()
        assert head.read() == b""
        assert head.status == got.status == 200
        assert head.getheader("Content-Type") == got.getheader("Content-Type")
        assert int(head.getheader("Content-Length")) == len(body)
        assert b"tpu_tools_host_cpu_percent 12.5" in body
        connection.close()
    finally:
        server.shutdown()
        server.server_close()
