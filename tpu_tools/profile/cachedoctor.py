"""`tpu-profile cache doctor`: one finding per known trap of a compilation cache, each with its fix.

The settings a job would use come from the environment JAX reads them from
(JAX_COMPILATION_CACHE_DIR, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS,
JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES, JAX_COMPILATION_CACHE_MAX_SIZE);
the directory's state from `cachedir.scan`; who writes it from the key records. PyTorch/XLA's settings
(XLA_PERSISTENT_CACHE_PATH, XLA_PERSISTENT_CACHE_READ_ONLY) are checked where they are set or the directory
holds its entries; its entries have no key records, so its writers are the running jobs that use the directory.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tpu_tools.parsing import parse_number
from tpu_tools.profile.cachedir import (
    JAX,
    TORCH_XLA,
    CacheDirError,
    CacheScan,
    is_network_filesystem,
    scan,
    user_name,
    what_is,
)
from tpu_tools.shorten import shorten

SCHEMA = "tpu-tools/cache-doctor/v1"
ENV_DIR = "JAX_COMPILATION_CACHE_DIR"
ENV_MIN_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
ENV_MIN_SIZE = "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"
ENV_MAX_SIZE = "JAX_COMPILATION_CACHE_MAX_SIZE"
ENV_TORCH_XLA_DIR = "XLA_PERSISTENT_CACHE_PATH"
ENV_TORCH_XLA_READ_ONLY = "XLA_PERSISTENT_CACHE_READ_ONLY"
JAX_DEFAULT_MIN_TIME_S = 1.0
HIGH_MIN_TIME_S = 60.0  # few programs take longer than this to compile: nearly nothing would be cached
HIGH_MIN_SIZE = 1 << 30
FULL_FRACTION = 0.9


@dataclass
class Finding:
    code: str
    severity: str  # "error", "warning" or "info"
    message: str
    fix: str


@dataclass
class DoctorReport:
    path: str
    findings: list[Finding] = field(default_factory=list)
    scan: CacheScan | None = None

    @property
    def has_error(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def report(self) -> DoctorDocument:
        """The `tpu-tools/cache-doctor/v1` document."""
        read = self.scan
        return DoctorDocument(
            schema=SCHEMA, path=self.path, errors=sum(f.severity == "error" for f in self.findings),
            entry_count=read.entry_count if read else None, entries_read=len(read.entries) if read else None,
            warnings=sum(f.severity == "warning" for f in self.findings), findings=self.findings)


class DoctorDocument(msgspec.Struct, kw_only=True):
    """`tpu-profile cache doctor`'s document, in its JSON key order."""

    schema: str
    path: str
    errors: int
    # how many entries the findings were judged on, of how many (None when DIR could not be read)
    entry_count: int | None
    entries_read: int | None
    warnings: int
    findings: list[Finding]


def _number(env: dict[str, str], name: str) -> float | None:
    text = env.get(name)
    if text is None or not text.strip():
        return None
    try:  # the one parser of numbers: ASCII digits, finite (float() takes "١", "1_0" and "nan")
        return float(parse_number(text.strip(), name))
    except ValueError:
        return None


@dataclass(frozen=True)
class RunningJobs:
    """This user's running agent jobs: the cache directory each uses, and those that wrote entries into it."""

    dirs: dict[str, str] = field(default_factory=dict)  # "pid (tag)" -> directory
    writers: frozenset[str] = frozenset()  # the jobs ("pid (tag)") that wrote entries into their directory


def running_jobs(timeout_s: float = 2.0) -> RunningJobs:
    """Ask this user's running agent jobs for their caches; never raises."""
    from tpu_tools.metrics.agent_client import query_agents

    try:
        scan = query_agents(timeout_s)
    except Exception:  # noqa: BLE001 an unsafe or missing runtime directory: no jobs to compare with
        return RunningJobs()
    found: dict[str, str] = {}
    writers: set[str] = set()
    for result in scan.results:
        cache = result.snapshot.compilation_cache if result.snapshot is not None else None
        if cache is not None and cache.dir_in_use:
            who = f"{result.pid}" + (f" ({result.tag})" if result.tag else "")
            found[who] = cache.dir_in_use
            if cache.entries_written:  # a reader of a warmed cache writes nothing
                writers.add(who)
    return RunningJobs(found, frozenset(writers))


def _not_a_directory(path: Path) -> Path | None:
    """The path, or the ancestor of it, that exists and is not a directory (a file, FIFO, device, dangling link)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return None if os.path.isdir(candidate) else candidate
    return None


def diagnose(path: Path, env: dict[str, str] | None = None, job_dirs: dict[str, str] | None = None,
             writers: frozenset[str] = frozenset()) -> DoctorReport:
    """Every finding for `path`; `job_dirs` maps running jobs ("pid (tag)") to the directory each uses, `writers`
    names those of them that wrote entries there."""
    env = dict(os.environ) if env is None else env
    report = DoctorReport(str(path))
    add = report.findings.append
    _where_jobs_look(path, env, job_dirs or {}, add)
    try:
        result = scan(path)
    except CacheDirError as error:
        _unscannable(path, error, add)
        return report
    report.scan = result
    # Past the listing's limit entries are counted, not read: a figure over the entries read says so.
    at_least = "at least " if result.truncated else ""
    read = f" (the first {len(result.entries)} of {result.entry_count} entries read)" if result.truncated else ""
    some = "at least " if result.key_records_read < result.key_records else ""
    me = os.geteuid()
    info = os.stat(path)
    if not result.writable_by_me:
        add(Finding("not_writable", "error", f"{path} is not writable by {user_name(me)} (owner {result.owner}, "
                    f"mode {result.mode}): no entry will be written and jax warns at each compile",
                    "give each user their own cache directory, or let the owner warm it (tpu-profile cache warm) "
                    "and read it only"))
    if info.st_uid != me:
        add(Finding("other_owner", "error", f"{path} belongs to {result.owner}: whoever can write a compilation "
                    "cache can run code in your job", "use a cache directory you own, or one that only trusted "
                    "users can write"))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
        add(Finding("shared_writable", "error", f"{path} is writable by {who} (mode {result.mode}): a cache is "
                    "trusted code, and anyone who can write it can run code in every job that reads it",
                    f"chmod go-w {path}"))
    for sub in result.subcaches:
        if not sub.writable_by_me:
            add(Finding("subcache_not_writable", "warning", f"{sub.what} {sub.name} is owned by {sub.owner} with "
                        f"mode {sub.mode}: XLA cannot add to it as {user_name(me)}",
                        f"give each user their own cache, or chmod/chown {path}/{sub.name}"))
    hosts = result.writer_hosts
    if is_network_filesystem(result.filesystem) and (len(hosts) > 1 or len(result.writers) > 1):
        add(Finding("shared_network_writers", "error", f"{path} is on {result.filesystem} and written by "
                    f"{some}{len(result.writers)} processes on {some}{len(hosts)} hosts "
                    f"({', '.join(result.writers[:8])}): "
                    "writers on a shared mount contend for it, which looks like a slow runtime start",
                    "give each host its own writable cache, or let one writer warm the shared one and mount it "
                    "read-only for the others"))
    elif len(hosts) > 1:
        add(Finding("several_hosts", "warning", f"{path} was written by {some}{len(hosts)} hosts: "
                    f"{', '.join(hosts[:8])}", "let one writer warm a shared cache; the others read it"))
    elif len(result.writers) > 1:
        add(Finding("several_writers", "info", f"{path} was written by {some}{len(result.writers)} processes: "
                    f"{', '.join(result.writers[:8])}", "fine on a local disk; on a shared mount prefer one writer"))
    _torch_xla_findings(path, result, env, {job: used for job, used in (job_dirs or {}).items() if job in writers},
                        add)
    _cache_settings(path, result, env, read, add)
    if len(result.jaxlib_versions) > 1 or result.stale:
        add(Finding("mixed_versions", "warning", f"entries of jaxlib {', '.join(result.jaxlib_versions)} "
                    f"(installed: {result.installed_jaxlib}); {at_least}{len(result.stale)} can never be read by this "
                    f"installation{read}", f"remove them: tpu-profile cache gc {path} --stale"))
    if result.broken:
        of = f" of the {result.entry_count}" if result.truncated else ""
        add(Finding("broken_entries", "warning", f"{at_least}{len(result.broken)}{of} entries jax cannot use{read} "
                    f"(first: {shorten(result.broken[0].name, 80)}: {result.broken[0].problem})",
                    f"tpu-profile cache verify {path} --prune"))
    links = result.planted_links
    if links:
        first = shorten(links[0].name, 80)
        add(Finding("links", "warning", f"{len(links)} links in the cache (first: {first}): a cache "
                    "holds plain files only", f"tpu-profile cache verify {path} --prune"))
    temporary = [o for o in result.other_files if o.kind == "temporary"]
    if temporary:
        add(Finding("temporary_files", "info", f"{len(temporary)} temporary files of jax or of gc (first: "
                    f"{shorten(temporary[0].name, 80)})", f"tpu-profile cache gc {path} removes those an hour old"))
    return report


def _where_jobs_look(path: Path, env: dict[str, str], job_dirs: dict[str, str], add: Any) -> None:
    """The environment's cache settings, or a running job, naming another directory than `path`."""
    env_dir = env.get(ENV_DIR)
    if env_dir and os.path.abspath(env_dir) != os.path.abspath(path):
        add(Finding("env_differs", "warning", f"{ENV_DIR} is {env_dir}, not {path}: jobs started from this "
                    "environment use the other directory", f"set {ENV_DIR}={path} where the jobs start, or check "
                    "the directory the jobs really use"))
    torch_dir = env.get(ENV_TORCH_XLA_DIR)
    if torch_dir and os.path.abspath(torch_dir) != os.path.abspath(path):
        add(Finding("torch_xla_env_differs", "warning", f"{ENV_TORCH_XLA_DIR} is {torch_dir}, not {path}: "
                    "PyTorch/XLA jobs started from this environment use the other directory",
                    f"set {ENV_TORCH_XLA_DIR}={path} where the jobs start (before torch_xla compiles)"))
    for job, used in sorted(job_dirs.items()):
        if os.path.abspath(used) != os.path.abspath(path):
            add(Finding("job_differs", "warning", f"job {job} uses {used}, not {path}",
                        "start every job of this workload with the same cache directory"))


def _unscannable(path: Path, error: CacheDirError, add: Any) -> None:
    """Why `path` could not be listed: not a directory, missing, or unreadable."""
    blocker = _not_a_directory(path)
    if blocker is not None:
        where = ", not a directory" if blocker == path else f", so {path} cannot be a directory"
        add(Finding("not_a_directory", "error", f"{blocker} is {what_is(blocker)}{where}",
                    f"remove or rename {blocker}, or choose another directory ({ENV_DIR})"))
    elif not os.path.lexists(path):
        parent = path.parent
        writable = os.access(parent, os.W_OK | os.X_OK)
        add(Finding("missing", "warning" if writable else "error", f"{error}; jax creates it at the first "
                    "compile" + ("" if writable else f", but {parent} is not writable by "
                                 f"{user_name(os.geteuid())}"),
                    f"create it first: mkdir -m 0700 -p {path}"))
    else:
        add(Finding("unreadable", "error", str(error), f"fix its permissions or choose another "
                    f"directory ({ENV_DIR})"))


def _cache_settings(path: Path, result: CacheScan, env: dict[str, str], read: str, add: Any) -> None:
    """JAX's cache settings that keep entries out: a minimum compile time or entry size set high, a size limit
    reached or 0; `read` says how much of the cache was read."""
    jax_entries = [e for e in result.entries if e.frontend == JAX]  # JAX's settings apply to its entries only
    min_time = _number(env, ENV_MIN_TIME)
    largest_time = max((e.compile_time_s for e in jax_entries if e.compile_time_s is not None), default=None)
    if min_time is not None and (min_time >= HIGH_MIN_TIME_S
                                 or (largest_time is not None and min_time > max(largest_time, 1) * 10)):
        add(Finding("min_compile_time_high", "warning", f"{ENV_MIN_TIME}={min_time:g}: only compiles longer than "
                    f"that are cached (the longest entry here took {largest_time} s{read})",
                    f"leave it at jax's default ({JAX_DEFAULT_MIN_TIME_S:g} s) or lower"))
    min_size = _number(env, ENV_MIN_SIZE)
    largest = max((e.size_bytes for e in jax_entries), default=None)
    if min_size is not None and (min_size >= HIGH_MIN_SIZE or (largest is not None and min_size > largest * 10)):
        add(Finding("min_entry_size_high", "warning", f"{ENV_MIN_SIZE}={min_size:.0f}: entries smaller than that "
                    f"are never written (the largest here is {largest} bytes{read})", f"unset {ENV_MIN_SIZE}"))
    max_size = _number(env, ENV_MAX_SIZE)
    jax_bytes = result.frontend_counts.get(JAX, [0, 0])[1]
    if max_size is not None and max_size == 0:
        add(Finding("disabled_by_size", "error", f"{ENV_MAX_SIZE}=0 turns the cache off",
                    f"unset {ENV_MAX_SIZE} or give it a size in bytes (-1: no limit)"))
    elif max_size is not None and max_size > 0 and jax_bytes >= FULL_FRACTION * max_size:
        add(Finding("size_limit_reached", "warning", f"{jax_bytes} bytes of the {max_size:.0f} allowed by "
                    f"{ENV_MAX_SIZE}: jax evicts an entry for every new one", f"raise {ENV_MAX_SIZE}, or remove "
                    f"old entries: tpu-profile cache gc {path} --max-age 168h"))


def _torch_xla_findings(path: Path, result: CacheScan, env: dict[str, str], writer_dirs: dict[str, str],
                        add: Any) -> None:
    """PyTorch/XLA's traps, where its settings name this directory or it holds torch_xla's entries;
    `writer_dirs`: the running jobs that wrote entries, and where."""
    torch_dir = env.get(ENV_TORCH_XLA_DIR)
    names_it = bool(torch_dir) and os.path.abspath(str(torch_dir)) == os.path.abspath(path)
    holds = TORCH_XLA in result.frontend_counts
    if not (names_it or holds):
        return
    if names_it and env.get(ENV_TORCH_XLA_READ_ONLY, "").strip().lower() in ("1", "true"):
        add(Finding("torch_xla_read_only", "info", f"{ENV_TORCH_XLA_READ_ONLY} is set: PyTorch/XLA jobs from this "
                    "environment read the cache and never add to it, so a graph not in it is compiled at every "
                    "start", f"leave it set for readers of a warmed cache; unset it for the one job that warms "
                    f"{path}"))
    users = sorted(job for job, used in writer_dirs.items() if os.path.abspath(used) == os.path.abspath(path))
    if len(users) > 1:
        add(Finding("torch_xla_shared_writers", "warning", f"{len(users)} running jobs write into {path} "
                    f"({', '.join(users[:8])}): PyTorch/XLA writes an entry in place (no temporary file), so two "
                    "jobs that compile one graph truncate and rewrite the same file while the other may read it",
                    f"let one job warm the cache and start the others with {ENV_TORCH_XLA_READ_ONLY}=1"))
