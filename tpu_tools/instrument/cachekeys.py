"""The names in a JAX persistent compilation cache, and the key records tpu-tools keeps beside its entries.

JAX (jax/_src/lru_cache.py, compilation_cache.py, cache_key.py) stores one
compiled program per file, `<module>-<sha256 hex>-cache`: the compressed
(zlib, or zstd when zstandard is installed) bytes of a 4-byte big-endian
compile time in whole seconds followed by the serialised executable. With a
size limit it also keeps `<module>-<hex>-atime` (last use, 8 bytes
little-endian nanoseconds) and a `.lockfile`. The hex is one SHA-256 over the
key's components in order (the program, jaxlib's version, the backend and its
version, XLA flags, compile options, the device topology, the compression, a
custom hook), so a finished key cannot say which component changed.

A key record (`tpu-tools-keys/<module>-<hex>.json`, written by the agent when
its job writes an entry) keeps each component's own hash and the readable
parts (versions, platform, XLA flags, writer): enough to name the component
that differs between a missed key and the nearest entry, to tell entries of
another jaxlib apart, and to know who wrote a shared directory. JAX globs
only `*-cache` at the top level, so the records never disturb it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.shorten import shorten

ENTRY_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
LOCK_FILE = ".lockfile"
KEYS_DIR = "tpu-tools-keys"
KEY_RECORD_SUFFIX = ".json"
KEY_RECORD_SCHEMA = "tpu-tools/cache-key/v1"
MAX_KEY_RECORD_BYTES = 64 * 1024
# The order in which jax's cache_key.get hashes the components.
COMPONENTS = ("computation", "jax_lib version", "backend version", "XLA flags", "compile_options",
              "accelerator_config", "compression", "custom_hook")
# What each component covers, for explanations.
COMPONENT_TEXT = {
    "computation": "the program itself (its code, input shapes and dtypes, static arguments, shardings)",
    "jax_lib version": "the jaxlib version",
    "backend version": "the platform or its version (libtpu, CUDA driver)",
    "XLA flags": "XLA_FLAGS, LIBTPU_INIT_ARGS or --xla arguments",
    "compile_options": "the compile options (jax config that reaches XLA, device assignment, debug options)",
    "accelerator_config": "the device topology (chips, slice shape)",
    "compression": "the compression of entries (zlib or zstandard)",
    "custom_hook": "jax's custom cache-key hook",
}
_ENTRY_NAME = re.compile(r"^(?P<module>.+)-(?P<hash>[0-9a-f]{64})-cache$")
_RECORD_NAME = re.compile(r"^(?P<module>.+)-(?P<hash>[0-9a-f]{64})\.json$")


def split_entry_name(name: str) -> tuple[str, str] | None:
    """"jit_f-<64 hex>-cache" -> ("jit_f", "<64 hex>"); None for names that are not entries."""
    match = _ENTRY_NAME.match(name)
    return (match["module"], match["hash"]) if match else None


def split_key(key: str) -> tuple[str, str] | None:
    """A cache key "jit_f-<64 hex>" -> ("jit_f", "<64 hex>")."""
    return split_entry_name(key + ENTRY_SUFFIX)


@dataclass
class KeyRecord:
    """Why a cache entry has the key it has: each component's hash, and the readable parts."""

    key: str  # "<module>-<hex>", the entry's name without "-cache"
    components: dict[str, str]  # component name -> its own sha256 hex
    jax_version: str | None = None
    jaxlib_version: str | None = None
    platform: str | None = None
    platform_version: str | None = None
    xla_flags: list[str] = field(default_factory=list)
    host: str | None = None
    pid: int | None = None
    user: str | None = None
    written_unix_s: float | None = None

    @property
    def module(self) -> str:
        parts = split_key(self.key)
        return parts[0] if parts else self.key

    def to_dict(self) -> dict[str, Any]:
        return {"schema": KEY_RECORD_SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> KeyRecord | None:
        """The record in a parsed document; None when it is not one (records are outside input)."""
        if not isinstance(data, dict) or data.get("schema") != KEY_RECORD_SCHEMA:
            return None
        key, components = data.get("key"), data.get("components")
        if not isinstance(key, str) or split_key(key) is None or not isinstance(components, dict):
            return None

        def text(name: str) -> str | None:
            value = data.get(name)
            return shorten(value, 1024) if isinstance(value, str) else None

        pid = data.get("pid")
        written = data.get("written_unix_s")
        flags = data.get("xla_flags")
        return cls(key, {str(k)[:64]: str(v)[:128] for k, v in list(components.items())[:32]},
                   text("jax_version"), text("jaxlib_version"), text("platform"), text("platform_version"),
                   [str(f)[:1024] for f in flags[:256]] if isinstance(flags, list) else [],
                   text("host"), pid if isinstance(pid, int) and not isinstance(pid, bool) else None, text("user"),
                   float(written) if isinstance(written, (int, float)) and not isinstance(written, bool) else None)


def keys_dir(cache_dir: str | os.PathLike[str]) -> Path:
    return Path(cache_dir) / KEYS_DIR


def record_path(cache_dir: str | os.PathLike[str], key: str) -> Path:
    return keys_dir(cache_dir) / f"{key}{KEY_RECORD_SUFFIX}"


def read_key_record(path: Path) -> KeyRecord | None:
    """One record file, never following a link and never reading more than a record can hold."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            raw = handle.read(MAX_KEY_RECORD_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_KEY_RECORD_BYTES:
        return None
    try:
        return KeyRecord.from_dict(json.loads(raw))
    except ValueError:
        return None


def write_key_record(cache_dir: str | os.PathLike[str], record: KeyRecord) -> None:
    """Write a record complete or not at all (temporary name, then rename); raises OSError."""
    folder = keys_dir(cache_dir)
    folder.mkdir(exist_ok=True)
    if not stat.S_ISDIR(os.lstat(folder).st_mode):  # a link planted there is never written through
        raise OSError(f"{folder} is not a directory")
    final = record_path(cache_dir, record.key)
    temp = folder / f".{record.key}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temp, flags, 0o644)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(record.to_dict(), handle)
        os.replace(temp, final)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def records_for_module(cache_dir: str | os.PathLike[str], module: str, limit: int = 256,
                       names_limit: int = 50_000) -> list[KeyRecord]:
    """The key records of one module's entries (at most `limit` read among `names_limit` names: bounded work
    in a job)."""
    folder = keys_dir(cache_dir)
    found: list[KeyRecord] = []
    try:
        with os.scandir(folder) as names:
            for index, item in enumerate(names):
                if index >= names_limit:
                    break
                match = _RECORD_NAME.match(item.name)
                if not match or match["module"] != module:
                    continue
                record = read_key_record(Path(item.path))
                if record is not None:
                    found.append(record)
                if len(found) >= limit:
                    break
    except OSError:
        return found
    return found


def differing_components(now: dict[str, str], before: dict[str, str]) -> list[str]:
    """The components (in jax's order) whose hashes differ between two keys' records."""
    names = [c for c in COMPONENTS if c in now or c in before]
    names += sorted((set(now) | set(before)) - set(COMPONENTS))
    return [c for c in names if now.get(c) != before.get(c)]
