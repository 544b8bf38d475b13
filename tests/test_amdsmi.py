"""AMD GPUs through amdsmi: the real amdsmi bindings on a fake libamd_smi.so serving two MI300X GPUs.

GPU 0 is busy (a job holding 57 GiB of VRAM), GPU 1 idle; the sysfs fixture (tests/sysroot.py: amd_host)
has the same two GPUs at the same PCI bus ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sysroot
from conftest import run_tool
from fakeamdsmi import amdsmi_env
from hypothesis import given
from hypothesis import strategies as st

from tpu_tools.metrics.amdsmi.reader import _number, pci_bus_id, pcie_generation

MIB = 1024 * 1024
PROCS = "0:4574:61203283968,1:999999:1048576"


@pytest.fixture
def amd_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    host = sysroot.amd_host(root)
    host.process(sysroot.FakeProcess(4574, 1000, ["python3", "train.py", "--steps", "80"], ["/dev/kfd"]))
    return root


def ls(rocm: Path, root: Path, *args: str, **switches: str | None):
    return run_tool("tpu-ls", *args, env=amdsmi_env(rocm, root, FAKE_AMDSMI_PROCS=PROCS, **switches), timeout=60)


def ls_json(rocm: Path, root: Path, *args: str, **switches: str | None) -> dict:
    result = ls(rocm, root, "--json", *args, **switches)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_bdf_ids_and_link_speeds_decode():
    assert pci_bus_id((0x1 << 32) | (0xc1 << 8) | (0x1f << 3) | 0x7) == "0001:c1:1f.7"
    assert pci_bus_id(0x0c << 8) == "0000:0c:00.0"
    assert (pcie_generation(32000), pcie_generation(16000), pcie_generation(12345), pcie_generation(None)) == \
        (5, 4, None, None)


@given(domain=st.integers(0, 0xFFFF), partition=st.integers(0, 0xF), bus=st.integers(0, 0xFF),
       device=st.integers(0, 0x1F), function=st.integers(0, 7))
def test_any_bdf_id_decodes_to_the_sysfs_address_of_its_parts(domain, partition, bus, device, function):
    bdf_id = domain << 32 | partition << 28 | bus << 8 | device << 3 | function
    text = pci_bus_id(bdf_id)
    head, dot, tail = text.rpartition(".")
    assert dot
    assert [int(part, 16) for part in head.split(":")] == [domain, bus, device]
    assert int(tail) == function
    assert text == text.lower()
    assert len(text) == 12  # the form discovery's PCI addresses have


@given(st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.text(max_size=5), st.none(),
                 st.booleans(), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)))
def test_a_value_from_the_bindings_is_a_number_or_null_never_an_error(value):
    number = _number(value)
    assert number is None or isinstance(number, float)
    if value in (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF) or isinstance(value, (str, bool)) or value is None:
        assert number is None  # amdsmi's "N/A", in whichever form it reaches us


def test_ls_json_fills_the_gpu_record_from_amdsmi(fake_amdsmi_dir, amd_root):
    # JAX_PLATFORMS unset: the platform left to JAX, as a plain `tpu-ls` leaves it, also where the suite pins the
    # CPU platform (a host with an accelerator plugin); the fixture host decides, and nothing opens a device
    document = ls_json(fake_amdsmi_dir, amd_root, JAX_PLATFORMS=None)
    assert document["runtime_status"] == "skipped"
    assert any("amdsmi lists the GPUs" in n for n in document["notes"])
    amd = document["amdsmi"]
    assert amd["available"]
    assert amd["source"] == "amdsmi"
    assert amd["driver_version"] == "6.12.12"
    assert amd["bindings_version"] == "7.0.2"
    busy, idle = amd["gpus"]
    assert (busy["name"], busy["pci_bus_id"], busy["chip_index"], idle["numa_node"]) == \
        ("AMD Instinct MI300X", "0000:0c:00.0", 0, 1)
    assert busy["uuid"] == "e2ff74a1-0000-1000-8000-cd1234567801"
    assert busy["serial"].endswith("8A2F51C0D10B7E01")
    assert (busy["memory_total_bytes"], busy["memory_used_bytes"]) == (196592 * MIB, 58122 * MIB)
    assert busy["memory_free_bytes"] == (196592 - 58122) * MIB
    assert (busy["utilization_gpu_percent"], busy["utilization_memory_percent"]) == (91, 44)
    assert (busy["temperature_celsius"], busy["temperature_hotspot_celsius"], busy["temperature_memory_celsius"]) \
        == (61, 83, 70)
    assert (busy["power_draw_watts"], busy["power_limit_watts"]) == (612, 750)
    assert busy["energy_joules"] == pytest.approx(123456789012 * 15.3e-6, rel=1e-6)
    assert (busy["clock_sm_hz"], busy["clock_sm_max_hz"], idle["clock_sm_hz"]) == (2100e6, 2100e6, 132e6)
    assert (busy["clock_memory_hz"], idle["clock_memory_max_hz"]) == (1300e6, 1300e6)
    assert (busy["ecc_volatile_uncorrected_errors"], idle["ecc_volatile_uncorrected_errors"]) == (0, 2)
    assert (busy["pcie_link_generation"], busy["pcie_link_generation_max"], busy["pcie_link_width"]) == (5, 5, 16)
    # what amdsmi has no figure for is null, never made up
    assert busy["performance_state"] is None
    assert busy["nvlink_links"] is None
    assert busy["minor_number"] is None
    (process,) = busy["processes"]
    assert (process["pid"], process["gpu_memory_bytes"], process["command"], process["user"]) == \
        (4574, 61203283968, "python3 train.py --steps 80", "alice")
    (stranger,) = idle["processes"]
    assert stranger["pid"] == 999999
    assert not stranger["visible"]


def test_ls_text_lists_the_amd_gpus_in_the_gpu_table(fake_amdsmi_dir, amd_root):
    result = ls(fake_amdsmi_dir, amd_root)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("AMD GPU driver (amdgpu) 6.12.12, amdsmi 7.0.2") for line in lines)
    busy = next(line for line in lines if "0000:0c:00.0" in line)
    for cell in ("AMD Instinct MI300X", "56.8 GiB / 192.0 GiB", "91%", "61 C", "612 W / 750 W",
                 "4574 python3 train.py", "57.0 GiB"):
        assert cell in busy, (cell, busy)


def test_an_unsupported_field_is_null_with_amdsmis_reason(fake_amdsmi_dir, amd_root):
    amd = ls_json(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_UNSUPPORTED="power,temp_edge,ecc")["amdsmi"]
    gpu = amd["gpus"][0]
    assert gpu["status"] == "ok"
    assert gpu["power_draw_watts"] is None
    assert "NOT_SUPPORTED" in gpu["unsupported"]["power"]
    assert "ecc" in gpu["unsupported"]
    assert gpu["temperature_celsius"] == 83  # no edge sensor: the hotspot stands in
    assert gpu["power_limit_watts"] == 750
    assert gpu["memory_used_bytes"] == 58122 * MIB


def test_init_failure_is_one_debug_line_and_the_listing_goes_on(fake_amdsmi_dir, amd_root):
    result = ls(fake_amdsmi_dir, amd_root, "--debug", "--json", "--no-runtime", FAKE_AMDSMI_INIT="34")
    assert result.returncode == 0, result.stderr
    assert "amdsmi: amdsmi is not available: the amdgpu driver is not loaded" in result.stderr
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert not document["amdsmi"]["available"]
    assert len(document["chips"]) == 2


def test_without_the_library_the_bindings_print_nothing_into_the_json(amd_root, tmp_path):
    result = ls(tmp_path / "no-rocm", amd_root, "--json", "--no-runtime")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # the bindings' own "could not load" print did not reach stdout
    assert "libamd_smi.so" in document["amdsmi"]["error"]


def test_a_gpu_that_hangs_costs_the_deadline_and_is_placed_by_its_bus_id(fake_amdsmi_dir, amd_root):
    document = ls_json(fake_amdsmi_dir, amd_root, "--timeout", "3", FAKE_AMDSMI_HANG="1")  # ls()'s timeout: the guard
    busy, hung = document["amdsmi"]["gpus"]
    assert busy["status"] == "ok"
    assert busy["memory_used_bytes"] == 58122 * MIB
    assert hung["status"] == "not_answering"
    assert hung["pci_bus_id"] == "0000:22:00.0"
    assert hung["chip_index"] == 1
    assert "did not return in time" in hung["error"]
