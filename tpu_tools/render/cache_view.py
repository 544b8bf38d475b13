"""Text and tables of `tpu-profile cache`: inspect, doctor, verify, gc and warm."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tpu_tools.render.table import Column, TableData
from tpu_tools.units import format_bytes

if TYPE_CHECKING:
    from tpu_tools.profile.cachedir import CacheReport
    from tpu_tools.profile.cachedoctor import DoctorDocument
    from tpu_tools.profile.cachegc import GcDocument
    from tpu_tools.profile.cacheverify import VerifyDocument
    from tpu_tools.profile.cachewarm import WarmDocument

MAX_ROWS = 40


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def inspect_blocks(report: CacheReport) -> list[str | TableData]:
    """The summary lines, the entries (most compile time first), other files and XLA's sub-caches."""
    now = time.time()
    count, listed = report.entry_count, report.entries_listed
    # Over a truncated listing a figure counts only the entries read: it says so, never reads as the whole.
    partial = set(report.partial_figures)
    read = f" of the first {listed} read (--limit)" if report.truncated else ""
    at_least = "at least " if "broken_entries" in partial else ""
    among = f"of the {listed} read: " if read else ""
    records = (f" (the first {report.key_records_read} of {report.key_records} records read)"
               if "writers" in partial else "")
    lines = [
        f"cache {report.path}  owner {report.owner}  mode {report.mode}  "
        f"filesystem {report.filesystem or '?'}  {'writable' if report.writable_by_me else 'READ-ONLY'}"
        " for this user",
        f"{count} entries, {format_bytes(report.total_bytes)}; {among}"
        f"oldest {_age(report.oldest_age_s)}, newest {_age(report.newest_age_s)}; a hit on each "
        f"{'of those ' if read else ''}saves {report.compile_seconds_saved_per_use_s} s of compiling in all "
        "(whole seconds, as jax stores them)",
        f"jaxlib installed {report.installed_jaxlib or '?'}; in key records{records}: "
        f"{', '.join(report.jaxlib_versions) or 'none'}; {at_least}{report.stale_entries} stale entries "
        f"(another jaxlib: never read again) and {at_least}{report.broken_entries} broken of the {count}"
        + (f", counted among the {listed} read" if read else ""),
        f"writers (key records{records}): {', '.join(report.writers[:8]) or 'unknown'}",
    ]
    if read:
        lines.append(f"only the first {listed} of the {count} entries are read and listed one by one (--limit)")
    blocks: list[str | TableData] = ["\n".join(lines)]
    entries = sorted(report.entries, key=lambda e: (-(e.compile_time_s or 0), e.name))
    if entries:
        table = TableData([Column("MODULE", max_width=40), Column("SIZE", "right"), Column("COMPILE S", "right"),
                           Column("AGE", "right"), Column("LAST USE", "right"), Column("JAXLIB"),
                           Column("WRITER"), Column("PROBLEM")], title="Entries")
        for entry in entries[:MAX_ROWS]:
            table.add_row(entry.module or f"({entry.frontend})", format_bytes(entry.size_bytes),
                          "-" if entry.compile_time_s is None else entry.compile_time_s,
                          _age(now - entry.modified_unix_s), _age(now - entry.last_used_unix_s),
                          entry.jaxlib_version or "-", entry.writer or "-", entry.problem or "")
        if len(entries) > MAX_ROWS:
            table.add_row(f"... {len(entries) - MAX_ROWS} more (--json)", "", "", "", "", "", "", "")
        blocks.append(table)
    if report.other_files:
        table = TableData([Column("OTHER FILE", max_width=60), Column("KIND"), Column("SIZE", "right")],
                          title="Temporary, partial and other files")
        for other in report.other_files[:MAX_ROWS]:
            table.add_row(other.name, other.kind, format_bytes(other.size_bytes))
        if len(report.other_files) > MAX_ROWS:
            table.add_row(f"... {len(report.other_files) - MAX_ROWS} more (--json)", "", "")
        blocks.append(table)
    if report.subcaches:
        table = TableData([Column("SUB-CACHE"), Column("WHAT"), Column("OWNER"), Column("MODE"),
                           Column("FILES", "right"), Column("SIZE", "right"), Column("WRITABLE")],
                          title="XLA's sub-caches")
        for sub in report.subcaches:
            more = "at least " if sub.truncated else ""  # counting stopped at its limit
            table.add_row(sub.name, sub.what, sub.owner, sub.mode, f"{more}{sub.files}",
                          more + format_bytes(sub.bytes), "yes" if sub.writable_by_me else "no")
        blocks.append(table)
    return blocks


def doctor_text(report: DoctorDocument) -> str:
    if not report.findings:
        return f"cache {report.path}: no known trap found"
    lines = [f"cache {report.path}: {report.errors} errors, {report.warnings} warnings"]
    for finding in report.findings:
        lines.append(f"{finding.severity.upper():7} {finding.code}: {finding.message}")
        lines.append(f"        fix: {finding.fix}")
    return "\n".join(lines)


def verify_text(report: VerifyDocument) -> str:
    of = f" of the {report.entry_count} entries (--limit)" if report.truncated else ""
    lines = [f"cache {report.path}: {report.checked}{of} checked on {report.platform or '?'}, "
             f"{report.ok} load, {report.broken} broken, {report.skipped} not judged here"
             + (f", {report.pruned} removed" if report.prune else "")
             + (f"; the other {report.entry_count - report.entries_listed} were not read: run again with "
                "a higher --limit" if of else "")]
    for entry in report.entries:
        if entry.status == "ok":
            continue
        action = ""
        if entry.pruned:
            action = " [removed]"
        elif entry.prune_error:
            action = f" [not removed: {entry.prune_error}]"
        lines.append(f"  {entry.status:7} {entry.name}: {entry.problem}{action}")
    if report.broken and not report.prune:
        lines.append(f"remove them with: tpu-profile cache verify {report.path} --prune")
    return "\n".join(lines)


def gc_text(report: GcDocument) -> str:
    if report.dry_run:
        head = (f"cache {report.path}: would remove {report.would_remove} files "
                f"({format_bytes(report.would_remove_bytes)}); nothing removed (--dry-run)")
    else:
        head = f"cache {report.path}: removed {report.removed} files ({format_bytes(report.removed_bytes)})"
    lines = [head + f"; {report.kept_entries} entries kept ({format_bytes(report.kept_bytes)})"]
    if report.truncated:
        lines.append(f"  only the first {report.entries_considered} of the {report.entry_count} entries "
                     "(by name) were considered (--limit); the others are kept and counted as kept")
    for removal in report.removals:
        state = "would remove" if report.dry_run else ("removed" if removal.removed else "NOT removed")
        error = f" ({removal.error})" if removal.error else ""
        lines.append(f"  {state} {removal.name}: {removal.reason}{error}")
    return "\n".join(lines)


def warm_text(report: WarmDocument) -> str:
    cold, fresh = report.warming, report.fresh_start
    ratio = report.warm_to_cold_ratio
    lines = [
        f"warmed {report.path} with {report.target}",
        f"  warming run: {cold.compiles} compiles, {cold.compile_time_s:.3f} s compiling, "
        f"{cold.hits} hits, {cold.misses} misses, {cold.entries_written} entries written",
        f"  fresh start: {fresh.compiles} compiles, {fresh.compile_time_s:.3f} s compiling, "
        f"{fresh.hits} hits, {fresh.misses} misses",
        f"  compile seconds saved per start: {report.compile_seconds_saved_s:.3f} s"
        + (f" (warm/cold {ratio:.1%})" if ratio is not None else ""),
        "  proven: the fresh start hit every lookup" if report.proven else
        "  NOT proven: the fresh start missed the cache",
    ]
    lines += [f"    miss: {text}" for text in fresh.miss_explanations]
    return "\n".join(lines)
