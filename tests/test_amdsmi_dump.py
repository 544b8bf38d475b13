"""amdsmi and amd-smi in tpu-dump bundles, and what `tpu-dump show` flags from them."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import sysroot
from conftest import run_tool
from fakeamdsmi import amdsmi_env

COLLECTORS = "accelerators.discovery,accelerators.amdsmi,accelerators.amd_smi"


@pytest.fixture
def amd_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    sysroot.amd_host(root)
    return root


@pytest.fixture
def amd_smi(tmp_path: Path) -> Path:
    """A stand-in `amd-smi` program on PATH that prints a few lines of `amd-smi static` and `amd-smi metric`."""
    directory = tmp_path / "bin"
    directory.mkdir()
    program = directory / "amd-smi"
    program.write_text('#!/bin/sh\ncase "$1" in\n'
                       '  static) printf "GPU: 0\\n    ASIC:\\n        MARKET_NAME: AMD Instinct MI300X\\n";;\n'
                       '  metric) printf "GPU: 0\\n    USAGE:\\n        GFX_ACTIVITY: 91 %%\\n";;\n'
                       '  *) exit 2;;\nesac\n')
    program.chmod(0o755)
    return directory


def _dump(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, bytes], dict]:
    output = tmp_path / "b.tar.gz"
    result = run_tool("tpu-dump", "--only", COLLECTORS, "--timeout", "8", "-o", str(output), env=env, timeout=90)
    assert result.returncode == 0, result.stderr
    with tarfile.open(output) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return members, json.loads(members["manifest.json"])


def test_the_bundle_holds_an_amdsmi_snapshot_and_amd_smi_output(tmp_path, fake_amdsmi_dir, amd_root, amd_smi):
    env = amdsmi_env(fake_amdsmi_dir, amd_root)
    env["PATH"] = f"{amd_smi}{os.pathsep}{env['PATH']}"
    members, manifest = _dump(tmp_path, env)
    statuses = {c["name"]: c["status"] for c in manifest["collectors"] if c["name"] in COLLECTORS.split(",")}
    assert statuses == {"accelerators.discovery": "ok", "accelerators.amdsmi": "ok", "accelerators.amd_smi": "ok"}
    snapshot = json.loads(members["accelerators/amdsmi.json"])
    assert snapshot["source"] == "amdsmi"
    assert [g["pci_bus_id"] for g in snapshot["gpus"]] == ["0000:0c:00.0", "0000:22:00.0"]
    assert "AMD Instinct MI300X" in members["accelerators/amdsmi.txt"].decode()
    assert "MARKET_NAME: AMD Instinct MI300X" in members["accelerators/amd-smi-static.txt"].decode()
    assert "GFX_ACTIVITY: 91 %" in members["accelerators/amd-smi-metric.txt"].decode()
    shown = run_tool("tpu-dump", "show", "--json", str(tmp_path / "b.tar.gz"), env=env)
    assert shown.returncode == 0, shown.stderr
    warnings = {w["kind"]: w["message"] for w in json.loads(shown.stdout)["warnings"]}
    # the fake's idle GPU counts 2 uncorrectable ECC errors; amdsmi has no lifetime count to add
    assert warnings["gpu_ecc_errors"] == ("GPU 1 (AMD Instinct MI300X, 0000:22:00.0) has uncorrected ECC errors: "
                                          "2 since the driver loaded")


def test_a_hung_gpu_is_written_down_as_not_answering_and_flagged(tmp_path, fake_amdsmi_dir, amd_root):
    env = amdsmi_env(fake_amdsmi_dir, amd_root, FAKE_AMDSMI_HANG="0")
    members, manifest = _dump(tmp_path, env)
    collectors = {c["name"]: c for c in manifest["collectors"]}
    assert collectors["accelerators.amdsmi"]["status"] == "ok"
    hung, answering = json.loads(members["accelerators/amdsmi.json"])["gpus"]
    assert (hung["status"], hung["pci_bus_id"], answering["status"]) == ("not_answering", "0000:0c:00.0", "ok")
    shown = json.loads(run_tool("tpu-dump", "show", "--json", str(tmp_path / "b.tar.gz"), env=env).stdout)
    warnings = {w["kind"]: w["message"] for w in shown["warnings"]}
    assert "did not answer amdsmi in time" in warnings["gpu_not_answering"]


def test_without_amdsmi_or_amd_smi_the_collectors_skip_with_the_reason(tmp_path, amd_root):
    env = amdsmi_env(tmp_path / "nowhere", amd_root, TPU_TOOLS_AMDSMI="0")
    env["PATH"] = "/usr/bin:/bin"
    _, manifest = _dump(tmp_path, env)
    collectors = {c["name"]: c for c in manifest["collectors"]}
    assert collectors["accelerators.amdsmi"]["status"] == "skipped"
    assert "amdsmi reading is off" in collectors["accelerators.amdsmi"]["error"]
    if not any((Path(d) / "amd-smi").exists() for d in ("/usr/bin", "/bin")):
        assert (collectors["accelerators.amd_smi"]["status"],
                collectors["accelerators.amd_smi"]["error"]) == ("skipped", "amd-smi is not installed")
