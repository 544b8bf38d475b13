"""`tpu-profile cache` against hostile input: a home folder given as the cache, things that are not folders,
figures over a truncated listing, a decompression bomb.

The entries here are files in jax's format written by the test (zlib of a 4-byte compile time and the bytes
that follow): what the commands read is the directory, outside input; a real cache is in test_cache_cli.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from cachejobs import empty_entries
from conftest import assert_one_line_error, clean_env, run_tool, tool_command

DOTFILES = (".bashrc", ".profile", ".gitconfig", "x.swp", "x~", "tmp.x", ".write.tmp", "notes.partial")
TWO_HOURS_AGO = time.time() - 7200


def _json(*args: str, code: int = 0, cwd: Path | None = None) -> dict:
    result = run_tool("tpu-profile", "cache", *args, "--json", cwd=cwd)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def _age(path: Path) -> None:
    os.utime(path, (TWO_HOURS_AGO, TWO_HOURS_AGO), follow_symlinks=False)


def _home(root: Path) -> Path:
    """A home folder: dotfiles and an editor's leftovers, two hours old, and a link into a dotfiles folder."""
    home = root / "home"
    (home / "dotfiles").mkdir(parents=True)
    for name in DOTFILES:
        (home / name).write_text(f"{name} of the user\n")
        _age(home / name)
    (home / "dotfiles" / "vimrc").write_text("set nocompatible\n")
    (home / ".vimrc").symlink_to(home / "dotfiles" / "vimrc")
    _age(home / ".vimrc")
    return home


def _entry(folder: Path, module: str, digit: str, payload: bytes = b"executable", seconds: int = 2) -> Path:
    path = folder / f"{module}-{digit * 64}-cache"
    path.write_bytes(zlib.compress(seconds.to_bytes(4, "big") + payload))
    return path


def _listing(folder: Path) -> dict[str, bytes | str]:
    return {p.name: (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir")
            for p in folder.iterdir()}


@pytest.mark.parametrize("options", [(), ("--max-bytes", "0"), ("--max-age", "1s"), ("--stale",), ("--dry-run",)])
def test_gc_of_a_folder_without_cache_entries_removes_nothing_and_says_so(tmp_path: Path,
                                                                          options: tuple[str, ...]) -> None:
    home = _home(tmp_path)
    before = _listing(home)
    result = run_tool("tpu-profile", "cache", "gc", str(home), *options, env=clean_env(HOME=str(home)))
    assert_one_line_error(result, 1, "holds no JAX compilation cache entry", "nothing removed")
    assert _listing(home) == before
    # the same folder as the current one, named "." (the form '' took before it was refused)
    result = run_tool("tpu-profile", "cache", "gc", ".", *options, cwd=home)
    assert_one_line_error(result, 1, "holds no JAX compilation cache entry")
    assert _listing(home) == before


def test_gc_in_a_cache_that_holds_user_files_removes_only_the_caches_own_leftovers(tmp_path: Path) -> None:
    home = _home(tmp_path)
    kept_entry = _entry(home, "jit_step", "a")
    jax_temp = home / f"_temp_jit_step-{'b' * 64}"  # jax's GFileCache: written under this name, then renamed
    jax_temp.write_bytes(b"half an entry")
    gc_trash = home / ".tpu-tools-removing-0123456789ab"  # a removal cut short between its rename and unlink
    gc_trash.write_bytes(b"removed entry")
    orphan = home / f"jit_gone-{'c' * 64}-atime"
    orphan.write_bytes(b"\0" * 8)
    lookalike = home / "meeting-atime"  # ends like an -atime file, is not one
    lookalike.write_text("agenda")
    for path in (jax_temp, gc_trash, orphan, lookalike, kept_entry):
        _age(path)
    user_files = {name: data for name, data in _listing(home).items()
                  if name in (*DOTFILES, ".vimrc", "dotfiles", lookalike.name)}
    document = _json("gc", str(home))
    assert sorted(r["name"] for r in document["removals"]) == sorted([jax_temp.name, gc_trash.name, orphan.name])
    assert document["removed"] == 3
    assert document["failed"] == 0
    assert document["kept_entries"] == 1
    after = _listing(home)
    assert {name: after.get(name) for name in user_files} == user_files
    assert kept_entry.exists()
    kinds = {o["name"]: o["kind"] for o in _json("inspect", str(home))["other_files"]}
    assert all(kinds[name] == "unknown" for name in DOTFILES if name in kinds), kinds
    # even --max-bytes 0, which takes every entry, leaves the user's files and links
    assert _json("gc", str(home), "--max-bytes", "0")["removed"] == 1
    assert {name: _listing(home).get(name) for name in user_files} == user_files


def test_gc_takes_only_names_of_torch_xlas_form_never_a_link_or_another_decimal_name(tmp_path: Path) -> None:
    torch = tmp_path / "xla-cache"
    torch.mkdir()
    # decimal names that are no 128-bit hash (too short, 2^128 or more, a leading zero): the user's, left alone
    for name in ("183906451839226123458716", "99081234567890123", str(1 << 128), "0" + "1" * 38):
        (torch / name).write_bytes(b"not an entry")
        _age(torch / name)
    before = _listing(torch)
    result = run_tool("tpu-profile", "cache", "gc", str(torch), "--max-bytes", "0")
    assert_one_line_error(result, 1, "holds no JAX compilation cache entry", "nor PyTorch/XLA entry")
    assert _listing(torch) == before
    entry = torch / "184354644579528543404933651337932998225"  # the name of an entry torch_xla 2.9 wrote
    entry.write_bytes(b"\n\x00")
    _age(entry)
    planted = torch / "62555321448160916123956671191264951424"
    planted.symlink_to(tmp_path / "precious")
    (tmp_path / "precious").write_text("kept")
    document = _json("gc", str(torch), "--max-bytes", "0")
    assert [r["name"] for r in document["removals"]] == [entry.name]
    assert document["removed"] == 1
    assert _listing(torch) == {**before, planted.name: _listing(torch)[planted.name]}
    assert (tmp_path / "precious").read_text() == "kept"
    inspected = _json("inspect", str(torch))
    assert {o["name"]: o["kind"] for o in inspected["other_files"]} == {
        **{name: "unknown" for name in before}, planted.name: "link (never followed; not an entry)"}


def test_verify_prune_removes_links_planted_as_entries_never_the_users_links(tmp_path: Path) -> None:
    home = _home(tmp_path)
    planted = home / f"jit_evil-{'d' * 64}-cache"
    planted.symlink_to(home / ".bashrc")
    planted_atime = home / f"jit_evil-{'e' * 64}-atime"  # jax writes -atime files through a link
    planted_atime.symlink_to(home / ".profile")
    document = _json("verify", str(home), "--prune", "--platform", "cpu")
    assert sorted(e["name"] for e in document["entries"] if e["pruned"]) == sorted([planted.name, planted_atime.name])
    assert (home / ".vimrc").is_symlink()
    assert (home / ".bashrc").read_text() == ".bashrc of the user\n"
    assert not planted.is_symlink()
    assert not planted_atime.is_symlink()


@pytest.fixture
def not_directories(tmp_path: Path) -> Iterator[dict[str, tuple[Path, str]]]:
    """Every kind of thing that can stand where a cache directory should: path -> the words naming it."""
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    try:
        yield {"regular file": (tmp_path / "file", "a regular file"), "FIFO": (tmp_path / "fifo", "a FIFO"),
               "device": (Path("/dev/zero"), "a character device"), "socket": (tmp_path / "sock", "a socket"),
               "dangling link": (tmp_path / "dangling", ""), "link to a file": (tmp_path / "to-file", "regular file"),
               "under a file": (tmp_path / "file" / "sub", "")}
    finally:
        listener.close()


@pytest.mark.parametrize("command", ["inspect", "verify", "gc", "warm"])
def test_a_cache_command_on_what_is_not_a_directory_is_one_sentence(
        command: str, not_directories: dict[str, tuple[Path, str]]) -> None:
    for kind, (path, words) in not_directories.items():
        extra = ["train", "--timeout", "60"] if command == "warm" else []
        result = run_tool("tpu-profile", "cache", command, str(path), *extra)
        message = assert_one_line_error(result, 1, str(path), words)
        assert "internal error" not in result.stderr, (kind, message)
        assert message.startswith("tpu-profile: error: "), (kind, message)
        assert not path.is_dir(), kind  # nothing was made in its place


def test_doctor_names_what_stands_in_the_caches_place(not_directories: dict[str, tuple[Path, str]]) -> None:
    for kind, (path, words) in not_directories.items():
        document = _json("doctor", str(path), code=1)
        (finding,) = [f for f in document["findings"] if f["severity"] == "error"]
        assert finding["code"] == "not_a_directory", (kind, finding)
        assert words in finding["message"], (kind, finding)
        assert "remove or rename" in finding["fix"], (kind, finding)


@pytest.fixture(scope="module")
def many_broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """25,000 broken entries (empty files: hard links to a few inodes), more than doctor's 20,000 read."""
    cache = tmp_path_factory.mktemp("many") / "cache"
    cache.mkdir()
    empty_entries(cache, COUNT)
    yield cache
    shutil.rmtree(cache, ignore_errors=True)


COUNT = 25_000
# "N broken" or "N entries jax cannot use" without "at least" before it reads as the whole directory
UNQUALIFIED = re.compile(r"(?<!at least )(?<!of the )\b\d+ (broken|stale|entries jax cannot use)")


def test_inspect_over_a_truncated_listing_says_its_figures_are_lower_bounds(many_broken: Path) -> None:
    document = _json("inspect", str(many_broken), "--limit", "50")
    assert document["entry_count"] == COUNT
    assert document["entries_listed"] == 50
    assert document["truncated"]
    assert document["broken_entries"] == 50
    assert "broken_entries" in document["partial_figures"]
    assert {"stale_entries", "compile_seconds_saved_per_use_s"} <= set(document["partial_figures"])
    text = run_tool("tpu-profile", "cache", "inspect", str(many_broken), "--limit", "50").stdout
    assert f"at least 50 broken of the {COUNT}" in text, text
    assert not UNQUALIFIED.search(text), text
    whole = _json("inspect", str(many_broken), "--limit", str(COUNT))
    assert whole["broken_entries"] == COUNT
    assert whole["partial_figures"] == []
    text = run_tool("tpu-profile", "cache", "inspect", str(many_broken), "--limit", str(COUNT)).stdout
    assert f"0 stale entries (another jaxlib: never read again) and {COUNT} broken of the {COUNT}" in text


def test_doctor_over_more_entries_than_it_reads_says_at_least(many_broken: Path) -> None:
    document = _json("doctor", str(many_broken))
    (broken,) = [f for f in document["findings"] if f["code"] == "broken_entries"]
    assert broken["message"].startswith(f"at least 20000 of the {COUNT} entries jax cannot use"), broken
    assert document["entry_count"] == COUNT
    assert document["entries_read"] == 20000
    text = run_tool("tpu-profile", "cache", "doctor", str(many_broken)).stdout
    assert "at least 20000" in text, text
    assert not UNQUALIFIED.search(text), text


def test_verify_and_gc_over_a_truncated_listing_count_every_entry(many_broken: Path) -> None:
    document = _json("verify", str(many_broken), "--limit", "20", "--platform", "cpu", code=1)
    assert document["checked"] == 20
    assert document["broken"] == 20
    assert document["entry_count"] == COUNT
    assert document["entries_listed"] == 20
    assert "broken" in document["partial_figures"]
    text = run_tool("tpu-profile", "cache", "verify", str(many_broken), "--limit", "20", "--platform", "cpu").stdout
    assert f"20 of the {COUNT} entries (--limit) checked" in text
    assert f"other {COUNT - 20} were not read" in text
    planned = _json("gc", str(many_broken), "--max-age", "87600h", "--dry-run", "--limit", "50")
    assert planned["would_remove"] == 0
    assert planned["kept_entries"] == COUNT  # every entry stays, not only 50
    assert planned["entries_considered"] == 50
    assert planned["entry_count"] == COUNT
    text = run_tool("tpu-profile", "cache", "gc", str(many_broken), "--max-age", "87600h", "--dry-run", "--limit",
                    "50").stdout
    assert f"{COUNT} entries kept" in text
    assert f"only the first 50 of the {COUNT} entries" in text


MEASURE = textwrap.dedent("""
    import json, resource, subprocess, sys
    run = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    # the largest resident set of the program and of every process it waited for (the verifying child)
    print(json.dumps({"rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "code": run.returncode,
                      "stdout": run.stdout, "stderr": run.stderr}))
""")


def _verify_measured(cache: Path) -> dict:
    command = [sys.executable, "-c", MEASURE, *tool_command("tpu-profile"), "cache", "verify", str(cache), "--json",
               "--platform", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    assert "Traceback" not in measured["stderr"], measured["stderr"]
    return {**measured, "document": json.loads(measured["stdout"])}


def test_verify_refuses_a_decompression_bomb_without_reading_it(tmp_path: Path) -> None:
    plain, bombed = tmp_path / "plain", tmp_path / "bombed"
    plain.mkdir()
    bombed.mkdir()
    _entry(plain, "jit_small", "1", payload=b"not an executable" * 8)
    _entry(bombed, "jit_small", "1", payload=b"not an executable" * 8)
    bomb = bombed / f"jit_bomb-{'2' * 64}-cache"
    squeeze = zlib.compressobj(9)
    with open(bomb, "wb") as handle:  # 200 MiB of zeros behind a compile time, in about 200 KB
        handle.write(squeeze.compress((1).to_bytes(4, "big")))
        for _ in range(200):
            handle.write(squeeze.compress(bytes(1 << 20)))
        handle.write(squeeze.flush())
    assert bomb.stat().st_size < 300_000
    baseline = _verify_measured(plain)
    measured = _verify_measured(bombed)
    verdicts = {e["name"]: e for e in measured["document"]["entries"]}
    assert verdicts[bomb.name]["status"] == "broken", verdicts[bomb.name]
    assert "decompression bomb" in verdicts[bomb.name]["problem"]
    assert measured["code"] == 1
    assert verdicts[f"jit_small-{'1' * 64}-cache"]["status"] == baseline["document"]["entries"][0]["status"]
    # read whole, this bomb took 400 MiB more than the plain cache; refused while counting, a piece (1 MiB) or so
    grown_mib = (measured["rss_kib"] - baseline["rss_kib"]) / 1024
    assert grown_mib < 32, (baseline["rss_kib"], measured["rss_kib"])


def test_a_sub_cache_and_other_files_past_their_limits_are_not_understated(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    autotune = cache / "xla_gpu_per_fusion_autotune_cache_dir"
    autotune.mkdir(parents=True)
    _entry(cache, "jit_step", "a")
    first = autotune / "0"
    first.write_bytes(b"x")
    for index in range(1, 10_050):  # past the 10,000 files counted in a sub-cache; hard links, no data
        os.link(first, autotune / str(index))
    for index in range(45):  # past the 40 rows of the other files' table
        (cache / f"note-{index}").write_text("x")
    (sub,) = _json("inspect", str(cache))["subcaches"]
    assert sub["truncated"]
    assert sub["files"] == 10_000
    text = run_tool("tpu-profile", "cache", "inspect", str(cache)).stdout
    assert "at least 10000" in text, text
    assert "... 5 more (--json)" in text, text
