"""`tpu-diag`: prove that every device computes, moves and stores data correctly, in levels."""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from tpu_tools.cli.common import (
    ToolCommand,
    common_options,
    is_debug,
    launched_first_answered,
    output_options,
    run_cli,
    runtime_options,
)
from tpu_tools.cli.output import Output, console_on, json_written, note, reserve_stdout
from tpu_tools.cli.params import Count, Duration, Number, PathParam
from tpu_tools.errors import RuntimeFailure, ToolError, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy
from tpu_tools.shorten import quoted

DEFAULT_TIMEOUT_S = 120.0

MAN_SECTIONS = {
    "DESCRIPTION": (
        "Runs diagnostics on every device, in levels like NVIDIA's dcgmi diag -r, for any PJRT platform. "
        "The point is silent data corruption: every device is judged against references that are not itself: "
        "exact answers known on the host, the same deterministic program on its peers (compared bit for bit; "
        "the device that disagrees is the suspect), a reference file, and the other hosts of the fleet.\n"
        "-r 1 (quick, seconds): per device, compile and run a probe; known-answer tests whose exact bits are "
        "known on the host (int32 and f32 matmuls of small integers, bf16 arithmetic, a uint32 mix); "
        "host-to-device and device-to-host transfers of seeded random data with digests on both sides.\n"
        "-r 2 (medium, about two minutes): level 1, plus GEMMs in f32, bf16, f16 and int8 on every device "
        "from the same inputs, twice each, their digests (a bitwise hash computed on the device) compared "
        "across devices of the same kind (a device whose two runs differ is nondeterministic: a warning; a "
        "device that repeats a digest the majority does not have computes wrong: a failure; a lone device's "
        "digest is a skip); exact GEMMs in each dtype of small integers whose exact product the host knows, "
        "compared value for value (they prove a lone device); memory patterns "
        "(address-in-address, walking ones, walking zeros, seeded random) over --memory-fraction of each "
        "device's free memory, written and checked on the device; collective checksums (all-reduce and "
        "all-gather of exact patterns, a ring shift in each direction) whose wrong values name the link "
        "(source->destination device); rate outliers (a device 10 % or more slower than the median of its "
        "peers on the f32 GEMM; not judged on the CPU platform, whose devices share the host's cores).\n"
        "-r 3 (long, 15 minutes by default, --duration): level 2, plus sustained GEMM load with every "
        "iteration's digests compared across devices; the first iteration and device that disagree are "
        "reported. On NVIDIA GPUs NVML's clocks, heat, power and throttle reasons are sampled; a throttled "
        "clock is a warning, and the report shows per GPU the peak temperature, the peak power, the lowest SM "
        "clock and each throttle reason with its time. On TPU libtpu's in-process SDK gives "
        "tpu_throttle_score per chip and ici_link_health per ICI link; a score above 0 is a warning.\n"
        "-r 4 (extended): level 3, plus long memory: seven patterns over most of each device's free memory "
        "(0.8, or --memory-fraction), held at once in 256 MiB buffers; the time it takes is said on stderr "
        "before it runs.\n"
        "--only TEST and --skip TEST choose tests by name (gemm f32, memory long checkerboard) or by the words "
        "they start with (gemm, memory); --iterations N runs them N times in one runtime.\n"
        "--save-reference FILE writes the GEMM digests every device agreed on, with their key (platform, "
        "device kind, jax, jaxlib and runtime versions, XLA flags, test, shape, seed); --reference FILE "
        "compares each device's digests with the file's under the same key: a different digest fails, a "
        "different key is a warning, not comparable. tpu-monitor exports each digest "
        "(tpu_tools_diag_digest_info); tpu-top --from-prometheus and the TpuToolsDiagDigestDiffers alert name "
        "the host whose digest differs from the majority of hosts with the same key.\n"
        "--inject KIND:DEVICE flips one bit in one device's output of one test (kat, transfer, gemm, memory, "
        "collective: the ring shift's output received by DEVICE, sustained: from the second iteration), so "
        "an operator can see the detector fire: the run fails naming that device (or link) and test. Repeat "
        "it for several kinds. An injected run is not kept as the host's health.\n"
        "Coverage is reported: bytes of memory tested per device and their share of its free memory, the "
        "links exercised, the dtypes.\n"
        "Busy devices are refused: when another process holds an accelerator (its device node, or libtpu's "
        "lock, as tpu-ls lists them) tpu-diag exits 1 unless --force. The runtime runs in a child process of "
        "its own (as tpu-ls's): a device that hangs gets a verdict (failed, hung, naming the test and the "
        "device) after --timeout seconds without progress, a crash is failed likewise.\n"
        "The last result is kept in the runtime directory (diag-last.json, with its time) before any output "
        "file is written: tpu-monitor exports it (the diag group; Prometheus tpu_tools_diag_*), tpu-top shows "
        "each device's last verdict and tpu-dump includes it. A run with --inject is not kept; a run "
        "interrupted before any check leaves it as it was; one interrupted later is kept as partial, with the "
        "failures before it that it did not re-run, and the time of the last complete run "
        "(last_complete_time), from which the exported age counts. --junit and --save-reference are checked "
        "before the run: a folder, a missing folder, a special file or a FIFO without a reader is refused "
        "at once."
    ),
    "MANY PROCESSES AND HOSTS": (
        "--launch N starts N local processes joined by jax.distributed on 127.0.0.1 (CPU platform). Across "
        "hosts run the same command on every host with --coordinator HOST:PORT, --num-processes N and "
        "--process-id I. Every process tests its own devices; digests, rates and collective results are "
        "gathered to process 0, which compares every device of every host and prints the report."
    ),
    "JSON OUTPUT": (
        "--json prints one document, schema \"tpu-tools/diag/v1\": schema, time (UTC start), host, level, "
        "level_name, platform, device_kind, device_ids[], process_count, settings {level, duration_s, "
        "memory_fraction, inject, seed, rate_threshold, kat_size, transfer_bytes, gemm_size, sustained_size, "
        "collective_elements, iterations, only[], skip[], long_memory_fraction} (inject is a list of "
        "KIND:DEVICE), status (pass, fail, warn, interrupted), exit_code, interrupted, error, elapsed_s, counts "
        "{pass, warn, fail, skip}, checks[]: {test, status, why, device, link, process_id, duration_s, "
        "iteration, found_at, figures (a GEMM digest check: digest, key, key_fields; sustained: sensors "
        "{GPU: {temperature_peak_celsius, power_peak_watts, clock_sm_lowest_hz, throttle_seconds}})}, "
        "coverage {devices[]: {device, memory_tested_bytes, memory_free_bytes, memory_share}, links[], "
        "dtypes[]}, notes[], runtime {platform, device_kind, jax, jaxlib, runtime, xla_flags}. The kept "
        "diag-last.json adds last_complete_time. --junit FILE also writes JUnit XML: one testcase per check, a "
        "failed check as an error, a skipped one as skipped, an interrupted run as an error testcase."
    ),
    "EXIT STATUS": (
        "0 every test passed (skips allowed). 1 a test failed (wrong bits, a hang, a crash), a device is busy, "
        "or the runtime could not start. 2 bad input: a level other than 1 to 4, a bad --duration, a "
        "--memory-fraction of 0 or above 1, --inject naming a device that does not exist or a kind twice, an "
        "unknown --only or --skip name, a bad --coordinator, an output file that cannot be written, an "
        "unreadable --reference. 3 warnings only (nondeterminism, a slow device, throttled clocks, a reference "
        "that is not comparable). 130 Ctrl-C, 143 SIGTERM: the results so far are printed, status "
        "interrupted, and kept as partial when a check ended."
    ),
    "EXAMPLES": (
        "tpu-diag\n"
        "tpu-diag -r 2 --host-devices 8\n"
        "tpu-diag -r 3 --duration 30m --json > diag.json\n"
        "tpu-diag -r 2 --inject gemm:3\n"
        "tpu-diag -r 2 --only gemm --save-reference ref.json\n"
        "tpu-diag -r 2 --only gemm --reference ref.json\n"
        "tpu-diag -r 4 --skip sustained\n"
        "tpu-diag -r 1 --junit diag.xml\n"
        "tpu-diag -r 2 --launch 2"
    ),
}


def _level(ctx: click.Context, param: click.Parameter, value: str) -> int:
    text = str(value).strip()
    if text not in ("1", "2", "3", "4"):
        raise click.BadParameter(f"-r {quoted(text, 20)}: the level must be 1, 2, 3 or 4")
    return int(text)


def _names(values: tuple[str, ...]) -> tuple[str, ...]:
    """--only/--skip, repeated or comma-separated; names are compared without case or surrounding spaces."""
    return tuple(" ".join(part.split()).lower() for value in values for part in value.split(",") if part.strip())


def _fraction(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        share = Number(minimum=0.0, maximum=1e9).convert(value, param, ctx)
    except click.BadParameter:
        share = -1.0
    if not 0.0 < share <= 1.0:
        raise click.BadParameter(f"--memory-fraction {quoted(str(value), 20)}: use a share above 0 and at most 1 "
                                 "(e.g. 0.1)")
    return float(share)


class _RecordingCommand(ToolCommand):
    """Keeps the raw arguments: --launch re-runs them in each process."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


@click.command(name="diag", cls=_RecordingCommand, man_sections=MAN_SECTIONS, json_schema="tpu-tools/diag/v1")
@click.option("-r", "--level", default="1", show_default=True, metavar="LEVEL", callback=_level,
              help="1 quick (seconds), 2 medium (about two minutes), 3 long (sustained load, --duration), "
                   "4 extended (level 3 and most of free memory under more patterns; its time is said first).")
@click.option("--duration", type=Duration(minimum=1.0, maximum=7 * 86400.0), default=None, metavar="DURATION",
              help="How long -r 3 and -r 4 keep the devices loaded (e.g. 90s, 30m; default 15m).")
@click.option("--memory-fraction", "memory_fraction", default=None, callback=_fraction,
              metavar="SHARE", help="Share of each device's free memory the memory patterns test (default 0.02; "
                                    "at -r 4 the long patterns' share, default 0.8).")
@click.option("--inject", metavar="KIND:DEVICE", multiple=True,
              help="Flip one bit in DEVICE's output of one test (kat, transfer, gemm, memory, collective, "
                   "sustained): the run must fail naming it. Repeat for other kinds; the run is not kept as the "
                   "host's health.")
@click.option("--only", "only", metavar="TEST", multiple=True,
              help="Run only these tests (a name such as 'gemm f32', or a family: gemm, memory, ...; repeat or "
                   "separate with commas).")
@click.option("--skip", "skip", metavar="TEST", multiple=True, help="Do not run these tests (as --only names them).")
@click.option("--iterations", type=Count(1, 10_000), default=1, show_default=True, metavar="N",
              help="Run the selected tests N times in one runtime.")
@click.option("--reference", "reference_path", type=PathParam(path_type=str),
              metavar="FILE", default=None,
              help="Compare each GEMM digest with FILE's (written by --save-reference on a trusted machine).")
@click.option("--save-reference", "save_reference_path", type=PathParam(path_type=str), metavar="FILE",
              default=None,
              help="Write the GEMM digests every device agreed on to FILE, as a reference for other runs.")
@click.option("--force", is_flag=True, help="Run even when another process holds an accelerator.")
@click.option("--junit", "junit_path", type=PathParam(path_type=str), metavar="FILE", default=None,
              help="Also write JUnit XML to FILE.")
@click.option("--launch", type=Count(1, 64), default=None, metavar="N",
              help="Start N local processes joined by jax.distributed on 127.0.0.1 (CPU platform).")
@click.option("--coordinator", metavar="HOST:PORT", default=None,
              help="Address of process 0's coordinator (several processes or hosts).")
@click.option("--num-processes", "num_processes", type=Count(1, 1 << 20), default=None, metavar="N",
              help="Number of processes in the run.")
@click.option("--process-id", "process_id", type=Count(0, 1 << 20), default=None, metavar="I",
              help="This process's id, 0 to N-1 (process 0 prints the report).")
@runtime_options(default_timeout_s=DEFAULT_TIMEOUT_S)
@output_options
@common_options
def diag_command(level: int, duration: float | None, memory_fraction: float | None, inject: tuple[str, ...],
                 only: tuple[str, ...], skip: tuple[str, ...], iterations: int, reference_path: str | None,
                 save_reference_path: str | None, force: bool, junit_path: str | None, launch: int | None,
                 coordinator: str | None, num_processes: int | None, process_id: int | None, policy: RuntimePolicy,
                 timeout_s: float, out: Output) -> int:
    """Prove that every device computes correctly: known answers, cross-device digests, memory, links."""
    from tpu_tools.collectives.distributed import JoinSpec
    from tpu_tools.diag.settings import (
        DEFAULT_DURATION_S,
        DEFAULT_MEMORY_FRACTION,
        LONG_MEMORY_FRACTION,
        DiagSettings,
        parse_injections,
    )

    if duration is not None and level < 3:
        raise UsageError(f"--duration sets how long -r 3 and -r 4 run; this run is -r {level}")
    long_share = memory_fraction if level == 4 and memory_fraction is not None else LONG_MEMORY_FRACTION
    settings = DiagSettings(level=level, duration_s=duration or DEFAULT_DURATION_S,
                            memory_fraction=(DEFAULT_MEMORY_FRACTION if memory_fraction is None or level == 4
                                             else memory_fraction),
                            inject=parse_injections(inject), iterations=iterations, only=_names(only),
                            skip=_names(skip), long_memory_fraction=long_share)
    settings.validate()
    join = JoinSpec(coordinator, num_processes, process_id)
    join.validate()
    if save_reference_path is not None and settings.inject:
        raise UsageError("--save-reference with --inject would keep a corrupted result as the reference")
    reference = _load_reference(reference_path)
    outputs = Outputs({"--junit": junit_path, "--save-reference": save_reference_path})
    ctx = click.get_current_context()
    with outputs:  # refused before anything runs; a FIFO's reader is held until it is written
        if launch is not None:
            return _launch(ctx, launch, join, policy, timeout_s)
        if not force and not join.given:
            _refuse_busy(policy)
        return _diagnose(settings, join, policy, timeout_s, out, outputs, reference)


def _diagnose(settings: Any, join: Any, policy: RuntimePolicy, timeout_s: float, out: Output, outputs: Outputs,
              reference: Any) -> int:
    from tpu_tools.diag.records import DiagReport

    report = DiagReport(level=settings.level, time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        host=socket.gethostname(), settings=settings.to_dict())
    started = time.monotonic()
    reporter = join.process_id in (0, None)
    try:
        if join.given:
            reporter = _run_joined(settings, join, policy, timeout_s, report, out)
        else:
            _run_isolated(settings, policy, timeout_s, report)
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM: the results so far are kept, marked interrupted
        from tpu_tools import signals

        signals.note_interrupt(error)
        report.interrupted = True
        report.interrupt_exit_code = signals.interrupted_exit_code()
        report.elapsed_s = time.monotonic() - started
        if reporter:
            with signals.deferred():
                _finish(report, out, outputs, reference)
        raise
    report.elapsed_s = time.monotonic() - started
    if not reporter:
        return report.exit_code
    _finish(report, out, outputs, reference)
    if report.error:
        raise RuntimeFailure(report.error)
    return report.exit_code


class Outputs:
    """The files a run writes, checked before it starts (a folder, a missing folder, a special file, a FIFO
    nobody reads are refused then, not after a run of minutes). A FIFO is opened now and held until written:
    its reader is there, and does not see the end of the file before the output."""

    def __init__(self, paths: dict[str, str | None]):
        from tpu_tools.atomic import check_writable, stream_kind

        self.paths = {option: path for option, path in paths.items() if path is not None}
        self.held: list[int] = []
        for option, path in self.paths.items():
            if not path.strip():
                raise UsageError(f"{option} needs a file name")
            check_writable(path, True, what=option, option=option)
            if stream_kind(Path(path)) == "FIFO":
                self.held.append(_open_fifo(path, option))

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc: Any) -> None:
        for fd in self.held:
            os.close(fd)
        self.held = []

    def get(self, option: str) -> str | None:
        return self.paths.get(option)


def _open_fifo(path: str, option: str) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise UsageError(f"cannot write {option} {path}: it is a FIFO with no reader") from None
        raise UsageError(f"cannot write {option} {path}: {(error.strerror or str(error)).lower()}") from None


def _load_reference(path: str | None) -> Any:
    if path is None:
        return None
    from tpu_tools.diag.reference import load_reference

    return load_reference(path)


def _refuse_busy(policy: RuntimePolicy) -> None:
    """Never beside a job: a device held by another process is refused (as tpu-ls finds its holders)."""
    from tpu_tools.diag.busy import busy_holders

    holders = busy_holders(policy)
    if holders:
        owners = ", ".join(f"{h.pid} ({h.command.split(' ')[0] or '?'})" for h in holders)
        raise RuntimeFailure(f"the accelerator is busy: held by process {owners}; tpu-diag does not run beside a "
                             "job (--force runs it anyway, which may disturb that process)")


def _run_isolated(settings: Any, policy: RuntimePolicy, timeout_s: float, report: Any) -> None:
    from tpu_tools.diag.supervise import Supervisor

    with _progress() as progress:
        Supervisor(settings, policy, timeout_s, progress.event).run(report)


def _live_note(text: str) -> None:
    """A note that matters while the run goes on (the -r 4 estimate) is said when it comes."""
    if text.startswith("-r 4 "):
        note(f"note: {text}")


def _run_joined(settings: Any, join: Any, policy: RuntimePolicy, timeout_s: float, report: Any, out: Output) -> bool:
    """This process's part of a multi-process run; True on process 0, which reports."""
    from tpu_tools.collectives.launch import adopt_launcher
    from tpu_tools.diag.joined import run_joined
    from tpu_tools.diag.supervise import apply_event

    adopt_launcher()
    reserve_stdout()
    out.stream = sys.stdout

    current: list[tuple[str, int | None]] = []

    class ReportSink:
        def plan(self, info: dict[str, Any]) -> None:
            apply_event(report, {"event": "plan", **info})

        def begin(self, test: str, device: int | None) -> None:
            current[:] = [(test, device)]

        def check(self, check: Any) -> None:
            report.checks.append(check)

        def tick(self, text: str) -> None:
            pass

        def note(self, text: str) -> None:
            report.notes.append(text)
            _live_note(text)

    def on_expire(message: str) -> None:  # the watchdog's thread, just before the process ends
        from tpu_tools.diag.records import FAIL, Check

        report.error = message
        for test, device in current:
            report.checks.append(Check(test, FAIL, "hung: no progress within the time limit", device=device))
        if join.process_id in (0, None):
            _finish(report, out, None, None)
        sys.stderr.write(f"tpu-diag: error: {message}\n")
        sys.stderr.flush()

    return run_joined(settings, join, policy, timeout_s, ReportSink(), report, on_expire) == 0



def _launch(ctx: click.Context, processes: int, join: Any, policy: RuntimePolicy, timeout_s: float) -> int:
    from tpu_tools.collectives.distributed import free_port
    from tpu_tools.collectives.launch import Launcher, strip_option

    if join.given:
        raise UsageError("--launch chooses the coordinator and process ids itself: drop --coordinator, "
                         "--num-processes and --process-id")
    if policy.requested_platforms() not in ([], ["cpu"]):
        raise UsageError("--launch runs local processes on the CPU platform; on accelerators start one process "
                         "per host with --coordinator, --num-processes and --process-id")
    args = strip_option(ctx.meta["raw_args"], "--launch")
    host_devices = policy.host_devices or max(1, 8 // processes)
    args = strip_option(strip_option(args, "--host-devices"), "--platform")
    args += ["--platform", "cpu", "--host-devices", str(host_devices), "--force"]
    launcher = Launcher(processes, args, f"127.0.0.1:{free_port()}", timeout_s, note, debug=is_debug(),
                        module="tpu_tools.cli.diag", forward_interrupt=True)
    try:
        outcome = launcher.run()
    except KeyboardInterrupt as error:
        # the interrupt reached process 0 too: where it exited by itself it wrote its partial document
        first = launcher.ranks[0] if launcher.ranks else None
        if first is None or first.returncode is not None and first.returncode >= 0:
            if first is not None:
                json_written()
            raise
        from tpu_tools import signals

        signals.note_interrupt(error)
        raise Unreported(f"{signals.interrupt_word()} before process 0 reported: {_unreported(first)}") from None
    launched_first_answered(outcome)
    first = outcome.ranks[0] if outcome.ranks else None
    if first is not None and first.error is None and first.returncode in (0, 1, 3) and (
            first.returncode or not outcome.exit_code):
        return first.returncode  # process 0 printed the report: its verdict is the run's
    from tpu_tools.errors import EXIT_USAGE

    message = outcome.message or "a launched process failed"
    raise UsageError(message) if outcome.exit_code == EXIT_USAGE else RuntimeFailure(message)


class Unreported(ToolError):
    """Interrupted, and process 0 wrote no report: the launcher says what became of it."""

    def __init__(self, message: str):
        from tpu_tools import signals

        super().__init__(message)
        self.exit_code = signals.interrupted_exit_code()


def _unreported(first: Any) -> str:
    """Why process 0 of a launched run wrote no report after the interrupt was passed on to it."""
    from tpu_tools.collectives.launch import INTERRUPT_GRACE_S

    who = f"process 0 (pid {first.pid})"
    if first.returncode in (None, -signal.SIGKILL):
        return f"{who} did not write it within {INTERRUPT_GRACE_S:g} s and was killed"
    if first.returncode in (-signal.SIGTERM, -signal.SIGINT):
        return f"{who} was still starting (the signal came before it could answer it): no check ran"
    return first.describe_death() or f"{who} ended without one"


def _finish(report: Any, out: Output, outputs: Outputs | None, reference: Any) -> None:
    """Compare with the reference, keep the result as the host's health (first: whatever happens to the output,
    the record holds), print the report, then write the output files."""
    if reference is not None:
        from tpu_tools.diag.reference import compare_with_reference

        report.checks.extend(compare_with_reference(report, reference))
    _record(report)
    document = report.to_dict()
    if out.is_json:
        out.json(document)
    else:
        from tpu_tools.render.diag_view import checks_table, coverage_lines, header_line, sensor_lines, verdict_line

        out.text(header_line(report))
        if report.checks:
            out.table(checks_table(report))
        for line in sensor_lines(report) + coverage_lines(report):
            out.text(line)
        for line in report.notes:
            out.text(f"note: {line}")
        out.text(verdict_line(report))
    junit_path = outputs.get("--junit") if outputs else None
    if junit_path is not None:
        from tpu_tools.atomic import write_file
        from tpu_tools.diag.junit import junit_xml

        write_file(junit_path, junit_xml(report), True, what="--junit", option="--junit")
    save_path = outputs.get("--save-reference") if outputs else None
    if save_path is not None:
        from tpu_tools.diag.reference import save_reference

        if report.interrupted or report.error:
            note("note: the reference was not written: the run did not end")
        else:
            saved = save_reference(report, save_path)
            note(f"note: {saved} reference digest(s) written to {save_path}" if saved else
                 f"note: no digest every device agreed on: {save_path} holds none")


def _record(report: Any) -> None:
    """Keep the run as the host's health, as `record_run` allows (a problem with that is a note)."""
    from tpu_tools.metrics.diagstate import record_run
    from tpu_tools.metrics.rundir import RunDirError

    try:
        message = record_run(report.to_dict())
    except (RunDirError, UsageError, OSError) as error:
        note(f"note: the result was not kept for tpu-monitor: {error}")
        return
    if message:
        note(f"note: {message}")


class _Progress:
    """A bar on stderr while the tests run (terminals only); it disappears when the run ends."""

    def __init__(self, live: bool):
        self.live = live
        self.progress: Any = None
        self.task: Any = None
        self.total: int | None = None

    def __enter__(self) -> _Progress:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=console_on(sys.stderr), transient=True)
            self.task = self.progress.add_task("starting the runtime", total=None)
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if self.progress is None:
            if kind == "note":
                _live_note(str(event.get("text")))
            return
        if kind == "plan":
            self.progress.update(self.task, total=event.get("total"))
        elif kind == "begin":
            device = event.get("device")
            self.progress.update(self.task, description=str(event.get("test")) + (
                f" on device {device}" if device is not None else ""))
        elif kind == "tick":
            self.progress.update(self.task, description=f"sustained {event.get('text')}")
        elif kind == "check":
            self.progress.advance(self.task)
        elif kind == "note":
            _live_note(str(event.get("text")))


def _progress() -> _Progress:
    return _Progress(sys.stderr.isatty())


def main() -> None:
    run_cli(diag_command)


if __name__ == "__main__":
    main()
