"""Passive discovery on fixture sysfs/dev/proc trees shaped like real hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sysroot

from tpu_tools.pjrt.discover import discover, scan_holders


def test_v4_host_has_four_chips_on_accel_nodes_with_holders(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0, 1]})
    found = discover(tmp_path)
    assert [c.name for c in found.chips] == ["TPU v4"] * 4
    assert [n.path for c in found.chips for n in c.device_nodes] == [f"/dev/accel{i}" for i in range(4)]
    assert [c.numa_node for c in found.chips] == [0, 0, 1, 1]
    assert found.chips[2].cpu_affinity == "56-111"
    assert [h.pid for h in found.chips[0].holders] == [2001]
    assert found.chips[0].holders[0].user == "alice"
    assert found.chips[0].holders[0].command == "/usr/bin/python3 train.py --steps 100"
    assert found.chips[3].holders == []
    assert found.chips[0].devices_per_chip == 1
    assert found.chips[0].cores_per_chip == 2
    assert [h.pid for h in found.tpu_holders()] == [2001]
    assert found.tpu_holders(exclude_pids={2001}) == []


def test_v5e_nodes_follow_iommu_groups_that_are_not_0_to_7(tmp_path):
    sysroot.v5e_host(tmp_path, holders={3001: [5]})
    found = discover(tmp_path)
    assert [c.name for c in found.chips] == ["TPU v5e"] * 8
    assert [c.iommu_group for c in found.chips] == sysroot.V5E_GROUPS
    assert [c.device_nodes[0].path for c in found.chips] == [f"/dev/vfio/{g}" for g in sysroot.V5E_GROUPS]
    assert [h.pid for h in found.chips[5].holders] == [3001]
    assert all(not c.holders for i, c in enumerate(found.chips) if i != 5)


@pytest.mark.parametrize(("builder", "name", "per_chip"), [
    (sysroot.v6e_host, "TPU v6e", 1),
    (sysroot.tpu7x_host, "TPU7x", 2),
])
def test_newer_tpu_generations(tmp_path, builder, name, per_chip):
    builder(tmp_path, holders={77: [0]})
    found = discover(tmp_path)
    assert {c.name for c in found.chips} == {name}
    assert found.chips[0].devices_per_chip == per_chip
    assert found.chips[0].holders[0].pid == 77


def test_v2_and_v3_share_a_device_id_and_differ_by_subsystem(tmp_path):
    sysroot.tpu_host(tmp_path / "v2", "0x0027", 1, style="accel", subsystem="0x004e")
    sysroot.tpu_host(tmp_path / "v3", "0x0027", 1, style="accel", subsystem="0x004f")
    assert discover(tmp_path / "v2").chips[0].name == "TPU v2"
    assert discover(tmp_path / "v3").chips[0].name == "TPU v3"


def test_nvidia_host_maps_minor_numbers_and_skips_audio_functions(tmp_path):
    sysroot.nvidia_host(tmp_path, holders={5005: [0]})
    found = discover(tmp_path)
    # named as the driver names them (nvidia-smi's name), not by a table of PCI ids
    assert [c.name for c in found.chips] == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
    # minors are reversed against PCI order in the fixture
    assert [c.device_nodes[0].path for c in found.chips] == ["/dev/nvidia1", "/dev/nvidia0"]
    assert found.chips[1].holders[0].pid == 5005
    assert found.chips[0].holders == []
    shared = {n.path: [h.pid for h in n.holders] for n in found.shared_nodes}
    assert shared["/dev/nvidiactl"] == [5005]
    assert all(c.platform == "cuda" for c in found.chips)


def test_mixed_host_finds_every_chip_type_and_ignores_a_google_nic(tmp_path):
    sysroot.mixed_host(tmp_path)
    found = discover(tmp_path)
    assert [(c.name, c.platform) for c in found.chips] == [
        ("TPU v5e", "tpu"), ("NVIDIA A100 PCIe 80GB", "cuda"), ("AMD GPU", "rocm")]  # no driver: named by PCI id
    assert found.chips[2].device_nodes[0].path == "/dev/dri/renderD128"
    assert [h.pid for h in found.chips[0].holders] == [4242]
    assert [h.pid for h in found.chips[1].holders] == [4242]
    assert {n.path for n in found.shared_nodes} >= {"/dev/kfd", "/dev/nvidiactl"}


def test_empty_host_and_missing_root(tmp_path):
    sysroot.empty_host(tmp_path)
    assert discover(tmp_path).chips == []
    nothing = discover(tmp_path / "does-not-exist")
    assert nothing.chips == []
    assert nothing.notes == []


def test_malformed_and_unreadable_sysfs_files_become_notes(tmp_path):
    sysroot.v4_host(tmp_path)
    devices = tmp_path / "sys/bus/pci/devices"
    (devices / "0000:00:04.0/device").write_text("not-hex\n")
    (devices / "0000:00:05.0/numa_node").unlink()
    (devices / "0000:00:05.0/numa_node").mkdir()  # reading it fails with EISDIR
    (devices / "0000:00:06.0/local_cpulist").unlink()
    os.symlink("/nonexistent/target", devices / "0000:00:06.0/local_cpulist")  # dangling
    (devices / "0000:00:07.0/class").write_text("")
    found = discover(tmp_path)
    assert [c.pci_address for c in found.chips] == ["0000:00:05.0", "0000:00:06.0"]
    assert found.chips[0].numa_node is None
    assert found.chips[1].cpu_affinity is None
    assert sum("unreadable or malformed" in n for n in found.notes) == 2


def test_missing_device_node_is_noted(tmp_path):
    sysroot.v4_host(tmp_path)
    (tmp_path / "dev/accel3").unlink()
    found = discover(tmp_path)
    assert not found.chips[3].device_nodes[0].exists
    assert any("/dev/accel3 is missing" in n for n in found.notes)


def test_a_process_that_exits_while_scanned_is_skipped(tmp_path):
    host = sysroot.v4_host(tmp_path, holders={2001: [0]})
    host.process(sysroot.FakeProcess(2002, 1000, ["gone"], ["/dev/accel1"]))
    # The process vanished between listing /proc and reading its fds.
    for entry in (tmp_path / "proc/2002/fd").iterdir():
        entry.unlink()
    (tmp_path / "proc/2002/fd").rmdir()
    found = discover(tmp_path)
    assert [h.pid for h in found.chips[0].holders] == [2001]
    assert found.chips[1].holders == []


def test_libtpu_lockfile_holder_counts_as_holding_the_tpu(tmp_path):
    sysroot.tpu_host(tmp_path, "0x006f", 2, style="vfio", groups=[9, 10], lockfile_pid=6006)
    found = discover(tmp_path)
    assert [h.pid for h in found.libtpu_lock_holders] == [6006]
    assert [h.user for h in found.tpu_holders()] == ["bob"]


def test_scan_of_the_real_proc_finds_a_live_holder(tmp_path):
    target = tmp_path / "held-file"
    target.write_text("x")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(target)!r}); import time; time.sleep(30)"])
    try:
        for _ in range(50):
            held = scan_holders(Path("/"), {str(target)}, [])
            if held[str(target)]:
                break
            import time

            time.sleep(0.1)
        assert [h.pid for h in held[str(target)]] == [holder.pid]
        assert "time.sleep(30)" in held[str(target)][0].command
    finally:
        holder.kill()
        holder.wait()


def test_an_nvidia_gpu_of_an_unknown_id_without_the_driver_is_a_generic_nvidia_gpu(tmp_path):
    host = sysroot.HostBuilder(tmp_path)
    host.function(sysroot.FakeFunction("0000:3b:00.0", sysroot.NVIDIA, "0x9999", "0x030200"))
    host.function(sysroot.FakeFunction("0000:5e:00.0", sysroot.NVIDIA, "0x2330", "0x030200"))
    host.node("/dev/nvidia0")
    host.node("/dev/nvidia1")
    found = discover(tmp_path)
    assert [(c.name, c.platform, c.hbm_bytes) for c in found.chips] == [
        ("NVIDIA GPU", "cuda", None), ("NVIDIA H100 SXM", "cuda", 80 * 10**9)]


def _pci_function(root: Path, address: str, vendor: str) -> Path:
    directory = root / "sys/bus/pci/devices" / address
    directory.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", "0x0063"), ("class", "0x120000"),
                        ("subsystem_device", "0x0000"), ("numa_node", "0"), ("local_cpulist", "0-3")):
        (directory / name).write_text(value + "\n")
    return directory


def test_a_function_of_another_vendor_is_read_once_while_its_entry_stands(tmp_path):
    """A monitor reads PCI every round: an entry known to be of another vendor is not read again, but a function
    that replaces it (a new entry, as a hot-plug makes) is."""
    import shutil

    from tpu_tools.pjrt.discover import GOOGLE, read_pci_functions

    other = _pci_function(tmp_path, "0000:00:05.0", "0x8086")
    assert read_pci_functions(tmp_path, []) == []
    (other / "vendor").write_text("0x1ae0\n")  # the same entry: what was read of it stands
    assert read_pci_functions(tmp_path, []) == []
    # a new entry at that address (made while the old one stands, so another inode, as the kernel numbers them)
    new = _pci_function(tmp_path, "0000:00:06.0", "0x1ae0")
    shutil.rmtree(other)
    new.rename(other)
    (found,) = read_pci_functions(tmp_path, [])
    assert found.vendor_id == GOOGLE
    assert found.address == "0000:00:05.0"
