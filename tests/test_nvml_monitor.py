"""NVML in tpu-monitor (report and Prometheus) and tpu-top, on the fake libnvidia-ml.so.1."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
import sysroot
from agentjobs import rundir, start_job, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import run_tool, tool_command
from fakenvml import nvml_env

BUSY_USED = 64419069952


@pytest.fixture
def gpu_host(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    host = sysroot.nvidia_host(root)
    host.process(sysroot.FakeProcess(4574, 1000, ["python3", "torchjob.py", "80"], []))
    return root


def test_monitor_reports_every_figure_and_places_the_gpus_by_pci_bus_id(fake_nvml_dir, gpu_host):
    env = nvml_env(fake_nvml_dir, gpu_host, FAKE_NVML_PROCS="0:4574:12190000000", FAKE_NVML_LOST="1")
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    group = report["nvml"]
    assert group["error"] is None
    assert group["driver_version"] == "580.159.04"
    assert list(group) == ["period_s", "sampled_at", "error", "available", "driver_version", "nvml_version",
                           "cuda_driver_version", "elapsed_ms", "gpus", "notes"]
    busy, lost = group["gpus"]
    assert list(busy)[:3] == ["index", "status", "error"]
    assert list(busy)[-3:] == ["processes", "unsupported",
                                                                                   "device_key"]
    assert list(busy["processes"][0])[-2:] == ["tag", "slurm_job_id"]
    assert busy["device_key"] == "gpu:0"
    assert busy["pci_bus_id"] == "0000:18:00.0"
    assert busy["processes"][0]["pid"] == 4574
    assert busy["processes"][0]["command"] == "python3 torchjob.py 80"
    assert lost["status"] == "lost"
    devices = {d["key"]: d for d in report["devices"]["devices"]}
    gpu0 = devices["gpu:0"]
    assert gpu0["memory_used_bytes"] == BUSY_USED
    assert gpu0["memory_total_bytes"] == 85520809984
    assert gpu0["utilization_percent"] == 83
    assert gpu0["sources"] == ["discovery", "nvml"]
    assert gpu0["extra"]["temperature_celsius"] == 57
    assert gpu0["extra"]["power_draw_watts"] == pytest.approx(471.191)
    assert devices["gpu:1"]["extra"]["gpu_status"] == "lost"
    assert gpu0["name"] == devices["gpu:1"]["name"] == "NVIDIA H100 80GB HBM3"  # the driver's name, even when lost


def test_monitor_without_nvml_says_why_in_the_group_and_goes_on(gpu_host):
    env = nvml_env(gpu_host / "nowhere", gpu_host, TPU_TOOLS_NVML="0")
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "NVML reading is off" in report["nvml"]["error"]
    assert report["devices"]["error"] is None


def test_a_host_without_nvidia_gpus_has_no_nvml_error(tmp_path):
    root = tmp_path / "root"
    sysroot.v4_host(root)
    env = nvml_env(tmp_path / "nowhere", root, TPU_TOOLS_NVML="0")  # no NVML here, even on a host with one
    result = run_tool("tpu-monitor", "--count", "1", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    group = json.loads(result.stdout)["nvml"]
    assert group["error"] is None
    assert group["available"] is False
    assert group["gpus"] == []
    assert len(group["notes"]) == 1
    assert "NVML" in group["notes"][0]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, from the exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return response.read().decode()
    except OSError:
        return ""


def test_prometheus_names_follow_conventions_and_tag_the_agent_jobs_gpu_memory(fake_nvml_dir, gpu_host, request):
    runtime_dir = request.getfixturevalue("rundir")
    job = start_job(runtime_dir, tag="trainer", light=True, launcher=False).wait_ready()
    port = _free_port()
    # the fixture host's GPUs, the fake NVML's: not the sysfs of whatever host runs the suite
    env = nvml_env(fake_nvml_dir, gpu_host, TPU_TOOLS_RUNTIME_DIR=str(runtime_dir),
                   FAKE_NVML_PROCS=f"0:{job.pid}:61408000000;1:999999:1048576")
    monitor = subprocess.Popen([*tool_command("tpu-monitor"), "--prometheus", str(port), "--quiet", "--period", "0.5"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = wait_for(lambda: (lambda t: t if "tpu_tools_gpu_process_memory_used_bytes" in t else None)(
            _scrape(port)), timeout=30)
        samples = _samples(text)
        gpu0 = (("device", "gpu:0"), ("gpu", "0"), ("pci_bus_id", "0000:18:00.0"),
                ("uuid", "GPU-00000000-0000-0000-0000-000000000000"))
        # memory and utilization once, as the devices group's figures of every platform
        device = {name: value for (name, labels), value in samples.items()
                  if name.startswith("tpu_tools_device_") and ("device", "gpu:0") in labels}
        assert device["tpu_tools_device_memory_used_bytes"] == BUSY_USED
        assert device["tpu_tools_device_utilization_ratio"] == 0.83
        assert not any(name in ("tpu_tools_gpu_memory_used_bytes", "tpu_tools_gpu_utilization_ratio")
                       for name, _ in samples)
        held = tuple(sorted((*gpu0, ("tag", "trainer"))))  # the GPU's series name the job that holds it
        assert samples[("tpu_tools_gpu_temperature_celsius", held)] == 57
        assert samples[("tpu_tools_gpu_power_draw_watts", held)] == 471.191
        assert samples[("tpu_tools_gpu_energy_joules_total", held)] == 9423.69
        assert samples[("tpu_tools_gpu_sm_clock_hertz", held)] == 1.965e9
        assert samples[("tpu_tools_gpu_clock_event_reason", tuple(sorted((*held, ("reason", "sw_power_cap")))))] == 1
        assert samples[("tpu_tools_gpu_up", tuple(sorted((*held, ("status", "ok")))))] == 1
        process = tuple(sorted((*gpu0, ("pid", str(job.pid)), ("tag", "trainer"))))
        assert samples[("tpu_tools_gpu_process_memory_used_bytes", process)] == 61408000000
        assert samples[("tpu_tools_gpu_process_sm_utilization_ratio", process)] == 0.81
        hidden = [v for (name, labels), v in samples.items()
                  if name == "tpu_tools_gpu_process_memory_used_bytes" and ("pid", "999999") in labels]
        assert hidden == [1048576]
        assert any(name == "tpu_tools_gpu_nvlink_tx_bytes_total" for name, _ in samples)  # GPU 1 has NVLink
        assert samples[("tpu_tools_group_error", (("group", "nvml"),))] == 0
        monitor.send_signal(signal.SIGTERM)
        out, err = monitor.communicate(timeout=20)
        assert monitor.returncode == 0
        assert err == ""
    finally:
        monitor.kill()
        monitor.wait(timeout=10)
        job.stop()


def test_top_once_shows_the_cards_figures_and_every_gpu_process(fake_nvml_dir, gpu_host):
    env = nvml_env(fake_nvml_dir, gpu_host, FAKE_NVML_PROCS="0:4574:12190000000;0:999999:64409829376")
    result = run_tool("tpu-top", "--once", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    gpu0 = next(line for line in lines if line.lstrip().startswith("gpu:0"))
    assert "H100 80GB" in gpu0
    assert "60.0 GiB / 79.6 GiB" in gpu0
    assert "83.0" in gpu0
    assert "57C" in gpu0
    assert "471W" in gpu0
    assert "4574 python3" in gpu0
    torch = next(line for line in lines if line.split()[:1] == ["4574"])
    assert "11.4G" in torch
    assert "python3 torchjob.py 80" in torch
    hidden = next(line for line in lines if line.split()[:1] == ["999999"])
    assert "60.0G" in hidden
    assert "(other PID namespace)" in hidden


def test_a_gpu_whose_nvml_calls_hang_costs_each_round_the_deadline_only(fake_nvml_dir, gpu_host):
    env = nvml_env(fake_nvml_dir, gpu_host, FAKE_NVML_HANG="1")
    result = run_tool("tpu-monitor", "--count", "3", "--period", "0.2", "--metrics-timeout", "0.5", env=env,
                      timeout=60)  # the hang guard
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 3
    for report in reports:
        answering, hung = report["nvml"]["gpus"]
        assert answering["status"] == "ok"
        assert hung["status"] == "not_answering"
        devices = {d["key"]: d for d in report["devices"]["devices"]}
        assert devices["gpu:1"]["extra"]["gpu_status"] == "not_answering"  # placed on the bus id left over
