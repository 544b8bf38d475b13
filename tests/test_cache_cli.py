"""`tpu-profile cache`: real JAX caches on the CPU platform, hostile entries, bad input, another user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zlib
from pathlib import Path

import pytest
from cachejobs import empty_entries, run_cache_job
from conftest import UNMEASURED, assert_one_line_error, clean_env, run_tool, tool_command

from tpu_tools.instrument import cachekeys

OTHER_USER = "tputoolscache"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache written once by a real process (entries of two sizes, with key records)."""
    work = tmp_path_factory.mktemp("template")
    cache = work / "cache"
    run_cache_job(work, cache, "3,4")
    return cache


@pytest.fixture
def cache(template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(template, copy, symlinks=True)
    return copy


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.name.endswith("-cache") and not p.is_symlink())


def _json(*args: str, code: int = 0, env: dict[str, str] | None = None) -> dict:
    result = run_tool("tpu-profile", "cache", *args, "--json", env=env)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_inspect_lists_entries_compile_times_writers_and_other_files(cache: Path) -> None:
    (cache / ".write.tmp").write_bytes(b"partial")  # not a name of jax's: never taken for its temporary file
    (cache / f"_temp_jit_step-{'e' * 64}").write_bytes(b"partial")
    (cache / f"gone-{'c' * 64}-atime").write_bytes(b"\0" * 8)
    autotune = cache / "xla_gpu_per_fusion_autotune_cache_dir"
    autotune.mkdir(mode=0o755)
    (autotune / "one").write_text("x")
    document = _json("inspect", str(cache))
    assert document["schema"] == "tpu-tools/cache/v1"
    step = [e for e in document["entries"] if e["module"] == "jit_step"]
    assert len(step) == 2
    assert all(e["compile_time_s"] == 0 and e["compression"] == "zlib" for e in step)
    assert all(e["problem"] is None and e["jaxlib_version"] == document["installed_jaxlib"] for e in step)
    assert document["entry_count"] == len(document["entries"])
    assert document["total_bytes"] > 0
    assert document["key_records"] == document["entry_count"]
    assert len(document["writers"]) == 1
    kinds = {o["name"]: o["kind"] for o in document["other_files"]}
    assert kinds[f"_temp_jit_step-{'e' * 64}"] == "temporary"
    assert kinds[".write.tmp"] == "unknown"
    assert kinds[f"gone-{'c' * 64}-atime"].startswith("orphan")
    (sub,) = document["subcaches"]
    assert sub["name"] == autotune.name
    assert sub["mode"] == "0755"
    assert sub["owner"] == "root"
    assert sub["files"] == 1
    text = run_tool("tpu-profile", "cache", "inspect", str(cache))
    assert text.returncode == 0
    assert "jit_step" in text.stdout
    assert "XLA GPU autotune cache" in text.stdout


def test_bad_directories_are_one_line_errors(tmp_path: Path) -> None:
    for command in ("inspect", "verify", "gc"):
        assert_one_line_error(run_tool("tpu-profile", "cache", command, str(tmp_path / "none")), 1, "does not exist")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_one_line_error(run_tool("tpu-profile", "cache", "inspect", str(a_file)), 1, "is not a directory")
    assert_one_line_error(run_tool("tpu-profile", "cache", "gc", str(tmp_path), "--max-bytes", "lots"), 2,
                          "not a size")
    assert_one_line_error(run_tool("tpu-profile", "cache", "doctor", env=clean_env(JAX_COMPILATION_CACHE_DIR=None)),
                          2, "JAX_COMPILATION_CACHE_DIR")
    assert_one_line_error(run_tool("tpu-profile", "cache", "warm", str(tmp_path)), 2, "nothing to warm")


def test_a_hundred_thousand_entries_are_bounded_work(tmp_path: Path) -> None:
    cache = tmp_path / "huge"
    cache.mkdir()
    try:
        empty_entries(cache, 100_000)  # 10^5 names, no 400 MB of data blocks
        document = _json("inspect", str(cache), "--limit", "50")
        assert document["entry_count"] == 100_000
        assert document["entries_listed"] == 50
        assert document["truncated"]
        assert all(e["problem"] == "empty file" for e in document["entries"])
        planned = _json("gc", str(cache), "--max-age", "1s", "--dry-run", "--limit", "50")
        assert planned["truncated"]
        assert planned["entries_considered"] == 50
        assert planned["would_remove"] == 50
        assert planned["kept_entries"] == 100_000 - 50  # those past the limit stay, and count
        assert len(os.listdir(cache)) == 100_000
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def test_verify_finds_corrupt_truncated_and_hostile_entries_and_prune_removes_only_them(cache: Path,
                                                                                       tmp_path: Path) -> None:
    good = _entries(cache)
    assert _json("verify", str(cache))["ok"] == len(good)
    corrupt, truncated = good[0], good[1]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2:] = b"\xff" * (len(data) - len(data) // 2)
    corrupt.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:40])
    fresh = cache / f"jit_fresh-{'1' * 64}-cache"  # as truncated, but written just now: jax may be writing it
    fresh.write_bytes(truncated.read_bytes())
    os.utime(truncated, (1_000_000, 1_000_000))
    outside = tmp_path / "precious"
    outside.write_text("not a cache entry")
    link = cache / f"jit_evil-{'a' * 64}-cache"
    link.symlink_to(outside)
    sparse = cache / f"jit_huge-{'b' * 64}-cache"
    with open(sparse, "wb") as handle:
        handle.truncate(2 << 30)  # 2 GiB, sparse: nothing to decompress, never read whole
    document = _json("verify", str(cache), code=1)
    status = {e["name"]: e for e in document["entries"]}
    assert status[link.name]["status"] == "link"
    for bad in (corrupt, truncated, sparse):
        assert status[bad.name]["status"] == "broken", status[bad.name]
    assert "truncated" in status[truncated.name]["problem"]
    assert document["ok"] == len(good) - 2
    pruned = _json("verify", str(cache), "--prune", code=1)  # the fresh one stays, so broken entries remain
    assert pruned["pruned"] == 4
    assert all(e["pruned"] for e in pruned["entries"]
                                         if e["status"] != "ok" and e["name"] != fresh.name)
    (kept,) = [e for e in pruned["entries"] if e["name"] == fresh.name]
    assert not kept["pruned"]
    assert "may still be writing it" in kept["prune_error"]
    assert fresh.exists()
    fresh.unlink()
    assert outside.read_text() == "not a cache entry"  # the link was removed, never followed
    assert not any(p.exists() or p.is_symlink() for p in (corrupt, truncated, sparse, link))
    assert not cachekeys.record_path(cache, corrupt.name.removesuffix("-cache")).exists()
    assert _json("verify", str(cache))["broken"] == 0


def test_gc_dry_run_removes_nothing_then_removes_oldest_first_and_never_follows_links(cache: Path,
                                                                                      tmp_path: Path) -> None:
    entries = _entries(cache)
    for age, entry in enumerate(entries):  # the first entry is the oldest
        os.utime(entry, (1_000_000 + age, 1_000_000 + age))
    outside = tmp_path / "outside-cache"
    outside.write_bytes(b"x" * 10_000)
    link = cache / f"jit_link-{'d' * 64}-cache"
    link.symlink_to(outside)
    total = sum(e.stat().st_size for e in entries)
    keep = entries[-1].stat().st_size
    planned = _json("gc", str(cache), "--max-bytes", str(keep), "--dry-run")
    assert planned["would_remove"] == len(entries) - 1
    assert planned["removed"] == 0
    assert [r["name"] for r in planned["removals"]] == [e.name for e in entries[:-1]]
    assert all(e.exists() for e in entries)
    done = _json("gc", str(cache), "--max-bytes", str(keep))
    assert done["removed"] == len(entries) - 1
    assert done["removed_bytes"] == total - keep
    assert [e.exists() for e in entries] == [False] * (len(entries) - 1) + [True]
    assert link.is_symlink()
    assert outside.read_bytes() == b"x" * 10_000
    records = list(cachekeys.keys_dir(cache).iterdir())
    assert [r.name for r in records] == [entries[-1].name.removesuffix("-cache") + ".json"]
    text = run_tool("tpu-profile", "cache", "gc", str(cache), "--max-age", "1s")
    assert text.returncode == 0
    assert f"removed {entries[-1].name}" in text.stdout


def test_gc_while_a_job_reads_the_cache(cache: Path, tmp_path: Path) -> None:
    entry = _entries(cache)[0]
    expected = entry.read_bytes()
    with open(entry, "rb") as reader:  # a job that opened an entry keeps reading it whole
        _json("gc", str(cache), "--max-bytes", "0")
        assert reader.read() == expected
    again = run_cache_job(tmp_path, cache, "3", name="after-gc")  # and the next start compiles afresh
    assert again["misses"] >= 1
    assert again["hits"] == 0
    assert again["entries_written"] >= 1


def test_doctor_findings_and_exit_status(cache: Path, tmp_path: Path) -> None:
    env = clean_env(JAX_COMPILATION_CACHE_DIR=str(cache))
    assert _json("doctor", env=env)["errors"] == 0
    cache.chmod(0o777)
    document = _json("doctor", str(cache), code=1, env=env)
    assert "shared_writable" in {f["code"] for f in document["findings"]}
    cache.chmod(0o755)
    env = clean_env(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "other"),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="3600", JAX_COMPILATION_CACHE_MAX_SIZE="1000")
    codes = {f["code"]: f for f in _json("doctor", str(cache), env=env)["findings"]}
    assert {"env_differs", "min_compile_time_high", "size_limit_reached"} <= set(codes)
    assert all(f["fix"] for f in codes.values())
    record = next(cachekeys.keys_dir(cache).iterdir())
    data = json.loads(record.read_text())
    data["jaxlib_version"] = "0.0.1"
    record.write_text(json.dumps(data))
    codes = {f["code"] for f in _json("doctor", str(cache))["findings"]}
    assert "mixed_versions" in codes
    assert _json("inspect", str(cache))["stale_entries"] == 1
    assert _json("gc", str(cache), "--stale")["removed"] == 1
    text = run_tool("tpu-profile", "cache", "doctor", str(tmp_path / "missing"))
    assert text.returncode == 0
    assert "jax creates it" in text.stdout


@pytest.fixture(scope="module")
def other_user() -> str:
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser")
    created = subprocess.run(["useradd", "--no-create-home", OTHER_USER], capture_output=True, text=True)
    if created.returncode not in (0, 9):  # 9: the user exists already
        pytest.skip(f"useradd failed: {created.stderr.strip()}")
    return OTHER_USER


# Imported as root before the child becomes the other user: the interpreter and its packages may live where
# only root can read (a home directory of mode 0700), as they do on many CI machines.
_AS_USER = textwrap.dedent("""
    import os, pwd, sys
    import tpu_tools.cli.profile
    name, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["tpu-profile", *args]
    # the same command once as root, its output dropped: every module it needs is imported before
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        tpu_tools.cli.profile.main()
    except SystemExit:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    user = pwd.getpwnam(name)
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    tpu_tools.cli.profile.main()
""")


def _as_user(user: str, *args: str) -> subprocess.CompletedProcess:
    """tpu-profile ARGS run as `user`: through runuser where that user can run this interpreter."""
    # Not measured by coverage: a process of another user cannot write the run's coverage data (root's files).
    env = clean_env(HOME="/tmp", **UNMEASURED)
    probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", "import tpu_tools"],
                           capture_output=True, env=env, timeout=60)
    if probe.returncode == 0:
        command = ["runuser", "-u", user, "--", *tool_command("tpu-profile"), *args]
    else:
        command = [sys.executable, "-c", _AS_USER, user, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_another_users_directory(template: Path, other_user: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="tt-cache-"))
    try:
        base.chmod(0o755)
        mine = base / "mine"
        shutil.copytree(template, mine, symlinks=True)
        mine.chmod(0o755)
        theirs = base / "theirs"
        theirs.mkdir()
        shutil.chown(theirs, other_user)
        as_root = {f["code"] for f in _json("doctor", str(theirs), code=1)["findings"]}
        assert "other_owner" in as_root  # root would run code that user can plant
        result = _as_user(other_user, "cache", "doctor", str(mine), "--json")
        assert result.returncode == 1, result.stderr
        codes = {f["code"] for f in json.loads(result.stdout)["findings"]}
        assert {"not_writable", "other_owner"} <= codes
        mine.chmod(0o700)
        assert_one_line_error(_as_user(other_user, "cache", "inspect", str(mine)), 1, "permission denied")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_warm_a_function_then_prove_the_fresh_start_hits(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import jax.numpy as jnp

        def mlp(x, w):
            return jnp.tanh(x @ w).sum()
    """))
    env = clean_env(JAX_PLATFORMS="cpu")
    command = [*tool_command("tpu-profile"), "cache", "warm", str(tmp_path / "c1"), "model:mlp", "--arg", "f32[4,8]",
               "--arg", "f32[8,2]", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["proven"]
    assert document["fresh_start"]["misses"] == 0
    assert document["fresh_start"]["hits"] >= 1
    assert document["warming"]["entries_written"] >= 1


def test_warm_a_whole_program(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import sys
        import jax, jax.numpy as jnp
        print(jax.jit(lambda x: x * 3)(jnp.ones(int(sys.argv[1]))).sum())
    """))
    env = clean_env(JAX_PLATFORMS="cpu")
    command = [*tool_command("tpu-profile"), "cache", "warm", str(tmp_path / "c2"), "--", "prog.py", "5"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "proven: the fresh start hit every lookup" in result.stdout


def test_verify_judges_a_garbage_executable_by_its_platform_and_enforces_its_deadline(cache: Path) -> None:
    garbage = zlib.compress((3).to_bytes(4, "big") + b"\x08\x01 not an executable" * 40)
    claimed = cache / f"jit_claimed-{'e' * 64}-cache"  # a key record says it was written on this platform
    claimed.write_bytes(garbage)
    record = json.loads(next(cachekeys.keys_dir(cache).iterdir()).read_text())
    record["key"] = claimed.name.removesuffix("-cache")
    cachekeys.record_path(cache, record["key"]).write_text(json.dumps(record))
    unknown = cache / f"jit_unknown-{'f' * 64}-cache"  # no record: it may belong to another accelerator
    unknown.write_bytes(garbage)
    document = _json("verify", str(cache), "--prune", code=0)
    status = {e["name"]: e for e in document["entries"]}
    assert status[claimed.name]["status"] == "broken"
    assert "does not load on cpu" in status[claimed.name]["problem"]
    assert status[claimed.name]["pruned"]
    assert not claimed.exists()
    assert status[unknown.name]["status"] == "skipped"
    assert unknown.exists()
    for entry in _entries(cache):
        entry.unlink()
    bomb = cache / f"jit_bomb-{'9' * 64}-cache"  # 64 MiB of zeros: inflating it takes far more than 1 ms
    packer = zlib.compressobj(1)
    with open(bomb, "wb") as handle:
        for _ in range(64):
            handle.write(packer.compress(bytes(1 << 20)))
        handle.write(packer.flush())
    slow = _json("verify", str(cache), "--deadline", "0.001", code=1)
    (verdict,) = slow["entries"]
    assert verdict["name"] == bomb.name, verdict
    assert "did not finish within 0.001 s" in verdict["problem"], verdict
    assert bomb.exists()
