"""A job's persistent compilation cache, seen from inside: hits, misses, writes, why a key missed, late settings.

JAX tells what happens to each compile through `jax.monitoring`
(`compile_requests_use_cache` for a lookup, `cache_hits`, `cache_misses`, which
JAX records when it *writes* an entry, and `compile_time_saved_sec`) and, at
DEBUG level, through its loggers: `jax._src.cache_key` logs each key
component's own hash and the XLA flags it hashes, `jax._src.compiler` names the
module and key of each hit and miss. `CacheWatch` raises those two loggers to
DEBUG with a filter in front that takes the records and drops them, unless the
job's own logging configuration would have shown them. On a miss it compares
the key's component hashes with the nearest key of the same module, among the
keys this process computed and the key records beside the directory's
entries (`cachekeys`), and names the components that differ. It writes such a
record for each entry the job writes.

The startup contract: XLA_FLAGS and LIBTPU_INIT_ARGS are read when the
backend starts (taken here as the first compile), and the cache directory is
fixed at the first cache lookup that had one. A value changed later does
nothing to the compiler, and XLA_FLAGS changed later still changes every
later cache key; the snapshot reports each as "set too late: no effect".
Nothing here raises into the job: every callback swallows its own errors.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import socket
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_tools.instrument import cachekeys
from tpu_tools.shorten import shorten

LOOKUP_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
HIT_EVENT = "/jax/compilation_cache/cache_hits"
WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # recorded by JAX when it writes an entry
SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
KEY_LOGGER = "jax._src.cache_key"
COMPILER_LOGGER = "jax._src.compiler"
CONTRACT_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
ENV_KEY_RECORDS = "TPU_TOOLS_CACHE_KEY_RECORDS"  # "0": write no key records into the cache directory
MAX_MISSES = 50  # the most recent explained misses kept
MAX_KEYS = 4096  # keys of this process remembered for explanations
TOO_LATE = "set too late: no effect"

_COMPONENT = re.compile(r"^get_cache_key hash of serialized (?P<name>.+): (?P<hash>[0-9a-f]{64})$")
_FINAL = re.compile(r"^get_cache_key hash after serializing custom_hook: (?P<hash>[0-9a-f]{64})$")
_FLAG = re.compile(r"^Including XLA flag in cache key: (?P<flag>.*)$")
_LOOKED_UP = re.compile(r"^(?:Persistent compilation cache hit|PERSISTENT COMPILATION CACHE MISS) for "
                        r"'(?P<module>[^']*)' with key '(?P<key>[^']*)'$")


@dataclass
class ExplainedMiss:
    """One lookup that missed, and the key components that differ from the nearest known key."""

    module: str
    key: str | None
    time_unix_s: float
    differing: list[str]  # component names, in jax's order; empty when unknown or when no entry of the module
    explanation: str  # one line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LateSetting:
    setting: str  # "XLA_FLAGS", "LIBTPU_INIT_ARGS" or "jax_compilation_cache_dir"
    in_effect: str | None
    now: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Pending:
    """The key being computed and looked up on one thread."""

    components: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    final_hash: str | None = None
    module: str | None = None
    key: str | None = None
    looked_up: bool = False
    hit: bool = False


def _describe(component: str, now: cachekeys.KeyRecord, before: cachekeys.KeyRecord) -> str:
    if component == "XLA flags":
        added = sorted(set(now.xla_flags) - set(before.xla_flags))
        removed = sorted(set(before.xla_flags) - set(now.xla_flags))
        parts = [f"now also {' '.join(added)}" if added else "", f"no longer {' '.join(removed)}" if removed else ""]
        detail = "; ".join(p for p in parts if p)
        return f"XLA flags ({detail})" if detail else "XLA flags"
    if component == "jax_lib version" and now.jaxlib_version != before.jaxlib_version:
        return f"jaxlib version (now {now.jaxlib_version}, entry {before.jaxlib_version})"
    if component == "backend version" and now.platform_version != before.platform_version:
        return f"backend version (now {now.platform_version}, entry {before.platform_version})"
    return f"{component}: {cachekeys.COMPONENT_TEXT.get(component, component)}"


class _Capture(logging.Filter):
    """Takes jax's key and lookup records; drops those the job's own logging would not have shown."""

    def __init__(self, watch: CacheWatch, logger: logging.Logger, level: int):
        super().__init__()
        self.watch = watch
        self.logger = logger
        self.level = level  # the logger's own level before it was raised to DEBUG

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self.watch.on_log(record.getMessage())
        except Exception:  # noqa: BLE001 never into the job
            pass
        shown = self.level if self.level != logging.NOTSET else (
            self.logger.parent.getEffectiveLevel() if self.logger.parent else logging.WARNING)
        return record.levelno >= shown


class CacheWatch:
    """The per-process figures of the persistent compilation cache (one per process: `watch()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._jax: Any = None
        self.installed = False
        self.lookups = 0
        self.hits = 0
        self.misses = 0
        self.entries_written = 0
        self.seconds_saved_s = 0.0
        self.key_records_written = 0
        self.key_record_error: str | None = None
        self.dir_in_use: str | None = None
        self._contract_env: dict[str, str | None] | None = None  # env when the backend started
        self._misses: deque[ExplainedMiss] = deque(maxlen=MAX_MISSES)
        self._keys: dict[str, cachekeys.KeyRecord] = {}  # key -> record, this process's keys
        self._versions: dict[str, str | None] = {}

    def install(self, jax_module: Any) -> None:
        """Listen to an imported jax (once); never raises."""
        with self._lock:
            if self.installed:
                return
            self.installed = True
        try:
            self._jax = jax_module
            self._versions = {"jax_version": getattr(jax_module, "__version__", None),
                              "jaxlib_version": _jaxlib_version()}
            monitoring = jax_module.monitoring
            monitoring.register_event_listener(self._on_event)
            monitoring.register_event_duration_secs_listener(self._on_duration)
            for name in (KEY_LOGGER, COMPILER_LOGGER):
                logger = logging.getLogger(name)
                capture = _Capture(self, logger, logger.level)
                logger.filters.insert(0, capture)  # ahead of other filters, which may drop what we need
                if logger.getEffectiveLevel() > logging.DEBUG:
                    logger.setLevel(logging.DEBUG)
        except Exception as error:  # noqa: BLE001 a jax without these hooks: figures stay empty
            self.key_record_error = shorten(f"could not listen to jax: {type(error).__name__}: {error}", 300)

    # --- callbacks, on the compiling thread -------------------------------------------------------

    def _pending(self) -> _Pending:
        pending = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = _Pending()
        return pending

    def on_log(self, message: str) -> None:
        component = _COMPONENT.match(message)
        if component:
            pending = self._pending()
            if component["name"] == cachekeys.COMPONENTS[0]:  # a new key starts
                pending = self._local.pending = _Pending()
            pending.components[component["name"]] = component["hash"]
            return
        flag = _FLAG.match(message)
        if flag:
            pending = self._pending()
            if flag["flag"] not in pending.flags:  # jax logs each flag twice
                pending.flags.append(flag["flag"])
            return
        final = _FINAL.match(message)
        if final:
            self._pending().final_hash = final["hash"]
            return
        looked_up = _LOOKED_UP.match(message)
        if looked_up:
            pending = self._pending()
            pending.module, pending.key = looked_up["module"], looked_up["key"]

    def _on_event(self, event: str, **kwargs: Any) -> None:
        try:
            if event == LOOKUP_EVENT:
                self._on_lookup()
            elif event == HIT_EVENT:
                pending = self._pending()
                pending.hit = True
                with self._lock:
                    self.hits += 1
            elif event == WRITE_EVENT:
                with self._lock:
                    self.entries_written += 1
                self._write_record(self._pending())
        except Exception:  # noqa: BLE001 a listener of JAX's never raises into the job
            pass

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        try:
            if event == SAVED_EVENT:
                with self._lock:
                    self.seconds_saved_s += max(0.0, float(duration))
            elif event == COMPILE_EVENT:
                self._start_contract()
                pending = self._pending()
                self._local.pending = _Pending()
                if pending.looked_up and not pending.hit:
                    self._explain(pending)
        except Exception:  # noqa: BLE001 a listener of JAX's never raises into the job
            pass

    def _on_lookup(self) -> None:
        self._start_contract()
        # jax computes keys and "looks up" even with no directory set (it finds nothing): not a lookup
        if self.dir_in_use is None and not self._configured_dir():
            return
        pending = self._pending()
        pending.looked_up = True
        with self._lock:
            self.lookups += 1
            if self.dir_in_use is None:
                self.dir_in_use = self._configured_dir()

    def _start_contract(self) -> None:
        if self._contract_env is None:
            self._contract_env = {name: os.environ.get(name) for name in CONTRACT_ENV}

    def _configured_dir(self) -> str | None:
        try:
            value = self._jax.config.jax_compilation_cache_dir
        except AttributeError:  # a jax without the option
            return None
        return str(value) if value else None

    # --- records and explanations -----------------------------------------------------------------

    def _record(self, pending: _Pending) -> cachekeys.KeyRecord | None:
        if pending.key is None:
            return None
        platform, platform_version = _platform(self._jax)
        try:
            user: str | None = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry for this uid (containers)
            user = None
        return cachekeys.KeyRecord(pending.key, dict(pending.components), self._versions.get("jax_version"),
                                   self._versions.get("jaxlib_version"), platform, platform_version,
                                   list(pending.flags), socket.gethostname(), os.getpid(), user, time.time())

    def _remember(self, record: cachekeys.KeyRecord) -> None:
        with self._lock:
            if len(self._keys) < MAX_KEYS:
                self._keys[record.key] = record

    def _write_record(self, pending: _Pending) -> None:
        record = self._record(pending)
        directory = self.dir_in_use
        if record is None or directory is None or os.environ.get(ENV_KEY_RECORDS) == "0":
            return
        self._remember(record)
        try:
            cachekeys.write_key_record(directory, record)
            with self._lock:
                self.key_records_written += 1
        except OSError as error:  # a read-only shared cache: the entry is JAX's business, the record ours
            self.key_record_error = shorten(f"{type(error).__name__}: {error}", 300)

    def _explain(self, pending: _Pending) -> None:
        with self._lock:
            self.misses += 1
        record = self._record(pending)
        if record is None:
            self._add_miss(ExplainedMiss("?", None, time.time(), [], "the key was not seen (jax logged no key)"))
            return
        self._remember(record)
        module = record.module
        with self._lock:
            known = [r for r in self._keys.values() if r.module == module and r.key != record.key]
        directory = self.dir_in_use
        on_disk: list[cachekeys.KeyRecord] = []
        if directory is not None:
            on_disk = [r for r in cachekeys.records_for_module(directory, module) if r.key != record.key]
        candidates = [*known, *on_disk]
        if not candidates:
            if directory is not None and _has_entries_of(directory, module, record.key):
                text = (f"{module}: the directory has entries of this module but no key records for them "
                        "(written without the tpu-tools agent): the differing component cannot be told")
            else:
                text = f"{module}: no entry of this module in the cache yet (its first compile with this cache)"
            self._add_miss(ExplainedMiss(module, record.key, time.time(), [], text))
            return
        def distance(other: cachekeys.KeyRecord) -> tuple[int, bool]:
            # fewest differing components; on a tie, the same program (a key that differs only around it)
            differing = cachekeys.differing_components(record.components, other.components)
            return len(differing), "computation" in differing

        nearest = min(candidates, key=distance)
        differing = cachekeys.differing_components(record.components, nearest.components)
        if not differing:
            text = f"{module}: the same key as an entry that could not be read (see jax's warning)"
        else:
            text = f"{module}: differs from the nearest entry in " + "; ".join(
                _describe(c, record, nearest) for c in differing)
        self._add_miss(ExplainedMiss(module, record.key, time.time(), differing, shorten(text, 2000)))

    def _add_miss(self, miss: ExplainedMiss) -> None:
        with self._lock:
            self._misses.append(miss)

    # --- the startup contract ---------------------------------------------------------------------

    def late_settings(self, configured: str | None) -> list[LateSetting]:
        """The settings changed after they took effect; `configured` is the cache directory set now."""
        late: list[LateSetting] = []
        started = self._contract_env
        if started is not None:
            for name in CONTRACT_ENV:
                now = os.environ.get(name)
                if now != started.get(name):
                    late.append(LateSetting(name, started.get(name), now,
                                            f"{name} {TOO_LATE} (changed after the backend started; it still "
                                            "changes every later cache key)"))
        if self.dir_in_use is not None and configured != self.dir_in_use:
            late.append(LateSetting("jax_compilation_cache_dir", self.dir_in_use, configured,
                                    f"jax_compilation_cache_dir {TOO_LATE} (the cache was opened at the first "
                                    "compile; set it before)"))
        return late

    def snapshot(self) -> dict[str, Any]:
        """The figures the agent serves."""
        configured = self._configured_dir() if self._jax is not None else None
        with self._lock:
            figures: dict[str, Any] = {
                "listening": self.installed and self._jax is not None,
                "dir_configured": configured,
                "dir_in_use": self.dir_in_use,
                "lookups": self.lookups,
                "hits": self.hits,
                "misses": self.misses,
                "entries_written": self.entries_written,
                "seconds_saved_s": self.seconds_saved_s,
                "key_records_written": self.key_records_written,
                "key_record_error": self.key_record_error,
                "recent_misses": [m.to_dict() for m in self._misses],
            }
        figures["set_too_late"] = [s.to_dict() for s in self.late_settings(configured)]  # one read of jax's config
        figures["host"] = socket.gethostname()
        return figures


def _has_entries_of(directory: str, module: str, key: str, limit: int = 20_000) -> bool:
    try:
        with os.scandir(directory) as names:
            for index, item in enumerate(names):
                if index >= limit:
                    return False
                parts = cachekeys.split_entry_name(item.name)
                if parts and parts[0] == module and f"{parts[0]}-{parts[1]}" != key:
                    return True
    except OSError:
        return False
    return False


def _jaxlib_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def _platform(jax_module: Any) -> tuple[str | None, str | None]:
    import importlib

    try:
        backend = importlib.import_module("jax.extend.backend").get_backend()
        return str(backend.platform), shorten(str(backend.platform_version), 1024)
    except Exception:  # noqa: BLE001 a jax without jax.extend's backend, or one not started: unknown
        return None, None


_watch = CacheWatch()


def watch() -> CacheWatch:
    """This process's cache watch (jax keeps monitoring listeners for good: one per process)."""
    return _watch
