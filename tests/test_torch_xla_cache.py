"""tpu-profile cache inspect, gc, verify and doctor on a persistent cache that the real torch_xla 2.9 wrote
(`xr.initialize_cache`, the CPU platform): its entries are named by a 128-bit hash in decimal, written in place.

One job per module writes three graphs' entries (18 s or more for its import); each test works on a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import torch_xla_env
from conftest import clean_env, run_tool

from tpu_tools.profile.cachedir import is_torch_xla_entry

JOB = textwrap.dedent("""
    import sys, torch, torch_xla
    import torch_xla.runtime as xr
    xr.initialize_cache(sys.argv[1], readonly=False)
    device = torch_xla.device()
    for rows in (4, 6, 8):  # three graphs, three entries
        x = torch.randn(rows, 3).to(device)
        (x @ x.T).sum().cpu()
""")
DAY = 86400.0


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = torch_xla_env.require()
    folder = tmp_path_factory.mktemp("torch-xla-cache")
    (folder / "job.py").write_text(JOB)
    done = subprocess.run([str(python), str(folder / "job.py"), str(folder / "cache")], env=torch_xla_env.job_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "cache"


@pytest.fixture
def cache(written: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(written, copy)
    return copy


def _json(*args: str, env: dict[str, str] | None = None) -> dict:
    result = run_tool("tpu-profile", "cache", *args, "--json", env=env)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_torch_xla_writes_entries_named_by_a_128_bit_decimal_hash_and_nothing_else(written: Path) -> None:
    names = sorted(p.name for p in written.iterdir())
    assert len(names) == 3, names
    assert all(is_torch_xla_entry(name) for name in names), names


def test_inspect_counts_its_entries_bytes_and_ages(cache: Path) -> None:
    now = time.time()
    first, *rest = sorted(cache.iterdir())
    os.utime(first, (now - 2 * DAY, now - 2 * DAY))
    document = _json("inspect", str(cache))
    sizes = sum(p.stat().st_size for p in cache.iterdir())
    assert (document["entry_count"], document["total_bytes"], document["other_files"]) == (3, sizes, [])
    torch = document["frontends"]["torch_xla"]
    assert (torch["entry_count"], torch["total_bytes"]) == (3, sizes)
    assert "jax" not in document["frontends"]
    assert torch["oldest_age_s"] == pytest.approx(2 * DAY, abs=600)
    assert torch["newest_age_s"] < 600
    assert {e["name"]: e["frontend"] for e in document["entries"]} == {p.name: "torch_xla" for p in cache.iterdir()}
    table = run_tool("tpu-profile", "cache", "inspect", str(cache))
    assert table.returncode == 0, table.stderr
    assert "3 entries" in table.stdout, table.stderr
    assert "(torch_xla)" in table.stdout, table.stderr


def test_gc_removes_its_entries_by_age_and_by_size_and_nothing_else(cache: Path) -> None:
    now = time.time()
    old, middle, new = sorted(cache.iterdir())
    for path, age in ((old, 3 * DAY), (middle, 2 * DAY)):
        os.utime(path, (now - age, now - age))
    (cache / "notes.txt").write_text("the user's")
    by_age = _json("gc", str(cache), "--max-age", "60h")
    assert [(r["name"], r["reason"].split(" ")[0]) for r in by_age["removals"]] == [(old.name, "written")]
    size = middle.stat().st_size + new.stat().st_size
    by_size = _json("gc", str(cache), "--max-bytes", str(size - 1))
    assert [r["name"] for r in by_size["removals"]] == [middle.name]
    assert by_size["kept_entries"] == 1
    assert sorted(p.name for p in cache.iterdir()) == sorted([new.name, "notes.txt"])


def test_verify_says_it_cannot_verify_them(cache: Path) -> None:
    document = _json("verify", str(cache))
    assert {(e["status"], e["problem"]) for e in document["entries"]} == {
        ("skipped", "a PyTorch/XLA entry: verify loads JAX's entries only")}
    assert (document["checked"], document["broken"], document["skipped"]) == (3, 0, 3)


def test_doctor_finds_a_read_only_setting_another_directory_and_is_quiet_on_a_sound_one(cache: Path) -> None:
    codes = lambda **env: {f["code"] for f in _json("doctor", str(cache), env=clean_env(**env))["findings"]}  # noqa: E731
    assert codes(XLA_PERSISTENT_CACHE_PATH=str(cache)) == set()
    assert codes(XLA_PERSISTENT_CACHE_PATH=str(cache), XLA_PERSISTENT_CACHE_READ_ONLY="1") == {"torch_xla_read_only"}
    assert codes(XLA_PERSISTENT_CACHE_PATH=str(cache.parent)) == {"torch_xla_env_differs"}
