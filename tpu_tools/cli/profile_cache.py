"""`tpu-profile cache`: inspect, check, verify, warm and trim a JAX persistent compilation cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from tpu_tools.cli.common import ToolCommand, ToolGroup, common_options, output_options, runtime_options
from tpu_tools.cli.output import Output
from tpu_tools.cli.params import Count, Duration, PathParam, Seconds, refuse_empty_path
from tpu_tools.errors import EXIT_FAILURE, EXIT_OK, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy

MAX_AGE_S = 3650 * 86400.0
CACHE_MAN = {
    "DESCRIPTION": (
        "The JAX persistent compilation cache (jax_compilation_cache_dir, or JAX_COMPILATION_CACHE_DIR) keeps "
        "compiled programs between runs; so does PyTorch/XLA's (XLA_PERSISTENT_CACHE_PATH), whose entries are "
        "named by a 128-bit hash in decimal: inspect, doctor and gc read both, verify checks JAX's only. "
        "These commands read it from outside, without a job: `inspect` lists "
        "entries, sizes, ages and the compile seconds each saves; `doctor` names the known traps with their "
        "fixes; `verify` loads every entry in a child process with a deadline; `warm` compiles into it and "
        "proves that a fresh start hits; `gc` removes the oldest entries. The directory is never followed "
        "through links, and removals are renames within it followed by unlinks, safe while jobs read. "
        "docs/cache.md has the traps, the safe multi-host patterns and measured figures."
    ),
    "JSON": (
        "inspect --json: schema \"tpu-tools/cache/v1\": path, owner, owner_uid, mode, filesystem, writable_by_me, "
        "entry_count, entries_listed, truncated, total_bytes, oldest_age_s, newest_age_s, "
        "compile_seconds_saved_per_use_s, stale_entries, broken_entries, installed_jaxlib, jaxlib_versions[], "
        "key_records, key_records_read, partial_figures[], writers[], writer_hosts[], entries[] {name, module, "
        "size_bytes, modified_unix_s, last_used_unix_s, compile_time_s, compression, problem, jaxlib_version, "
        "platform, writer, frontend (jax or torch_xla)}, frontends {jax, torch_xla: {entry_count, total_bytes, "
        "oldest_age_s, newest_age_s}} (the frontends with entries here), "
        "other_files[] {name, kind, size_bytes}, subcaches[] {name, what, owner, mode, files, "
        "bytes, writable_by_me, truncated (files and bytes count only the first 10000 files)}. Past --limit "
        "entries are counted, not read: partial_figures names the keys computed over the entries_listed only "
        "(ages, compile seconds, stale and broken entries: lower bounds) and, past key_records_read, over part of "
        "the key records (writers, writer_hosts, jaxlib_versions); empty when every figure covers the directory.\n"
        "doctor --json: \"tpu-tools/cache-doctor/v1\": path, errors, warnings, entry_count, entries_read (the "
        "entries the findings were judged on; null when DIR could not be read), findings[] {code, severity, "
        "message, fix}.\n"
        "verify --json: \"tpu-tools/cache-verify/v1\": path, platform, checked, ok, broken, skipped, prune, "
        "pruned, truncated, entry_count, entries_listed, partial_figures[] (ok, broken, skipped when only "
        "entries_listed of entry_count were checked), entries[] {name, status (ok, broken, skipped, link), problem, "
        "compile_time_s, pruned, prune_error}.\n"
        "gc --json: \"tpu-tools/cache-gc/v1\": path, dry_run, removed, removed_bytes, would_remove, "
        "would_remove_bytes, failed, kept_entries, kept_bytes (every entry that stays, also those past --limit), "
        "truncated, entry_count, entries_considered, removals[] {name, reason, size_bytes, "
        "removed, error}.\n"
        "warm --json: \"tpu-tools/cache-warm/v1\": path, target, warming and fresh_start {compile_time_s, "
        "compiles, lookups, hits, misses, entries_written, wall_time_s, miss_explanations[]}, proven, "
        "compile_seconds_saved_s, warm_to_cold_ratio."
    ),
}


class Size(click.ParamType):  # type: ignore[type-arg]
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from tpu_tools.parsing import parse_size

        try:
            return parse_size(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


def _dir_argument(function: Any) -> Any:
    return click.argument("directory", type=PathParam(), metavar="DIR")(function)


def _limit_option(function: Any) -> Any:
    return click.option("--limit", type=Count(1, 10_000_000), default=20_000, show_default=True, metavar="N",
                        help="Entries read one by one; more are counted only (bounded work on huge caches).")(function)


@click.group(cls=ToolGroup, name="cache", man_sections=CACHE_MAN)
@common_options
def cache_group() -> None:
    """Inspect, check, verify, warm and trim a JAX persistent compilation cache."""


@cache_group.command(name="inspect", cls=ToolCommand, json_schema="tpu-tools/cache/v1")
@_dir_argument
@_limit_option
@output_options
@common_options
def inspect_command(directory: Path, limit: int, out: Output) -> int:
    """Entries, bytes, ages, compile seconds saved, stale and partial files, XLA's sub-caches and their owners."""
    from tpu_tools.profile.cachedir import scan
    from tpu_tools.render.cache_view import inspect_blocks

    document = scan(directory, limit).report()
    if out.is_json:
        out.json(document)
        return EXIT_OK
    out.blocks(inspect_blocks(document))
    return EXIT_OK


@cache_group.command(name="doctor", cls=ToolCommand, json_schema="tpu-tools/cache-doctor/v1")
@click.argument("directory", type=PathParam(), metavar="[DIR]", required=False)
@output_options
@common_options
def doctor_command(directory: Path | None, out: Output) -> int:
    """One finding per known trap, each with its fix; exit status 1 when a finding is an error.

    DIR defaults to $JAX_COMPILATION_CACHE_DIR. Running jobs with the agent that use another directory are named.
    """
    from tpu_tools.profile.cachedoctor import ENV_DIR, diagnose, running_jobs
    from tpu_tools.render.cache_view import doctor_text

    if directory is None:
        configured = os.environ.get(ENV_DIR)
        if not configured or not configured.strip():
            raise UsageError(f"no cache directory: give DIR or set {ENV_DIR}")
        directory = Path(configured)
    jobs = running_jobs()
    report = diagnose(directory, job_dirs=jobs.dirs, writers=jobs.writers)
    document = report.report()
    if out.is_json:
        out.json(document)
    else:
        out.text(doctor_text(document))
    return EXIT_FAILURE if report.has_error else EXIT_OK


@cache_group.command(name="verify", cls=ToolCommand, json_schema="tpu-tools/cache-verify/v1")
@_dir_argument
@click.option("--prune", is_flag=True, help="Remove the broken entries and links (renamed away, then unlinked).")
@click.option("--deadline", "deadline_s", type=Seconds(maximum=3600.0), default=60.0, show_default=True,
              metavar="SECONDS", help="Time allowed to load one entry.")
@_limit_option
@runtime_options(timeout=False)
@output_options
@common_options
def verify_command(directory: Path, prune: bool, deadline_s: float, limit: int, policy: RuntimePolicy,
                   out: Output) -> int:
    """Load every entry in a child process with a deadline; report the broken ones (--prune removes them).

    Exit status 1 when broken entries remain in the cache.
    """
    from tpu_tools.pjrt.runtime import apply
    from tpu_tools.profile.cachedir import scan
    from tpu_tools.profile.cacheverify import verify
    from tpu_tools.render.cache_view import verify_text

    apply(policy)  # the child loads entries on this platform
    result = verify(scan(directory, limit), deadline_s, prune)
    document = result.report()
    if out.is_json:
        out.json(document)
    else:
        out.text(verify_text(document))
    remaining = [v for v in result.broken if not v.pruned]
    return EXIT_FAILURE if remaining else EXIT_OK


@cache_group.command(name="gc", cls=ToolCommand, json_schema="tpu-tools/cache-gc/v1")
@_dir_argument
@click.option("--max-bytes", type=Size(), default=None, metavar="SIZE",
              help="Remove the least recently used entries until the cache holds at most this much (e.g. 20G).")
@click.option("--max-age", "max_age_s", type=Duration(maximum=MAX_AGE_S), default=None, metavar="DURATION",
              help="Remove entries not used for this long (seconds, or with ms, s, m, h: 168h).")
@click.option("--stale", is_flag=True, help="Remove entries written by another jaxlib (known from key records).")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--limit", type=Count(1, 10_000_000), default=1_000_000, show_default=True, metavar="N",
              help="Entries considered; more are counted only.")
@output_options
@common_options
def gc_command(directory: Path, max_bytes: int | None, max_age_s: float | None, stale: bool, dry_run: bool,
               limit: int, out: Output) -> int:
    """Remove the oldest entries (by last use), leftovers and orphans; safe while jobs read the cache.

    Without --max-bytes, --max-age or --stale only leftovers go: orphaned -atime files and jax's temporary
    files (_temp_KEY) an hour old. Only names of jax's own are removed, never a file judged by a pattern
    (dotfiles, editor files); a directory that holds no cache entry is refused (exit 1), nothing removed.
    Every removal is listed.
    """
    from tpu_tools.profile.cachedir import scan
    from tpu_tools.profile.cachegc import collect
    from tpu_tools.render.cache_view import gc_text

    result = collect(scan(directory, limit, heads=False), max_bytes, max_age_s, stale, dry_run)
    document = result.report()
    if out.is_json:
        out.json(document)
    else:
        out.text(gc_text(document))
    return EXIT_FAILURE if document.failed else EXIT_OK


@cache_group.command(name="warm", cls=ToolCommand, json_schema="tpu-tools/cache-warm/v1")
@_dir_argument
@click.argument("target", nargs=-1, type=click.UNPROCESSED, metavar="MODULE:FUNCTION|train|infer|-- PROGRAM [ARGS]")
@click.option("-m", "--module", "program_module", metavar="MODULE", help="Run a module as the program (-- ARGS).")
@click.option("--arg", "arg_specs", multiple=True, metavar="SPEC",
              help="One argument's dtype and shape for MODULE:FUNCTION, e.g. f32[128,512] (repeatable, in order).")
@click.option("--preset", default=None, metavar="NAME", help="Size of the built-in train or infer workload.")
@click.option("--batch", type=Count(1, 1 << 20), default=None, metavar="N", help="Batch of the built-in workload.")
@click.option("--timeout", "timeout_s", type=Seconds(maximum=86400.0), default=1800.0, show_default=True,
              metavar="SECONDS", help="Time allowed for each of the two runs.")
@click.option("--min-compile-time", "min_compile_time_s", type=Seconds(zero=True, maximum=3600.0), default=0.0,
              show_default=True, metavar="SECONDS",
              help="jax_persistent_cache_min_compile_time_secs for both runs (jax's default is 1).")
@runtime_options(timeout=False)
@output_options
@common_options
def warm_command(directory: Path, target: tuple[str, ...], program_module: str | None, arg_specs: tuple[str, ...],
                 preset: str | None, batch: int | None, timeout_s: float, min_compile_time_s: float,
                 policy: RuntimePolicy, out: Output) -> int:
    """Compile ahead of time into DIR in a child process, then prove in a fresh one that the next start hits.

    TARGET: MODULE:FUNCTION with --arg specs (as tpu-profile hlo takes), the built-in train or infer workload,
    or a program after --: warm DIR -- train.py ARGS (or -m MODULE -- ARGS), run to its end twice.
    Exit status 1 when the fresh start missed the cache.
    """
    from tpu_tools.pjrt.runtime import apply
    from tpu_tools.profile.cachewarm import WarmTarget, warm
    from tpu_tools.profile.runner import ProgramTarget
    from tpu_tools.profile.workloads import WORKLOADS
    from tpu_tools.render.cache_view import warm_text
    from tpu_tools.userfn.specs import parse_arg_spec

    words = list(target)
    if program_module is not None:
        ProgramTarget(module=program_module).validate()
        chosen = WarmTarget("program", module=program_module, args=words)
    elif not words:
        raise UsageError("nothing to warm: give MODULE:FUNCTION --arg ..., train, infer, or -- PROGRAM [ARGS]")
    elif words[0] in WORKLOADS and len(words) == 1:
        chosen = WarmTarget("builtin", target=words[0], preset=preset, batch=batch)
    elif ":" in words[0] and not words[0].endswith(".py") and len(words) == 1:
        for spec in arg_specs:
            parse_arg_spec(spec)
        chosen = WarmTarget("function", target=words[0], args=list(arg_specs))
    else:
        refuse_empty_path(words[0], "the program to run")
        ProgramTarget(script=Path(words[0])).validate()
        chosen = WarmTarget("program", script=words[0], args=words[1:])
    if chosen.kind != "builtin" and (preset or batch):
        raise UsageError("--preset and --batch size the built-in train and infer workloads only")
    if chosen.kind != "function" and arg_specs:
        raise UsageError("--arg gives the arguments of a MODULE:FUNCTION target")
    apply(policy)
    result = warm(directory, chosen, timeout_s, min_compile_time_s)
    document = result.report()
    if out.is_json:
        out.json(document)
    else:
        out.text(warm_text(document))
    return EXIT_OK if result.proven else EXIT_FAILURE
