"""`tpu-dump`: write a support bundle; `tpu-dump show BUNDLE` reads one back."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpu_tools.cli.common import (
    ToolCommand,
    ToolGroup,
    common_options,
    metrics_options,
    output_options,
    run_cli,
    runtime_options,
)
from tpu_tools.cli.output import Output, console_on, note, wants_color
from tpu_tools.cli.params import PathParam, Seconds, non_empty
from tpu_tools.dump.collectors import COLLECTORS
from tpu_tools.errors import EXIT_OK, UsageError
from tpu_tools.parsing import MAX_PERIOD_S
from tpu_tools.pjrt.runtime import RuntimePolicy

if TYPE_CHECKING:
    from tpu_tools.dump.findings import Summary

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MAX_SIZE = "64M"

MAN_SECTIONS = {
    "DESCRIPTION": (
        "Collects what a support engineer needs about this host into one .tar.gz: the system (OS, kernel, CPU, "
        "memory, disks, load, cgroup limits, container, kernel command line and modules, accelerator PCI "
        "functions), the accelerators (passive discovery with device nodes, permissions and holders; the PJRT "
        "device listing and a probe, in an isolated child; the running job's figures and per-core runtime status "
        "from libtpu's metrics services; a snapshot of every workload of this user running the tpu-tools agent), "
        "the software (Python, installed distributions, the "
        "jax/jaxlib/libtpu/plugin versions and whether they agree, the stack's environment variables, the "
        "compilation cache, the XLA dump folder) and logs (the end of libtpu's logs, kernel messages about the "
        "drivers, and what --add names).\n"
        "Each collector runs in its own process with its own time limit (--timeout): one that hangs on a dead "
        "mount or a stuck runtime is stopped and recorded as timed out, and the bundle is still written. The "
        "whole run takes at most --timeout plus the time to compress the bundle.\n"
        "The bundle is created with mode 0600 under a hidden temporary name and renamed when complete, so an "
        "interrupted run never leaves a file that looks whole. An existing file is never replaced without "
        "--force. tpu-dump exits 0 when the bundle is written, even if some collectors failed: the manifest "
        "says which.\n"
        "A TPU held by another process is never opened (the runtime collector is skipped and says who holds "
        "it) unless --force-runtime is given. libtpu's metrics services (localhost:8431, TPU_RUNTIME_METRICS_PORTS "
        "and each --metrics-addr) and the agents are read without opening any device, so they describe a job that "
        "holds the TPU; each call has a deadline (--metrics-timeout, shortened to fit --timeout), and a collector "
        "with nothing to read is skipped with the reason."
    ),
    "REDACTION": (
        "On by default, applied inside each collector before anything is written. Replaced with <redacted>: "
        "values of environment variables whose names contain TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE, KEY, "
        "CREDENTIAL, AUTH, SESSION, COOKIE, PRIVATE, SIGNATURE or SALT (in listings and in NAME=value text); "
        "secret-looking keys in key=value, key: value, JSON and --flag value text; credentials in URLs "
        "(scheme://user:password@host); bearer, basic and token authorization values; PEM private key blocks; "
        "tokens with well-known prefixes (GitHub, Hugging Face, Slack, Google OAuth, AWS access keys, JWTs); and "
        "long high-entropy strings (32 or more characters of mixed case and digits). Files named by credential "
        "variables (GOOGLE_APPLICATION_CREDENTIALS, AWS_SHARED_CREDENTIALS_FILE, KUBECONFIG, NETRC, ...) or by "
        "any secret-named variable, and credential stores (.ssh, .netrc, *.pem, *.key, credentials.json, ...) "
        "are never read. The manifest counts the replacements per file, by kind, never the values.\n"
        "--no-redact turns the replacements off (credential files are still never read) and prints a warning."
    ),
    "BUNDLE": (
        "One folder, tpu-dump-<host>-<time>/, holding manifest.json and one or more files per collector: "
        "system/*.json and *.txt, accelerators/discovery.json, chips.txt, runtime.json (the tpu-ls --json "
        "document with probe results), devices.txt, libtpu.json ({addresses[], call_timeout_s, metrics[] as "
        "libtpu_metrics[] and runtime_status[] as libtpu_runtime_status[] of tpu-ls --json, with HLO locations}), "
        "libtpu.txt, agents.json ({runtime_dir, agents[] {pid, tag, socket, error, query_time_s, snapshot (the "
        "agent's own document, schema tpu-tools/agent/v1)}, ignored_sockets[], removed_stale_pids[]}), "
        "agents.txt, software/python.json, packages.json, packages.txt, "
        "stack.json, env.json, env.txt, compile_cache.json, xla_dump/, logs/libtpu/, logs/kernel.txt, "
        "logs/added/, and errors/<collector>.txt with the traceback of a collector that failed.\n"
        "Logs are taken from their end: 2 MiB of each of the 8 newest libtpu logs, 32 MiB per --add path, "
        "16 MiB of XLA dumps. When the compressed bundle would exceed --max-size, the largest logs are "
        "shortened first (to one common length, newest lines kept) and the manifest says so."
    ),
    "JSON OUTPUT": (
        "manifest.json (and tpu-dump --json on stdout, which adds a bundle key {path, size_bytes}) has schema "
        "\"tpu-tools/dump/v1\": schema, tool, tool_version, host, time (UTC, ISO 8601), duration_s, command[], "
        "options {only[], skip[], timeout_s, max_size_bytes, redact, add[], platform, force_runtime, "
        "metrics_addresses[], metrics_timeout_s}, "
        "redaction {enabled, redacted_total, by_kind {kind: count}}, collectors[] {name, status (ok, failed, "
        "timed_out, skipped), error, duration_s, files[], notes[]}, files[] {name, collector, size_bytes, "
        "sha256, redactions {kind: count}, source, source_size_bytes, trimmed_from_bytes}, notes[].\n"
        "Redaction kinds: private_key, url_credentials, bearer_token, secret_variable, secret_value, "
        "known_token, high_entropy."
    ),
    "COLLECTORS": "\n".join(f"{c.name}  {c.summary}." for c in COLLECTORS) + (
        "\n--only and --skip take these names or their categories (system, accelerators, software, logs)."),
    "EXAMPLES": (
        "tpu-dump\n"
        "tpu-dump --output /tmp/bug-1234.tar.gz --add ~/run/logs\n"
        "tpu-dump --only system,accelerators --timeout 5\n"
        "tpu-dump --skip accelerators.runtime --max-size 5M\n"
        "tpu-dump --only accelerators --metrics-addr localhost:8432\n"
        "tpu-dump show tpu-dump-myhost-20250101T120000Z.tar.gz\n"
        "tpu-dump show bundle.tar.gz --file software/stack.json"
    ),
}

SHOW_SECTIONS = {
    "Schema": (
        "show --json prints schema \"tpu-tools/dump-show/v1\": bundle {path, size_bytes, top, member_count}, "
        "host, time, tool_version, duration_s, redaction, devices {runtime_status, platform, platform_version, "
        "device_count, device_kinds, probe_passed, probe_failed, chips, holders[]}, versions {jax, jaxlib, "
        "libtpu, plugins, tpu_tools, python, agree}, libtpu (null when the bundle has no libtpu.json, else "
        "{services[] {address, error, device_count, hbm_used_bytes, hbm_total_bytes, duty_cycle_percent, "
        "not_served_metrics[]}, core_count, cores_in_error[] {address, global_core_id, chip_id, core_type, "
        "error_message}}), agents (null when the bundle has no agents.json, else {agents[] {pid, tag, platform, "
        "error, compile_count, recompile_count, device_memory_used_bytes, steps_per_second, last_recompile "
        "{function, reason} or null}, ignored_sockets}), collectors[] {name, status, error, duration_s}, "
        "failed_collectors[], warnings[] {kind, message}, files[] {name, size_bytes, collector, redactions, "
        "trimmed_from_bytes}, unsafe_members[] {name, type, problem}, notes[].\n"
        "Warning kinds: not_redacted, unsafe_member, integrity, version_mismatch, shadowed_package, dead_holder, "
        "stuck_holder, no_access, missing_device_node, probe_failed, device_held, oom_kills, compile_cache, "
        "kernel_errors, libtpu_core_error (a core that libtpu reports in error), agent_error (an agent that did "
        "not answer), recompiles (a workload that compiled a function again, with the last reason)."
    ),
    "Safety": (
        "show never extracts anything: members are read into memory one at a time, up to 256 MiB each. "
        "Members with absolute paths, '..', links, devices, FIFOs or control characters in their names, and "
        "members over the size limit, are listed as unsafe and never read or followed. A file that is not a "
        "tar archive, or one that is truncated or corrupt, is one error line and exit status 1."
    ),
}


def _split(values: tuple[str, ...], option: str) -> tuple[str, ...]:
    names = tuple(v.strip() for value in values for v in value.split(","))
    if any(not name for name in names):  # "--only ''" or "a,,b": never "every collector" by accident
        raise UsageError(f"{option}: an empty name; give collector names or categories, separated by commas")
    return names


def _parse_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from tpu_tools.dump.bundle import MIN_MAX_SIZE_BYTES
    from tpu_tools.parsing import parse_size

    try:
        size = parse_size(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    if size < MIN_MAX_SIZE_BYTES:
        raise click.BadParameter(f"must be at least {MIN_MAX_SIZE_BYTES // 1024}K, got {value}")
    return size


class _ProgressLine:
    """One transient status line on stderr while collectors run (terminals only, no threads)."""

    def __init__(self) -> None:
        self._live: Any = None  # a rich Live display, made on the first update

    def __call__(self, progress) -> None:
        from rich.live import Live
        from rich.text import Text

        from tpu_tools.dump.view import progress_text

        text = Text(progress_text(progress.done, progress.total, progress.running), overflow="ellipsis",
                    no_wrap=True)
        if self._live is None:
            console = console_on(sys.stderr, highlight=False, no_color=not wants_color(sys.stderr))
            self._live = Live(text, console=console, auto_refresh=False, transient=True, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start()
        self._live.update(text, refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


@click.group(name="dump", cls=ToolGroup, invoke_without_command=True, man_sections=MAN_SECTIONS,
             json_schema="tpu-tools/dump/v1",
             subcommand_metavar="[show BUNDLE]")
@click.option("-o", "--output", type=PathParam(), metavar="PATH",
              help="Where to write the bundle (default: tpu-dump-<host>-<utc time>.tar.gz here).")
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
@click.option("--only", multiple=True, metavar="NAMES", callback=non_empty,
              help="Run only these collectors or categories (comma-separated, repeatable), e.g. system,logs.kernel.")
@click.option("--skip", multiple=True, metavar="NAMES", help="Do not run these collectors or categories.")
@click.option("--timeout", "timeout_s", type=Seconds(maximum=MAX_PERIOD_S), default=DEFAULT_TIMEOUT_S,
              show_default=True, metavar="SECONDS", help="Time limit of each collector; they run side by side.")
@click.option("--max-size", "max_size_bytes", default=DEFAULT_MAX_SIZE, show_default=True, metavar="SIZE",
              callback=_parse_size, help="Largest bundle (K, M, G suffixes); the largest logs are trimmed first.")
@click.option("--add", "add_paths", multiple=True, type=PathParam(path_type=str), metavar="PATH",
              help="Also collect this file or folder (repeatable; size-capped, links leaving it not followed).")
@click.option("--no-redact", is_flag=True, help="Do not redact secrets (prints a warning; share with care).")
@click.option("--force-runtime", is_flag=True,
              help="Open the PJRT runtime even when another process holds a TPU (may disturb it).")
@click.option("--list-collectors", is_flag=True, help="List the collectors and exit.")
@runtime_options(timeout=False, validate=False)
@metrics_options(validate=False)
@output_options
@common_options
@click.pass_context
def dump_command(ctx: click.Context, output: Path | None, force: bool, only: tuple[str, ...],
                 skip: tuple[str, ...], timeout_s: float, max_size_bytes: int, add_paths: tuple[str, ...],
                 no_redact: bool, force_runtime: bool, list_collectors: bool, policy: RuntimePolicy,
                 metrics_addresses: list[str], metrics_timeout_s: float, out: Output) -> int | None:
    """Write a support bundle: system, accelerators, software and logs, redacted, in one .tar.gz."""
    if ctx.invoked_subcommand is not None:
        return None
    if list_collectors:
        return _list_collectors(out)
    from tpu_tools.dump.create import DumpRequest, create_bundle
    from tpu_tools.dump.view import report_lines

    if no_redact:
        note("warning: --no-redact: the bundle may contain passwords, tokens and keys; review it before you "
             "share it")
    request = DumpRequest(output=output, force=force, only=_split(only, "--only"), skip=_split(skip, "--skip"),
                          timeout_s=timeout_s,
                          max_size_bytes=max_size_bytes, add_paths=add_paths, redact=not no_redact, policy=policy,
                          force_runtime=force_runtime, command=[ctx.find_root().info_name or "tpu-dump",
                                                                *sys.argv[1:]],
                          metrics_addresses=tuple(metrics_addresses), metrics_timeout_s=metrics_timeout_s)
    progress = _ProgressLine() if sys.stderr.isatty() else None
    try:
        report = create_bundle(request, on_progress=progress)
    finally:
        if progress is not None:
            progress.close()
    if report.over_max_size:
        note(f"warning: the bundle is {report.size_bytes} bytes, larger than --max-size even with its logs trimmed")
    if out.is_json:
        out.json(report.report())
        return EXIT_OK
    for line in report_lines(report.manifest, str(report.path), report.size_bytes):
        out.text(line)
    problems = [c for c in report.manifest.collectors or [] if c.status in ("failed", "timed_out")]
    if problems:
        from tpu_tools.dump.view import collector_table

        out.table(collector_table(problems))
    out.text(f"read it with: tpu-dump show {report.path}")
    return EXIT_OK


def _list_collectors(out: Output) -> int:
    from tpu_tools.render.table import Column, TableData

    if out.is_json:
        out.json({"collectors": [{"name": c.name, "summary": c.summary} for c in COLLECTORS]})
        return EXIT_OK
    table = TableData([Column("COLLECTOR"), Column("WHAT IT COLLECTS")])
    for collector in COLLECTORS:
        table.add_row(collector.name, collector.summary)
    out.table(table)
    return EXIT_OK


@dump_command.command(name="show", cls=ToolCommand, man_sections=SHOW_SECTIONS,
                      json_schema="tpu-tools/dump-show/v1")
@click.argument("bundle", type=PathParam(exists=True, dir_okay=False, readable=True))
@click.option("--file", "member", metavar="NAME", help="Print one file of the bundle (a name from the file list).")
@output_options
@common_options
def show_command(bundle: Path, member: str | None, out: Output) -> int:
    """Summarise a bundle without extracting it: host, devices, versions, failures, warnings."""
    from tpu_tools.dump.findings import summarize
    from tpu_tools.dump.reader import Bundle

    if member is not None and out.is_json:
        raise UsageError("--file prints the file as it is; it cannot be combined with --json")
    with Bundle(bundle) as opened:
        if member is not None:
            _print_member(opened.read(member))
            return EXIT_OK
        summary = summarize(opened)
    if out.is_json:
        out.json(summary)
        return EXIT_OK
    _render_summary(summary, out)
    return EXIT_OK


def _print_member(data: bytes) -> None:
    if sys.stdout.isatty():  # a hostile file must not drive the terminal
        from tpu_tools.dump.view import printable

        sys.stdout.write(printable(data.decode("utf-8", "replace"), keep_newlines=True))
        sys.stdout.flush()
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def _render_summary(summary: Summary, out: Output) -> None:
    from tpu_tools.dump.view import collector_table, files_table, printable, summary_header

    for line in summary_header(summary):
        out.text(line)
    failed = [c for c in summary.collectors if c.status != "ok"]
    if failed:
        out.text("")
        out.table(collector_table(failed))
    out.text("")
    if summary.warnings:
        out.text("warnings:")
        for warning in summary.warnings:
            out.text(f"  {warning.kind}: {printable(warning.message)}")
    else:
        out.text("warnings: none")
    for line in summary.notes:
        out.text(f"note: {printable(line)}")
    out.text("")
    out.table(files_table(summary.files))


def main() -> None:
    run_cli(dump_command)
