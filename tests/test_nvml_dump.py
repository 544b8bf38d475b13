"""NVML and nvidia-smi in tpu-dump bundles, and what `tpu-dump show` flags from them."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import sysroot
from conftest import run_tool
from fakenvml import nvml_env

COLLECTORS = ("accelerators.discovery,accelerators.nvml,accelerators.nvidia_smi")


@pytest.fixture
def gpu_host(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    sysroot.nvidia_host(root)
    return root


@pytest.fixture
def nvidia_smi(tmp_path: Path) -> Path:
    """A stand-in `nvidia-smi` program on PATH that prints a few lines of the observed `nvidia-smi -q`."""
    directory = tmp_path / "bin"
    directory.mkdir()
    program = directory / "nvidia-smi"
    program.write_text('#!/bin/sh\n[ "$1" = "-q" ] || exit 2\n'
                       'printf "Driver Version : 580.159.04\\nProduct Name : NVIDIA H100 80GB HBM3\\n"\n')
    program.chmod(0o755)
    return directory


def _dump(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, bytes], dict]:
    output = tmp_path / "b.tar.gz"
    result = run_tool("tpu-dump", "--only", COLLECTORS, "--timeout", "8", "-o", str(output), env=env, timeout=90)
    assert result.returncode == 0, result.stderr
    with tarfile.open(output) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return members, json.loads(members["manifest.json"])


def test_the_bundle_holds_an_nvml_snapshot_and_nvidia_smi_output(tmp_path, fake_nvml_dir, gpu_host, nvidia_smi):
    env = nvml_env(fake_nvml_dir, gpu_host)
    env["PATH"] = f"{nvidia_smi}{os.pathsep}{env['PATH']}"
    members, manifest = _dump(tmp_path, env)
    statuses = {c["name"]: c["status"] for c in manifest["collectors"] if c["name"] in COLLECTORS.split(",")}
    assert statuses == {"accelerators.discovery": "ok", "accelerators.nvml": "ok", "accelerators.nvidia_smi": "ok"}
    snapshot = json.loads(members["accelerators/nvml.json"])
    assert [g["memory_used_bytes"] for g in snapshot["gpus"]] == [64419069952, 0]
    assert "NVIDIA H100 80GB HBM3" in members["accelerators/nvml.txt"].decode()
    assert "Driver Version : 580.159.04" in members["accelerators/nvidia-smi-q.txt"].decode()
    shown = json.loads(run_tool("tpu-dump", "show", "--json", str(tmp_path / "b.tar.gz"), env=env).stdout)
    assert not [w for w in shown["warnings"] if w["kind"].startswith("gpu_")]  # a healthy pair of GPUs


def test_show_flags_ecc_errors_remapped_rows_thermal_slowdown_and_a_lost_gpu(tmp_path, fake_nvml_dir, gpu_host):
    env = nvml_env(fake_nvml_dir, gpu_host, FAKE_NVML_SICK="0", FAKE_NVML_LOST="1", FAKE_NVML_PCIE_WIDTH="0:4",
                   FAKE_NVML_REPLAYS="0:12")
    members, manifest = _dump(tmp_path, env)
    statuses = {c["name"]: c["status"] for c in manifest["collectors"]}
    assert statuses["accelerators.nvml"] == "ok"
    shown = run_tool("tpu-dump", "show", "--json", str(tmp_path / "b.tar.gz"), env=env)
    assert shown.returncode == 0, shown.stderr
    warnings = {w["kind"]: w["message"] for w in json.loads(shown.stdout)["warnings"]}
    assert "2 since the driver loaded, 5 in its lifetime" in warnings["gpu_ecc_errors"]
    assert "remapped 3 rows" in warnings["gpu_remapped_rows"]
    assert "waits for a GPU reset" in warnings[
        "gpu_remapped_rows"]
    assert "hw_thermal_slowdown" in warnings["gpu_thermal_slowdown"]
    assert "92.0 C" in warnings["gpu_thermal_slowdown"]
    assert "GPU 1" in warnings["gpu_lost"]
    assert "0000:38:00.0" in warnings["gpu_lost"]
    assert "PCIe link at x4 of x16" in warnings["gpu_pcie_degraded"]
    assert "12 PCIe replays" in warnings[
        "gpu_pcie_replays"]
    text = run_tool("tpu-dump", "show", str(tmp_path / "b.tar.gz"), env=env).stdout
    assert "gpu_lost" in text or "is lost" in text


def test_without_nvml_or_nvidia_smi_the_collectors_skip_with_the_reason(tmp_path, gpu_host):
    env = nvml_env(tmp_path / "nowhere", gpu_host, TPU_TOOLS_NVML="0")
    env["PATH"] = "/usr/bin:/bin"
    _, manifest = _dump(tmp_path, env)
    collectors = {c["name"]: c for c in manifest["collectors"]}
    assert collectors["accelerators.nvml"]["status"] == "skipped"
    assert "NVML reading is off" in collectors["accelerators.nvml"]["error"]
    if not any((Path(d) / "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        assert (collectors["accelerators.nvidia_smi"]["status"],
                collectors["accelerators.nvidia_smi"]["error"]) == ("skipped", "nvidia-smi is not installed")
