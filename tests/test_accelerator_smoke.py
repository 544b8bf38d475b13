"""Smoke tests on the real accelerator of this host (a GPU or a TPU): opt-in, `pytest -m accelerator`.

They run every command against what JAX and NVML find here, with nothing pinned, and check only what
must hold on any accelerator: it is found, listed with its memory, sampled, shown, benchmarked and
profiled. From a source tree without installing: `PYTHONPATH=. python3 -m pytest -m accelerator`.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, run_tool
from conftest import clean_env as _clean_env

pytestmark = pytest.mark.accelerator


def real_env() -> dict[str, str]:
    """The host as it is: JAX's own platform choice, the driver's NVML; this source tree importable."""
    return _clean_env(JAX_PLATFORMS=None, TPU_TOOLS_NVML=None, PYTHONPATH=str(REPO))


def test_ls_lists_the_accelerator_with_its_memory_and_the_probe_passes():
    result = run_tool("tpu-ls", "--probe", "--json", env=real_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    devices = document["devices"]
    assert devices, devices
    assert all(d["platform"] != "cpu" for d in devices), devices
    assert all(d["probe"] and d["probe"]["ok"] for d in devices), [d["probe"] for d in devices]
    nvml = document["nvml"]
    if nvml and nvml["available"]:  # an NVIDIA host: the card's own figures, tied to the PCI functions
        assert nvml["gpus"]
        assert all(g["status"] == "ok" for g in nvml["gpus"])
        assert all(g["memory_total_bytes"] and g["memory_used_bytes"] is not None for g in nvml["gpus"])
        assert all(g["pci_bus_id"] in {c["pci_address"] for c in document["chips"]} for g in nvml["gpus"])
    plain = run_tool("tpu-ls", env=real_env(), timeout=300)
    assert plain.returncode == 0
    assert "Traceback" not in plain.stderr


def test_monitor_samples_the_devices():
    result = run_tool("tpu-monitor", "--count", "1", env=real_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    devices = report["devices"]["devices"]
    assert devices
    assert report["devices"]["error"] is None
    if report["nvml"].get("available"):
        assert all(d["memory_total_bytes"] for d in devices if d["platform"] in ("gpu", "cuda"))


def test_top_once_shows_the_devices():
    result = run_tool("tpu-top", "--once", env=real_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "gpu:0" in result.stdout or "tpu:0" in result.stdout, result.stdout


def test_bench_matmul_runs_on_the_accelerator(tmp_path: Path):
    result = run_tool("tpu-bench", "matmul", "--size", "1024", "--dtype", "bf16", "--min-time", "0.2",
                      "--json", str(tmp_path / "r.json"), env=real_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["device"]["platform"] != "cpu"
    assert all(r["status"] == "ok" for r in document["results"]), document["results"]


def test_profile_run_reports_device_time(tmp_path: Path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        x = jnp.ones((2048, 2048), jnp.bfloat16)
        f = jax.jit(lambda a: a @ a)
        for _ in range(10):
            x = f(x)
        x.block_until_ready()
    """))
    result = run_tool("tpu-profile", "run", "--out", "out", "--", "prog.py", cwd=tmp_path, env=real_env(),
                      timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["schema"].startswith("tpu-tools/profile")
