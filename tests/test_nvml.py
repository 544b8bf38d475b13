"""NVIDIA GPUs through NVML: the real nvidia-ml-py on a fake libnvidia-ml.so.1 serving an observed H100.

GPU 0 is the busy H100 of reference/observed-h100 (a JAX job), GPU 1 the idle one; the sysfs fixture
(tests/sysroot.py: nvidia_host) has the same two GPUs at the same PCI bus ids.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sysroot
from conftest import clean_env, run_tool
from fakenvml import nvml_env

from tpu_tools.metrics.nvml import decode

BUSY_USED_V2, BUSY_USED_V1, TOTAL = 64419069952, 64922386432, 85520809984
PROCS = "0:4573:61408000000;0:4574:12190000000;1:999999:1048576"


@pytest.fixture
def gpu_host(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    host = sysroot.nvidia_host(root, holders={4573: [1]})
    host.process(sysroot.FakeProcess(4574, 1000, ["python3", "torchjob.py", "80"], []))
    return root


def ls(library: Path, root: Path, *args: str, **switches: str | None):
    return run_tool("tpu-ls", *args, env=nvml_env(library, root, FAKE_NVML_PROCS=PROCS, **switches), timeout=60)


def ls_json(library: Path, root: Path, *args: str, **switches: str | None) -> dict:
    result = ls(library, root, "--json", *args, **switches)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_ls_shows_the_cards_figures_and_every_process_without_starting_the_runtime(fake_nvml_dir, gpu_host):
    # JAX_PLATFORMS unset: the platform left to JAX, as a plain `tpu-ls` leaves it, also where the suite pins the
    # CPU platform (a host with an accelerator plugin); the fixture host decides, and nothing opens a device
    document = ls_json(fake_nvml_dir, gpu_host, JAX_PLATFORMS=None)
    assert document["runtime_status"] == "skipped"
    assert document["runtime"] is None  # no CUDA context
    assert any("NVML lists the GPUs" in note for note in document["notes"])
    nvml = document["nvml"]
    assert nvml["available"]
    assert nvml["driver_version"] == "580.159.04"
    assert nvml["cuda_driver_version"] == "13.0"
    busy, idle = nvml["gpus"]
    assert (busy["memory_used_bytes"], busy["memory_total_bytes"], busy["memory_info_version"]) == \
        (BUSY_USED_V2, TOTAL, 2)
    assert busy["memory_reserved_bytes"] == 503316480
    assert (busy["utilization_gpu_percent"], busy["temperature_celsius"]) == (83, 57)
    assert busy["power_draw_watts"] == pytest.approx(471.191)
    assert busy["power_limit_watts"] == 700
    assert busy["energy_joules"] == pytest.approx(9423.69)
    assert busy["clock_sm_hz"] == 1965e6
    assert busy["clock_event_reasons"] == ["sw_power_cap"]
    assert idle["clock_event_reasons"] == ["gpu_idle"]
    assert busy["ecc_enabled"]
    assert busy["ecc_aggregate_uncorrected_errors"] == 0
    assert (busy["pcie_link_generation"], busy["pcie_link_width_max"]) == (5, 16)
    assert busy["nvlink_links"] is None
    assert "nvlink" in busy["unsupported"]  # a PCIe board
    assert idle["nvlink_links_active"] == 18
    assert idle["nvlink_tx_bytes_total"] == 123456789 * 1024
    # tied to passive discovery by PCI bus id
    chips = {chip["pci_address"]: chip["index"] for chip in document["chips"]}
    assert [g["pci_bus_id"] for g in nvml["gpus"]] == ["0000:18:00.0", "0000:38:00.0"]
    assert [g["chip_index"] for g in nvml["gpus"]] == [chips["0000:18:00.0"], chips["0000:38:00.0"]]
    jax_job, torch_job = busy["processes"]
    assert (jax_job["pid"], jax_job["gpu_memory_bytes"], jax_job["visible"]) == (4573, 61408000000, True)
    assert jax_job["command"] == "python -m serve"
    assert jax_job["user"] == "bob"
    assert jax_job["sm_utilization_percent"] == 81
    assert (torch_job["pid"], torch_job["command"]) == (4574, "python3 torchjob.py 80")
    hidden = idle["processes"][0]
    assert hidden["pid"] == 999999
    assert hidden["visible"] is False
    assert hidden["command"] is None


def test_ls_text_has_memory_utilization_temperature_power_and_processes(fake_nvml_dir, gpu_host):
    result = ls(fake_nvml_dir, gpu_host)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("GPU "))
    assert header.split()[:4] == ["GPU", "NAME", "MEMORY", "USED"]
    assert "TEMP" in header
    assert "POWER" in header
    row0 = next(line for line in lines if line.strip().startswith("0  NVIDIA H100"))
    assert "60.0 GiB / 79.6 GiB" in row0
    assert "83%" in row0
    assert "57 C" in row0
    assert "471 W / 700 W" in row0
    assert "4573 python -m serve 57.2 GiB" in row0
    assert "4574 python3 torchjob.py 80 11.4 GiB" in row0
    row1 = next(line for line in lines if line.strip().startswith("1  NVIDIA H100"))
    assert "999999 (other PID namespace)" in row1


def test_unsupported_fields_are_null_and_an_older_driver_falls_back_to_v1_memory(fake_nvml_dir, gpu_host):
    fail = "nvmlDeviceGetMemoryInfo_v2=13,nvmlDeviceGetPowerUsage=3,nvmlDeviceGetTemperature=3," \
           "nvmlDeviceGetCurrentClocksEventReasons=13,nvmlDeviceGetProcessUtilization=3"
    document = ls_json(fake_nvml_dir, gpu_host, FAKE_NVML_FAIL=fail)
    busy = document["nvml"]["gpus"][0]
    assert busy["status"] == "ok"
    assert (busy["memory_used_bytes"], busy["memory_info_version"]) == (BUSY_USED_V1, 1)
    assert busy["power_draw_watts"] is None
    assert busy["temperature_celsius"] is None
    assert busy["unsupported"]["memory_info_v2"] == "Function Not Found"
    assert busy["unsupported"]["power_draw"] == "Not Supported"
    assert busy["clock_event_reasons"] == ["sw_power_cap"]  # the older entry point answered
    assert busy["processes"][0]["sm_utilization_percent"] is None
    text = ls(fake_nvml_dir, gpu_host, FAKE_NVML_FAIL=fail)
    assert text.returncode == 0
    assert "Traceback" not in text.stderr
    row0 = next(line for line in text.stdout.splitlines() if line.strip().startswith("0  NVIDIA H100"))
    assert "60.5 GiB / 79.6 GiB" in row0
    assert " - " in row0


def test_a_lost_gpu_is_reported_and_the_other_shown(fake_nvml_dir, gpu_host):
    result = ls(fake_nvml_dir, gpu_host, FAKE_NVML_LOST="0")
    assert result.returncode == 0, result.stderr
    assert "LOST" in result.stdout
    assert "GPU_IS_LOST" in result.stdout
    document = ls_json(fake_nvml_dir, gpu_host, FAKE_NVML_LOST="0")
    lost, other = document["nvml"]["gpus"]
    assert lost["status"] == "lost"
    assert lost["memory_used_bytes"] is None
    assert other["status"] == "ok"
    assert other["temperature_celsius"] == 41


def test_a_hanging_nvml_call_is_bounded_by_the_deadline(fake_nvml_dir, gpu_host):
    document = ls_json(fake_nvml_dir, gpu_host, "--timeout", "2", FAKE_NVML_HANG="1")  # ls()'s timeout: the guard
    answering, hung = document["nvml"]["gpus"]
    assert answering["status"] == "ok"
    assert answering["memory_used_bytes"] == BUSY_USED_V2
    assert hung["status"] == "not_answering"
    assert "did not return in time" in hung["error"]


def test_a_hanging_nvml_start_is_bounded_too(fake_nvml_dir, gpu_host):
    result = ls(fake_nvml_dir, gpu_host, "--debug", "--no-runtime", "--timeout", "1", FAKE_NVML_INIT="hang")
    assert result.returncode == 0
    assert "Traceback" not in result.stderr  # ls()'s timeout is the hang guard
    assert "nvml: NVML did not answer in time while starting" in result.stderr
    assert "0000:18:00.0" in result.stdout  # the passive listing, as without NVML


def test_nvml_init_failing_leaves_the_listing_as_without_nvml(fake_nvml_dir, gpu_host):
    result = ls(fake_nvml_dir, gpu_host, "--debug", "--no-runtime", FAKE_NVML_INIT="9")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "nvml: NVML is not available: the NVIDIA driver is not loaded" in result.stderr
    assert "CHIP" in result.stdout
    assert "0000:18:00.0" in result.stdout
    assert "GPU  NAME" not in result.stdout


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has a real NVML")
def test_no_nvml_library_means_the_commands_work_as_before(gpu_host):
    env = nvml_env(gpu_host / "nowhere", gpu_host)
    result = run_tool("tpu-ls", "--debug", "--no-runtime", env=env)
    assert result.returncode == 0
    assert "Traceback" not in result.stderr
    assert "nvml: NVML is not available: libnvidia-ml.so.1 not found" in result.stderr


def test_nvml_off_switch_reads_nothing(fake_nvml_dir, gpu_host):
    document = ls_json(fake_nvml_dir, gpu_host, "--no-runtime", TPU_TOOLS_NVML="0")
    assert document["nvml"]["available"] is False
    assert document["nvml"]["gpus"] == []


def test_an_explicit_platform_still_runs_the_runtime_beside_nvml(fake_nvml_dir, gpu_host):
    document = ls_json(fake_nvml_dir, gpu_host, "--platform", "cpu")
    assert document["runtime_status"] == "ok"
    assert document["runtime"]["platform"] == "cpu"
    assert len(document["nvml"]["gpus"]) == 2


@pytest.mark.parametrize(("mask", "words"), [
    (0, []), (0x1, ["gpu_idle"]), (0x4 | 0x40, ["sw_power_cap", "hw_thermal_slowdown"]),
    (0x1000 | 0x8, ["hw_slowdown", "unknown_0x1000"]),
])
def test_clock_event_reasons_in_words(mask, words):
    assert decode.clock_event_reasons(mask) == words


@pytest.mark.parametrize(("nvml", "sysfs"), [
    ("00000000:18:00.0", "0000:18:00.0"), ("00000001:AB:00.0", "0001:ab:00.0"), ("0000:18:00.0", "0000:18:00.0"),
    ("garbage", "garbage"),
])
def test_bus_ids_in_sysfs_form(nvml, sysfs):
    assert decode.pci_bus_id(nvml) == sysfs


def test_a_host_without_nvmls_library_is_told_without_importing_the_bindings():
    """tpu-ls reads NVML on any host whose PCI devices show no accelerator: where the driver's library is absent,
    loading nvidia-ml-py (about 15 ms) only to learn so is skipped, and the sentence is the same."""
    code = ("import sys; from tpu_tools.metrics.nvml.reader import library_loadable, read_snapshot; "
            "snapshot = read_snapshot(5.0); print(library_loadable()); print(snapshot.available); "
            "print(snapshot.error); print('pynvml' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], env=clean_env(TPU_TOOLS_NVML=None, LD_LIBRARY_PATH=None),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loadable, available, error, imported = result.stdout.splitlines()
    if loadable == "True":
        pytest.skip("this host has the NVIDIA driver's libnvidia-ml.so.1")
    assert (available, imported) == ("False", "False")
    assert error == "NVML is not available: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"
