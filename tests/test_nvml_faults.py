"""GPU fault telemetry on the stand-in NVML: XID events as they arrive (and a storm of them), PCIe replays
and a degraded link, NVLink errors and a link down, the fan; in the report, tpu-ls --json and Prometheus."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import sysroot
from agentjobs import rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import TESTS, run_tool, tool_command
from fakenvml import nvml_env
from prometheus_client.parser import text_string_to_metric_families
from test_exporter_exposition import check
from test_monitor_cli import _free_port, _safe_scrape

# The last of the three XID events: its report holds all three (an earlier one may hold two).
EVERY_XID = r'^tpu_tools_gpu_xid_errors_total\{[^}]*code="79"[^}]*gpu="0"[^}]*\} 2\.0$'
FAULTS = {"FAKE_NVML_XID": "0:79,1:13,0:79", "FAKE_NVML_PCIE_WIDTH": "0:8", "FAKE_NVML_REPLAYS": "0:7",
          "FAKE_NVML_NVLINK_DOWN": "1:3"}


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset((k, v) for k, v in s.labels.items() if k in ("gpu", "code", "link"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_faults_reach_prometheus_and_pass_promtool(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    env = nvml_env(fake_nvml_dir, root, TPU_TOOLS_RUNTIME_DIR=str(rundir), **FAULTS)
    result = subprocess.run([sys.executable, str(TESTS / "exposition_once.py"), "--until", EVERY_XID], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    check(result.stdout)
    samples = _samples(result.stdout)
    gpu0, gpu1 = frozenset({("gpu", "0")}), frozenset({("gpu", "1")})
    assert samples[("tpu_tools_gpu_xid_errors_total", gpu0 | {("code", "79")})] == 2
    assert samples[("tpu_tools_gpu_xid_errors_total", gpu1 | {("code", "13")})] == 1
    (last,) = [s for f in text_string_to_metric_families(result.stdout) for s in f.samples
               if s.name == "tpu_tools_gpu_xid_last_event_timestamp_seconds" and s.labels["gpu"] == "0"]
    assert last.labels["code"] == "79"
    assert "fallen off the bus" in last.labels["description"]
    assert last.value > 0
    assert samples[("tpu_tools_gpu_pcie_link_width", gpu0)] == 8
    assert samples[("tpu_tools_gpu_pcie_link_width_max", gpu0)] == 16
    assert samples[("tpu_tools_gpu_pcie_replay_errors_total", gpu0)] == 7
    assert samples[("tpu_tools_gpu_nvlink_link_down", gpu1 | {("link", "3")})] == 1
    assert (samples[("tpu_tools_gpu_nvlink_links_active", gpu1)], samples[("tpu_tools_gpu_nvlink_links", gpu1)]) == (
        17, 18)
    assert samples[("tpu_tools_gpu_nvlink_recovery_errors_total", gpu1)] == 2 * 18
    assert samples[("tpu_tools_gpu_fan_speed_ratio", gpu0)] == 0.45


def test_tpu_ls_json_has_the_link_and_fan_figures(fake_nvml_dir, tmp_path):
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    result = run_tool("tpu-ls", "--json", env=nvml_env(fake_nvml_dir, root, **FAULTS), timeout=60)
    assert result.returncode == 0, result.stderr
    first, second = json.loads(result.stdout)["nvml"]["gpus"]
    assert (first["pcie_link_width"], first["pcie_replay_errors"], first["fan_speed_percent"]) == (8, 7, 45)
    assert second["nvlink_links_down"] == [3]
    assert second["nvlink_crc_errors"] == 0
    assert first["xid_errors"] is None  # tpu-ls reads once: events are the monitor's


def test_an_xid_storm_is_counted_and_every_scrape_answers(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    env = nvml_env(fake_nvml_dir, root, TPU_TOOLS_RUNTIME_DIR=str(rundir), FAKE_NVML_XID_STORM="10000")
    port = _free_port()
    monitor = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", str(port), "--quiet", "--period",
                                "0.3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    storm = ("tpu_tools_gpu_xid_errors_total", frozenset({("gpu", "0"), ("code", "13")}))
    try:
        first = wait_for(lambda: _samples(_safe_scrape(port)).get(storm), timeout=30)
        later = wait_for(lambda: (lambda n: n if n and n > first + 1000 else None)(
            _samples(_safe_scrape(port)).get(storm)), timeout=30)
        assert later > first
        for _ in range(20):  # scrapes keep answering, whole, while events pour in
            text = _safe_scrape(port)
            # whole: every group's error line, the last family, to its final newline
            assert 'tpu_tools_group_error{group="amdsmi"} 0.0\n' in text, text[-200:]
            assert re.search(r'tpu_tools_group_error\{group="\w+"\} [01]\.0\n\Z', text), text[-200:]
        monitor.send_signal(signal.SIGTERM)
        _out, err = monitor.communicate(timeout=20)
        assert monitor.returncode == 0
        assert err == ""
    finally:
        monitor.kill()
        monitor.wait(timeout=10)


def test_tpu_ls_verbose_shows_a_gpu_health_table(fake_nvml_dir, tmp_path):
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    result = run_tool("tpu-ls", "-v", "--no-runtime", env=nvml_env(fake_nvml_dir, root, **FAULTS), timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[-2:]}
    assert "x8/16 (!)" in rows["0"]
    assert " 7 " in rows["0"]
    assert "45%" in rows["0"]
    assert "17/18 down: 3" in rows["1"]
    assert "PCIE WIDTH" not in run_tool("tpu-ls", "--no-runtime", env=nvml_env(fake_nvml_dir, root), timeout=60).stdout


def test_mig_instances_reach_the_report_and_prometheus(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    env = nvml_env(fake_nvml_dir, root, TPU_TOOLS_RUNTIME_DIR=str(rundir), FAKE_NVML_MIG="1:3")
    result = subprocess.run([sys.executable, str(TESTS / "exposition_once.py")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    check(result.stdout)
    used = {s.labels["gpu_instance"]: s.value for f in text_string_to_metric_families(result.stdout)
            for s in f.samples if s.name == "tpu_tools_gpu_mig_instance_memory_used_bytes"}
    assert used == {"1": 1 << 30, "2": 2 << 30, "3": 3 << 30}
    listing = run_tool("tpu-ls", "-v", "--no-runtime", env=env, timeout=60)
    assert "on, 3 instances" in listing.stdout.splitlines()[-1]


def test_mig_instances_that_come_and_go_between_reads_never_fail_a_report(fake_nvml_dir, tmp_path, rundir):  # noqa: F811
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    env = nvml_env(fake_nvml_dir, root, TPU_TOOLS_RUNTIME_DIR=str(rundir), FAKE_NVML_MIG="0:7",
                   FAKE_NVML_MIG_FLAP="1")
    result = run_tool("tpu-monitor", "--count", "4", "--period", "0.2", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        group = json.loads(line)["nvml"]
        assert group["error"] is None
        gpu = group["gpus"][0]
        assert gpu["status"] == "ok"
        assert gpu["mig_enabled"] is True
        assert len(gpu["mig_instances"]) < 7  # some were gone when asked
        assert all(i["memory_total_bytes"] == 10 << 30 for i in gpu["mig_instances"])
