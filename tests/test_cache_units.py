"""The cache formats and plans as units: names, key records, entry heads, log lines, gc's order (Hypothesis for
what comes from outside)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_tools.instrument import cachekeys
from tpu_tools.instrument.cachewatch import CacheWatch
from tpu_tools.profile.cachedir import CacheScan, Entry, compile_time_of, filesystem_of, is_network_filesystem
from tpu_tools.profile.cachegc import plan

HEX = "0123456789abcdef" * 4


def test_entry_names_and_keys() -> None:
    assert cachekeys.split_entry_name(f"jit_f-{HEX}-cache") == ("jit_f", HEX)
    assert cachekeys.split_entry_name(f"jit_a-b-{HEX}-cache") == ("jit_a-b", HEX)
    assert cachekeys.split_entry_name(f"jit_f-{HEX}-atime") is None
    assert cachekeys.split_entry_name(f"jit_f-{HEX[:-1]}-cache") is None
    assert cachekeys.split_key(f"jit_f-{HEX}") == ("jit_f", HEX)


def test_differing_components_in_jax_order() -> None:
    now = {"computation": "a", "XLA flags": "x", "compile_options": "o", "extra": "1"}
    before = {"computation": "a", "XLA flags": "y", "compile_options": "p"}
    assert cachekeys.differing_components(now, before) == ["XLA flags", "compile_options", "extra"]


def test_compile_time_from_an_entry_head() -> None:
    entry = zlib.compress((7).to_bytes(4, "big") + b"executable" * 100)
    assert compile_time_of(entry[:64]) == (7, "zlib", None)
    assert compile_time_of(b"")[2] == "empty file"
    assert compile_time_of(b"\0\0\0\0")[2].startswith("not a compressed")
    assert compile_time_of(zlib.compress(b"ab"))[2] == "truncated before its header"


@given(st.binary(max_size=512))
def test_any_entry_head_gives_a_verdict_never_an_exception(head: bytes) -> None:
    seconds, compression, problem = compile_time_of(head)
    assert seconds is None or 0 <= seconds < 2 ** 32
    assert problem is None or isinstance(problem, str)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                max_size=4), max_leaves=20))
def test_key_records_from_any_json_never_raise(document: object) -> None:
    assert cachekeys.KeyRecord.from_dict(document) is None or isinstance(document, dict)


def test_key_record_round_trip_and_hostile_files(tmp_path: Path) -> None:
    record = cachekeys.KeyRecord(f"jit_f-{HEX}", {"computation": "a"}, "0.1", "0.2", "cpu", "v", ["--xla_x=1"],
                                 "host", 12, "me", 1.5)
    cachekeys.write_key_record(tmp_path, record)
    assert cachekeys.read_key_record(cachekeys.record_path(tmp_path, record.key)) == record
    assert cachekeys.records_for_module(tmp_path, "jit_f") == [record]
    assert cachekeys.records_for_module(tmp_path, "jit_g") == []
    big = cachekeys.keys_dir(tmp_path) / f"jit_f-{'1' * 64}.json"
    big.write_text(json.dumps({**record.to_dict(), "pad": "x" * cachekeys.MAX_KEY_RECORD_BYTES}))
    assert cachekeys.read_key_record(big) is None
    link = cachekeys.keys_dir(tmp_path) / f"jit_f-{'2' * 64}.json"
    link.symlink_to(cachekeys.record_path(tmp_path, record.key))
    assert cachekeys.read_key_record(link) is None  # never through a link
    wrong = dict(record.to_dict(), pid=True, xla_flags="not a list", key="no hash")
    assert cachekeys.KeyRecord.from_dict(wrong) is None


@settings(max_examples=200)
@given(st.text(max_size=300))
def test_the_watch_takes_any_log_line(message: str) -> None:
    watch = CacheWatch()
    watch.on_log(message)
    watch.on_log(f"get_cache_key hash of serialized computation: {HEX}")
    watch.on_log(message)
    assert watch.snapshot()["lookups"] == 0


def test_the_watch_reads_jax_key_lines() -> None:
    watch = CacheWatch()
    for line in (f"get_cache_key hash of serialized computation: {HEX}",
                 "Including XLA flag in cache key: --xla_a=1", "Including XLA flag in cache key: --xla_a=1",
                 f"get_cache_key hash of serialized XLA flags: {HEX[::-1]}",
                 f"get_cache_key hash after serializing custom_hook: {HEX}",
                 f"PERSISTENT COMPILATION CACHE MISS for 'jit_f' with key 'jit_f-{HEX}'"):
        watch.on_log(line)
    pending = watch._local.pending
    assert pending.components == {"computation": HEX, "XLA flags": HEX[::-1]}
    assert pending.flags == ["--xla_a=1"]
    assert pending.module == "jit_f"
    assert pending.key == f"jit_f-{HEX}"


def _entry(name: str, size: int, used: float, jaxlib: str | None = None) -> Entry:
    return Entry(name, "jit_f", size, used, used, 0, "zlib", None, jaxlib)


def test_gc_plans_least_recently_used_first() -> None:
    scan = CacheScan("/c", "me", 0, "0700", "ext4", True, installed_jaxlib="0.2")
    scan.entries = [_entry("b", 10, 200.0), _entry("a", 10, 100.0), _entry("c", 10, 300.0, jaxlib="0.1")]
    scan.entry_count, scan.total_bytes = 3, 30
    removals, kept, kept_bytes = plan(scan, max_bytes=15, max_age_s=None, stale=False, now=400.0)
    assert [r.name for r in removals] == ["a", "b"]
    assert (kept, kept_bytes) == (1, 10)
    removals, _, _ = plan(scan, max_bytes=None, max_age_s=250.0, stale=True, now=400.0)
    assert [r.name for r in removals] == ["a", "c"]  # too old, and another jaxlib's
    assert plan(scan, None, None, False, now=400.0)[0] == []


def test_filesystem_of_a_path(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("none / ext4 rw 0 0\nserver:/x /mnt/shared nfs4 rw 0 0\nbad line\n")
    assert filesystem_of(Path("/mnt/shared/jax"), mounts=str(mounts)) == "nfs4"
    assert filesystem_of(Path("/mnt/sharedother"), mounts=str(mounts)) == "ext4"
    assert is_network_filesystem("nfs4")
    assert is_network_filesystem("fuse.gcsfuse")
    assert not is_network_filesystem("ext4")
    assert not is_network_filesystem(None)


def test_a_key_record_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    cachekeys.keys_dir(cache).symlink_to(elsewhere)
    record = cachekeys.KeyRecord(f"jit_f-{HEX}", {"computation": "a"})
    with pytest.raises(OSError, match="tpu-tools-keys is not a directory"):
        cachekeys.write_key_record(cache, record)
    assert list(elsewhere.iterdir()) == []
