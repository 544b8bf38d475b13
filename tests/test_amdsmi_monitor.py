"""amdsmi in tpu-monitor (report and Prometheus) and tpu-top, on the fake libamd_smi.so."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import sysroot
from agentjobs import wait_for
from conftest import run_tool, tool_command
from fakeamdsmi import amdsmi_env
from test_nvml_monitor import _free_port, _samples, _scrape

MIB = 1024 * 1024
BUSY_USED = 58122 * MIB


@pytest.fixture
def amd_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    host = sysroot.amd_host(root)
    host.process(sysroot.FakeProcess(4574, 1000, ["python3", "train.py", "--steps", "80"], ["/dev/kfd"]))
    return root


def test_monitor_reports_the_amd_gpus_and_places_them_by_pci_bus_id(fake_amdsmi_dir, amd_root):
    env = amdsmi_env(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_PROCS="0:4574:61203283968")
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    group = report["amdsmi"]
    assert group["error"] is None
    assert group["source"] == "amdsmi"
    assert group["driver_version"] == "6.12.12"
    assert list(group) == ["period_s", "sampled_at", "error", "available", "driver_version", "elapsed_ms", "gpus",
                           "source", "bindings_version", "notes"]  # amdsmi's versions in place of NVML's
    busy, idle = group["gpus"]
    assert (busy["device_key"], idle["device_key"]) == ("gpu:0", "gpu:1")
    assert busy["processes"][0]["pid"] == 4574
    assert busy["processes"][0]["tag"] is None
    devices = {d["key"]: d for d in report["devices"]["devices"]}
    gpu0 = devices["gpu:0"]
    assert gpu0["memory_used_bytes"] == BUSY_USED
    assert gpu0["utilization_percent"] == 91
    assert gpu0["sources"] == ["discovery", "amdsmi"]
    assert gpu0["extra"]["gpu_name"] == "Instinct MI300X"
    assert gpu0["extra"]["power_draw_watts"] == 612
    assert gpu0["extra"]["temperature_celsius"] == 61
    assert gpu0["extra"]["gpu_status"] == "ok"
    # on a host without NVIDIA GPUs, NVML's absence is a note, not an error
    assert report["nvml"]["error"] is None
    assert report["nvml"]["notes"]


def test_a_host_without_amd_gpus_has_no_amdsmi_error(tmp_path):
    root = tmp_path / "root"
    sysroot.v4_host(root)
    result = run_tool("tpu-monitor", "--count", "1", env=amdsmi_env(tmp_path / "nowhere", root), timeout=60)
    assert result.returncode == 0, result.stderr
    group = json.loads(result.stdout)["amdsmi"]
    assert group["error"] is None
    assert group["available"] is False
    assert "libamd_smi.so" in group["notes"][0]


def test_init_failure_on_an_amd_host_is_the_groups_error(fake_amdsmi_dir, amd_root):
    env = amdsmi_env(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_INIT="34")
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["amdsmi"]["error"] == "amdsmi is not available: the amdgpu driver is not loaded"
    assert report["devices"]["error"] is None


def test_prometheus_exports_the_gpu_series_with_a_vendor_label(fake_amdsmi_dir, amd_root):
    port = _free_port()
    env = amdsmi_env(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_PROCS="0:4574:61203283968")
    monitor = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", str(port), "--quiet", "--period", "0.5"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: (lambda t: t if "tpu_tools_gpu_process_memory_used_bytes{" in t else None)(
            _scrape(port)), timeout=30)
        samples = _samples(text)
        gpu0 = (("device", "gpu:0"), ("gpu", "0"), ("pci_bus_id", "0000:0c:00.0"),
                ("uuid", "e2ff74a1-0000-1000-8000-cd1234567801"), ("vendor", "amd"))
        device = {name: value for (name, labels), value in samples.items()
                  if name.startswith("tpu_tools_device_") and ("device", "gpu:0") in labels}
        assert device["tpu_tools_device_memory_used_bytes"] == BUSY_USED
        assert device["tpu_tools_device_utilization_ratio"] == 0.91
        assert samples[("tpu_tools_gpu_memory_utilization_ratio", gpu0)] == 0.44
        assert samples[("tpu_tools_gpu_temperature_celsius", gpu0)] == 61
        assert samples[("tpu_tools_gpu_power_draw_watts", gpu0)] == 612
        assert samples[("tpu_tools_gpu_power_limit_watts", gpu0)] == 750
        assert samples[("tpu_tools_gpu_energy_joules_total", gpu0)] == pytest.approx(123456789012 * 15.3e-6)
        assert samples[("tpu_tools_gpu_sm_clock_hertz", gpu0)] == 2.1e9
        assert samples[("tpu_tools_gpu_up", tuple(sorted((*gpu0, ("status", "ok")))))] == 1
        process = tuple(sorted((*gpu0, ("pid", "4574"), ("tag", ""))))
        assert samples[("tpu_tools_gpu_process_memory_used_bytes", process)] == 61203283968
        assert samples[("tpu_tools_group_error", (("group", "amdsmi"),))] == 0
        assert text.count("# TYPE tpu_tools_gpu_up ") == 1  # one family, whichever groups export it
        monitor.send_signal(signal.SIGTERM)
        _out, err = monitor.communicate(timeout=20)
        assert monitor.returncode == 0
        assert err == ""
    finally:
        monitor.kill()
        monitor.wait(timeout=10)


def test_top_once_shows_the_amd_gpus_and_their_processes(fake_amdsmi_dir, amd_root):
    env = amdsmi_env(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_PROCS="0:4574:61203283968,1:999999:1048576")
    result = run_tool("tpu-top", "--once", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    gpu0 = next(line for line in lines if line.lstrip().startswith("gpu:0"))
    assert "Instinct MI" in gpu0
    assert "56.8 GiB / 192.0 GiB" in gpu0
    assert "91.0" in gpu0  # the name column is narrow
    assert gpu0.split()[-4:] == ["61C", "612W", "4574", "python3"]
    job = next(line for line in lines if line.split()[:1] == ["4574"])
    assert "57.0G" in job
    assert "python3 train.py --steps 80" in job
    hidden = next(line for line in lines if line.split()[:1] == ["999999"])
    assert "(other PID namespace)" in hidden


def test_a_hung_amd_gpu_costs_each_round_the_deadline_only(fake_amdsmi_dir, amd_root):
    env = amdsmi_env(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_HANG="1")
    result = run_tool("tpu-monitor", "--count", "3", "--period", "0.2", "--metrics-timeout", "0.5", env=env,
                      timeout=60)  # the hang guard
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 3
    for report in reports:
        answering, hung = report["amdsmi"]["gpus"]
        assert answering["status"] == "ok"
        assert hung["status"] == "not_answering"
        devices = {d["key"]: d for d in report["devices"]["devices"]}
        assert devices["gpu:1"]["extra"]["gpu_status"] == "not_answering"


@pytest.fixture
def both_vendors(tmp_path: Path) -> Path:
    """The two H100s of the fake NVML and the two MI300Xs of the fake amdsmi on one host."""
    root = tmp_path / "root"
    host = sysroot.nvidia_host(root)
    for i, address in enumerate(("0000:0c:00.0", "0000:22:00.0")):
        host.function(sysroot.FakeFunction(address, sysroot.AMD, "0x74a1", "0x038000", render_index=128 + 8 * i))
    host.node("/dev/kfd")
    return root


def test_a_host_with_both_vendors_lists_both_and_exports_one_family_per_name(fake_amdsmi_dir, fake_nvml_dir,
                                                                            both_vendors):
    env = amdsmi_env(fake_amdsmi_dir, both_vendors, TPU_TOOLS_NVML=None, LD_LIBRARY_PATH=str(fake_nvml_dir))
    listing = run_tool("tpu-ls", env=env, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "NVIDIA driver 580.159.04" in listing.stdout
    assert "AMD GPU driver (amdgpu) 6.12.12" in listing.stdout
    assert "H100" in listing.stdout
    assert "AMD Instinct MI300X" in listing.stdout
    port = _free_port()
    monitor = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", str(port), "--quiet", "--period", "0.5"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: (lambda t: t if 'vendor="amd"' in t else None)(_scrape(port)), timeout=30)
        assert text.count("# TYPE tpu_tools_gpu_memory_free_bytes gauge") == 1
        free = {labels: value for (name, labels), value in _samples(text).items()
                if name == "tpu_tools_gpu_memory_free_bytes"}
        by_bus = {dict(labels)["pci_bus_id"]: (dict(labels).get("vendor"), dict(labels)["device"])
                  for labels in free}
        assert by_bus["0000:18:00.0"] == (None, "gpu:1")  # NVML's series keep their labels
        assert by_bus["0000:0c:00.0"] == ("amd", "gpu:0")
        report_devices = json.loads(run_tool("tpu-monitor", "--count", "1", env=env, timeout=60).stdout)["devices"]
        sources = {d["key"]: d["sources"] for d in report_devices["devices"]}
        assert sources == {"gpu:0": ["discovery", "amdsmi"], "gpu:1": ["discovery", "nvml"],
                           "gpu:2": ["discovery", "amdsmi"], "gpu:3": ["discovery", "nvml"]}
    finally:
        monitor.kill()
        monitor.wait(timeout=10)
