"""`tpu-ls` end to end: the real console script, the real CPU runtime, fixture hosts."""

from __future__ import annotations

import json
import subprocess

import pytest
import sysroot
from conftest import DEFAULT_METRICS_ADDR, assert_one_line_error, clean_env, run_tool, tool_command

LS_KEYS = {"schema", "host", "time", "requested_platform", "runtime_status", "runtime", "versions", "devices",
           "chips", "notes", "libtpu_metrics", "libtpu_runtime_status", "tpu_slice", "nvml", "amdsmi", "tpu_health"}
DEVICE_KEYS = {"id", "local_hardware_id", "platform", "device_kind", "process_index", "host", "coords",
               "core_on_chip", "memory_limit_bytes", "memory_used_bytes", "memory_peak_bytes", "chip_index",
               "devices_per_chip", "cores_per_chip", "pci_address", "numa_node", "holders", "probe", "libtpu"}
RUNTIME_KEYS = {"platform", "platform_version", "process_index", "process_count", "device_count",
                "local_device_count", "jax_version", "jaxlib_version"}
CHIP_KEYS = {"index", "name", "vendor", "platform", "pci_address", "pci_functions", "numa_node", "cpu_affinity",
             "iommu_group", "devices_per_chip", "cores_per_chip", "hbm_bytes", "device_nodes", "holders", "libtpu",
             "tpu_health"}


def ls_json(*args: str, env=None) -> dict:
    result = run_tool("tpu-ls", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_default_lists_the_cpu_device_in_plain_text_when_piped():
    result = run_tool("tpu-ls")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("host ")
    assert "platform cpu" in lines[0]
    assert "jax " in lines[0]
    assert lines[1].split()[:3] == ["ID", "KIND", "PLATFORM"]
    assert lines[2].split()[:3] == ["0", "cpu", "cpu"]
    assert "\x1b[" not in result.stdout


def test_json_schema_is_pinned():
    document = ls_json("--host-devices", "2")
    assert set(document) == LS_KEYS
    assert document["schema"] == "tpu-tools/ls/v1"
    assert document["runtime_status"] == "ok"
    assert set(document["runtime"]) == RUNTIME_KEYS
    assert set(document["versions"]) == {"tpu_tools", "jax", "jaxlib", "plugins"}
    assert len(document["devices"]) == 2
    for device in document["devices"]:
        assert set(device) == DEVICE_KEYS
        assert device["platform"] == "cpu"
        assert device["holders"] == []
        assert device["probe"] is None
        assert device["libtpu"] is None
    assert [s["address"] for s in document["libtpu_metrics"]] == [DEFAULT_METRICS_ADDR]
    assert document["libtpu_runtime_status"] is None
    assert document["tpu_health"] == []  # no process holds a TPU chip: no agent asked


def test_host_devices_8_shows_8():
    document = ls_json("--host-devices", "8")
    assert [d["id"] for d in document["devices"]] == list(range(8))
    assert document["runtime"]["local_device_count"] == 8


def test_probe_adds_a_passing_health_column():
    result = run_tool("tpu-ls", "--probe", "--host-devices", "2")
    assert result.returncode == 0, result.stderr
    assert "HEALTH" in result.stdout
    assert result.stdout.count(" pass ") == 2
    document = ls_json("--probe")
    probe = document["devices"][0]["probe"]
    assert probe["ok"]
    assert probe["compile_ms"] > 0
    assert probe["execute_us"] > 0


def test_topology_on_a_platform_without_coordinates_is_a_list():
    result = run_tool("tpu-ls", "--topology", "--host-devices", "3")
    assert result.returncode == 0
    assert "no chip coordinates" in result.stdout
    assert "device 2: cpu" in result.stdout


def test_no_runtime_reads_a_fixture_host_without_jax(tmp_path):
    sysroot.v5e_host(tmp_path, holders={3001: [1]})
    result = run_tool("tpu-ls", "--no-runtime", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "runtime skipped" in result.stdout
    assert result.stdout.count("TPU v5e") == 8
    assert "/dev/vfio/17" in result.stdout
    assert "3001 python3 train.py" in result.stdout
    document = ls_json("--no-runtime", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert document["runtime"] is None
    assert document["devices"] == []
    assert set(document["chips"][0]) == CHIP_KEYS
    assert document["chips"][1]["holders"] == [{"pid": 3001, "user": "alice",
                                               "command": "/usr/bin/python3 train.py --steps 100", "frontend": None}]


@pytest.mark.auto_platform  # a held TPU is detected only when the platform is left to JAX
def test_a_held_tpu_is_not_opened_and_exits_0(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0, 1, 2, 3]})
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))
    result = run_tool("tpu-ls", env=env)
    assert result.returncode == 0, result.stderr
    assert "runtime held" in result.stdout
    assert "the TPU is held by process 2001 (/usr/bin/python3)" in result.stdout
    assert "--force" in result.stdout
    assert result.stdout.count("TPU v4") == 4
    document = ls_json(env=env)
    assert document["runtime_status"] == "held"
    assert document["runtime"] is None


@pytest.mark.auto_platform  # a held TPU keeps the runtime closed only when the platform is left to JAX
def test_force_opens_the_runtime_anyway(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0]})
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))
    without = ls_json(env=env)  # the same host and platform without --force: the runtime stays closed
    assert without["runtime_status"] == "held"
    assert without["runtime"] is None
    assert without["devices"] == []
    document = ls_json("--force", env=env)
    assert document["runtime_status"] == "ok"
    assert document["runtime"] is not None
    assert document["devices"]


def test_cpu_platform_is_not_blocked_by_a_held_tpu(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0]})
    document = ls_json("--platform", "cpu", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert document["runtime_status"] == "ok"
    assert len(document["chips"]) == 4


def test_gpu_devices_pair_with_pci_chips_by_order(tmp_path):
    # The pairing logic on records, with a fixture NVIDIA host and the device records of a real runtime shape.
    from tpu_tools.pjrt.devices import DeviceRecord, RuntimeRecord
    from tpu_tools.pjrt.discover import discover
    from tpu_tools.pjrt.pairing import match_chips

    sysroot.nvidia_host(tmp_path)
    devices = [DeviceRecord(i, i, "gpu", "NVIDIA H100 80GB HBM3", 0, "h") for i in range(2)]
    runtime = RuntimeRecord("gpu", "cuda 12", 0, 1, 2, 2, "0", "0", devices)
    chips = match_chips(runtime, discover(tmp_path))
    assert [chips[i].pci_address for i in range(2)] == ["0000:18:00.0", "0000:38:00.0"]


# --- bad input and faults ---------------------------------------------------------------------------

def test_unknown_platform_is_a_usage_error():
    result = run_tool("tpu-ls", "--platform", "quantum")
    assert result.returncode == 2
    assert "Invalid value for '--platform'" in result.stderr
    assert "Traceback" not in result.stderr


def test_platform_tpu_without_libtpu_is_one_sentence_and_exit_1():
    message = assert_one_line_error(run_tool("tpu-ls", "--platform", "tpu"), 1)
    assert message == ("tpu-ls: error: the tpu platform is not available: libtpu is not installed or no TPU "
                       "was found (pip install 'jax[tpu]' on a TPU VM)")


def test_garbage_jax_platforms_is_a_usage_error():
    message = assert_one_line_error(run_tool("tpu-ls", env=clean_env(JAX_PLATFORMS="garbage")), 2)
    assert "JAX_PLATFORMS='garbage' names no known platform" in message


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_host_device_counts_are_usage_errors(value):
    result = run_tool("tpu-ls", "--host-devices", value)
    assert result.returncode == 2
    assert "--host-devices" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.auto_platform  # the hanging plugin is initialised only when the platform is left to JAX
def test_a_hanging_runtime_gives_up_at_the_timeout(hanging_plugin):
    env = clean_env(PYTHONPATH=str(hanging_plugin))
    message = assert_one_line_error(run_tool("tpu-ls", "--timeout", "2", env=env, timeout=30), 1)
    assert "the PJRT runtime did not answer within 2 s" in message


def test_a_crashing_runtime_reports_the_signal(crashing_plugin):
    env = clean_env(PYTHONPATH=str(crashing_plugin))
    message = assert_one_line_error(run_tool("tpu-ls", "--platform", "cpu", env=env), 1)
    assert "the cpu runtime crashed with SIGSEGV (signal 11)" in message


def test_debug_shows_the_traceback_of_an_error():
    result = run_tool("tpu-ls", "--platform", "tpu", "--debug")
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    result = run_tool("tpu-ls", "--platform", "tpu", env=clean_env(TPU_TOOLS_DEBUG="1"))
    assert "Traceback" in result.stderr


def test_no_runtime_conflicts_with_probe():
    assert_one_line_error(run_tool("tpu-ls", "--no-runtime", "--probe"), 2, "--no-runtime cannot be combined")


def test_a_closed_pipe_prints_no_traceback():
    command = " ".join(tool_command("tpu-ls")) + " --host-devices 8 | head -1"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert result.stdout.startswith("host ")
    assert result.stderr == ""


def test_the_group_and_python_m_run_the_same_command():
    via_group = run_tool("tpu-tools", "ls", "--json", "--no-runtime")
    assert json.loads(via_group.stdout)["schema"] == "tpu-tools/ls/v1"
    import sys

    via_module = subprocess.run([sys.executable, "-m", "tpu_tools", "ls", "--json", "--no-runtime"],
                                capture_output=True, text=True, env=clean_env(), timeout=60)
    assert json.loads(via_module.stdout)["schema"] == "tpu-tools/ls/v1"


def test_version_names_the_stack():
    result = run_tool("tpu-tools", "--version")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tpu-tools (tpu-tools) ")
    assert lines[1].startswith("jax ")
    assert lines[2].startswith("jaxlib ")
    assert run_tool("tpu-ls", "--version").stdout.startswith("tpu-ls (tpu-tools) ")


def test_no_color_and_format_choices(tmp_path):
    plain = run_tool("tpu-ls", "--format", "plain")
    assert plain.stdout.splitlines()[1].startswith("ID")
    table = run_tool("tpu-ls", "--format", "table")
    assert "━" in table.stdout or "─" in table.stdout
    assert "\x1b[" not in table.stdout  # not a terminal: no colour codes
