"""`tpu-collectives-test`: collective bandwidth and correctness, on one host or many."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any

import click

from tpu_tools import jsonout
from tpu_tools.cli.common import (
    ToolCommand,
    closed_pipe,
    common_options,
    is_debug,
    launched_first_answered,
    run_cli,
    runtime_options,
)
from tpu_tools.cli.output import json_written, note, reserve_stdout
from tpu_tools.cli.params import Count, Number, PathParam
from tpu_tools.collectives.ops import REDOPS
from tpu_tools.errors import EXIT_GATE, EXIT_USAGE, GateFailed, RuntimeFailure, ToolError, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy
from tpu_tools.sanitize import safe_text

DEFAULT_HOST_DEVICES = 8
DEFAULT_TIMEOUT_S = 60.0

MAN_SECTIONS = {
    "DESCRIPTION": (
        "Measures the bandwidth of collective operations and proves their results, like nccl-tests and "
        "nccom-test, for any PJRT platform. The collectives are JAX SPMD programs "
        "(shard_map over a mesh of the selected devices): each device holds one buffer and the op runs along "
        "one mesh axis (--mesh AxB --axis NAME; groups along the other axes run side by side).\n"
        "Each size is compiled first (compile time is reported in JSON, not in the timing), warmed up, then "
        "timed as nccl-tests does: a sample is k calls issued back to back and one wait for the last "
        "(block_until_ready), k calibrated per size so that a sample lasts at least --sample-ms (default 5 ms) "
        "and the host's launch-and-wait round trip becomes noise; time(us) is the mean over --iters samples of "
        "sample / k; with several processes, the slowest process's. Each call waits for the previous call's "
        "output, so the runtime cannot run them side by side and overstate. The calibration issues at most "
        "65536 calls per sample and spends at most ten samples' time (1 s at least, a quarter of --timeout at "
        "most); when that cannot reach the sample length it says so in a note and goes on with the k it "
        "reached. --sample-ms 0 waits for every call (one call per sample): the latency including the round "
        "trip, the method before back-to-back timing.\n"
        "Two groups of columns, as in nccl-tests: out-of-place (a fresh output buffer each call) and in-place "
        "(the output overwrites the donated input: all-gather gathers from its own chunk of the full buffer, "
        "reduce-scatter writes its chunk at its own offset). The footer gives each op's small-message latency "
        "(the smallest size's time) next to the time of one call waited for. "
        "algbw = bytes / time (GB = 1e9). "
        "bytes is the per-rank buffer for all-reduce, permute and broadcast, and the whole gathered buffer "
        "(count x type size x ranks) for all-gather, reduce-scatter and all-to-all; count is per rank, or "
        "per peer for those three. busbw = algbw x factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter, "
        "all-to-all (n-1)/n; permute, broadcast 1. The header prints the formula used.\n"
        "Sizes not divisible into whole elements per rank are rounded down as nccl-tests does (at least one "
        "element per rank), with a note on stderr.\n"
        "Correctness: inputs are crafted (small integers, so that every sum, product, maximum and mean is "
        "exact in the chosen type); every device's result on every process is compared bit for bit with the "
        "result computed on the host: out-of-place, the last result of the timed calls (its input never "
        "changes); in-place, the first call on the crafted buffer, before the timed chain. #wrong is the "
        "number of differing elements summed over all processes, per column. --check off skips it (#wrong "
        "N/A).\n"
        "all-reduce supports the reductions sum, max, min, prod and avg (--redop all runs each); "
        "reduce-scatter supports sum only (JAX's psum_scatter). prod is an XLA all-reduce with a multiply "
        "reducer. broadcast is XLA's collective-broadcast on GPU; on platforms whose compiler has none "
        "(CPU, TPU) it is the equivalent JAX documents for pbroadcast, an all-reduce of the root's buffer "
        "with the others masked, and the header says so.\n"
        "With no accelerator, the CPU platform exposes 8 devices (--host-devices), so a run on a laptop "
        "takes seconds."
    ),
    "MANY PROCESSES AND HOSTS": (
        "--launch N starts N local processes joined by jax.distributed on 127.0.0.1, each with its own CPU "
        "devices (--host-devices each, default 8/N), collectives between processes over gloo: the real "
        "multi-controller path on one machine.\n"
        "Across hosts, run the same command on every host with --coordinator HOST:PORT (process 0's address), "
        "--num-processes N and --process-id I; under a scheduler or on a TPU pod that JAX recognises "
        "(SLURM, Open MPI, Kubernetes, Cloud TPU, or JAX_COORDINATOR_ADDRESS), give none of them.\n"
        "Process 0 prints the table and writes --json; every process checks its own devices; wrong counts "
        "and times are gathered to process 0. Each process's own time is listed after the table against the "
        "median of all processes at each size, and a process more than --slow-threshold percent over it is "
        "flagged SLOW by process id, host and pid. In a collective that synchronises every rank (all-reduce, "
        "all-gather), all processes wait for the slowest and their times are close; a permute (ring shift) "
        "shows a slow receiver on its own.\n"
        "--timeout S bounds every wait: joining, each iteration, each exchange. A process that dies or hangs "
        "makes the others stop within the timeout with an error naming the missing process (host and pid), or "
        "the coordinator when process 0 is the one lost. When process 0 dies, JAX itself ends the other "
        "processes at once; with --launch the error names the process that died and how."
    ),
    "JSON OUTPUT": (
        "--json FILE writes one document, schema \"tpu-tools/collectives/v1\" (FILE - prints it instead of "
        "the table). It is written also when a size fails, the run times out or fails to start (then with "
        "null data and the error).\n"
        "schema, command, time (UTC), platform, device_kind, jax_version, jaxlib_version, process_count, "
        "processes[]: {process_id, host, pid, device_ids[]}, device_ids[], mesh: {shape[], axis_names[], axis}, "
        "ranks (per group), groups, settings: {dtype, min_bytes, max_bytes, step_factor, step_bytes, iters, "
        "warmup, sample_ms, check, stats[], root, shift, timeout_s, min_busbw_gbps, slow_threshold_percent}.\n"
        "tests[]: {op, redop, root, shift, implementation, ranks, groups, busbw_factor, busbw_formula, "
        "avg_busbw_gbps (out-of-place), wrong (both columns), small_message_latency: {size_bytes, "
        "out_of_place_us, in_place_us, blocking_call_us} (null when no size ran), results[]}; results[]: "
        "{requested_bytes, size_bytes, count, dtype, redop, root, time_us, stats_us: {p50: ...}, algbw_gbps, "
        "busbw_gbps, wrong (null when not checked), checked_elements (these are out-of-place), compile_ms "
        "(both forms), processes[]: {process_id, host, time_us, stats_us, wrong, slow, in_place_time_us, "
        "in_place_wrong}, error, in_place: {time_us, stats_us, algbw_gbps, busbw_gbps, wrong, "
        "checked_elements} (null when the size failed), calls_per_sample (k), sample_ms (mean sample length), "
        "blocking_call_us (median time of one call issued and waited for), calibration_note (why the samples "
        "are shorter than --sample-ms, else null)}.\n"
        "wrong, avg_busbw_gbps, slow_processes[]: {process_id, host, pid, slow_sizes, worst_ratio}, notes[], "
        "status (ok, wrong_values, below_min_busbw, failed), error, exit_code."
    ),
    "EXIT STATUS": (
        "0 every size ran and every value was right. 1 a size failed, a process went missing, the runtime "
        "failed. 2 bad options. 3 wrong values (#wrong > 0), or an op's average busbw below --min-busbw. 130 "
        "Ctrl-C, 143 SIGTERM: --json is written with the sizes measured so far."
    ),
    "EXAMPLES": (
        "tpu-collectives-test all-reduce\n"
        "tpu-collectives-test all -b 8 -e 64M -f 2 -d bf16 --stats p50,p99\n"
        "tpu-collectives-test all-reduce -o all --check on --json result.json\n"
        "tpu-collectives-test all-reduce -b 8 -e 8 --sample-ms 20 --stats p50,max\n"
        "tpu-collectives-test all-gather --mesh 2x4 --axis y\n"
        "tpu-collectives-test all-reduce --launch 4 --timeout 20\n"
        "tpu-collectives-test all-reduce --coordinator 10.0.0.2:8476 --num-processes 4 --process-id 1\n"
        "tpu-collectives-test all-reduce -b 64M -e 1G --min-busbw 100 --platform tpu"
    ),
}


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    from tpu_tools.parsing import parse_size

    try:
        return parse_size(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def _dtype(ctx: click.Context, param: click.Parameter, value: str):
    from tpu_tools.collectives.dtypes import parse_dtype

    try:
        return parse_dtype(value)
    except UsageError as error:
        raise click.BadParameter(str(error)) from None


def _op(ctx: click.Context, param: click.Parameter, value: str):
    from tpu_tools.collectives.ops import parse_op

    try:
        return parse_op(value)
    except UsageError as error:
        raise click.BadParameter(str(error)) from None


class _RecordingCommand(ToolCommand):
    """Keeps the raw arguments: --launch re-runs them in each process."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


@click.command(name="collectives-test", cls=_RecordingCommand, man_sections=MAN_SECTIONS,
               json_schema="tpu-tools/collectives/v1")
@click.argument("op", required=False, default="all-reduce", metavar="[OP]", callback=_op)
@click.option("-b", "--min-bytes", "min_bytes", default="1K", show_default=True, metavar="SIZE", callback=_size,
              help="Smallest size (K, M, G suffixes: 1K = 1024).")
@click.option("-e", "--max-bytes", "max_bytes", default="16M", show_default=True, metavar="SIZE", callback=_size,
              help="Largest size.")
@click.option("-f", "--step-factor", "step_factor", type=Number(maximum=float(1 << 50)), default=None, metavar="F",
              help="Multiply the size by F each step (default 2).")
@click.option("-i", "--step-bytes", "step_bytes", default=None, metavar="SIZE", callback=_size,
              help="Add SIZE each step instead of multiplying.")
@click.option("-d", "--dtype", default="f32", show_default=True, metavar="TYPE", callback=_dtype,
              help="Element type: f32, bf16, f16, f64, i8, u8, i16, u16, i32, u32, i64, u64.")
@click.option("-o", "--redop", type=click.Choice([*REDOPS, "all"]), default="sum", show_default=True,
              help="Reduction of all-reduce (all: each in turn).")
@click.option("-n", "--iters", type=Count(1, 10**7), default=20, metavar="N", show_default=True,
              help="Timed samples per size, each k calls back to back.")
@click.option("--sample-ms", "sample_ms", type=Number(minimum=0.0, maximum=60_000.0), default=5.0, metavar="MS",
              show_default=True, help="Calibrate k so a sample lasts at least MS (0: wait for every call).")
@click.option("-w", "--warmup", type=Count(0, 10**7), default=5, metavar="N", show_default=True,
              help="Untimed iterations before timing.")
@click.option("-c", "--check", type=click.Choice(["on", "off", "1", "0"]), default="on", show_default=True,
              help="Check every result against the host's, bit for bit.")
@click.option("--stats", metavar="LIST", default=None,
              help="Extra time columns: percentiles and extremes, e.g. p50,p99 (also min, max).")
@click.option("--root", type=Count(0, 1 << 20), default=0, metavar="RANK", show_default=True,
              help="Rank that broadcast sends from.")
@click.option("--shift", type=Number(minimum=-(1 << 20), maximum=1 << 20, integer=True), default=1, metavar="K",
              show_default=True,
              help="permute sends rank r's buffer to rank r+K (mod n).")
@click.option("--devices", "devices", metavar="IDS", default=None,
              help="Devices taking part, by id: 0,1,4-7 (default: all).")
@click.option("--mesh", "mesh", metavar="AxB", default=None,
              help="Arrange the devices as a mesh with axes x, y (z), e.g. 2x4 (default: one axis).")
@click.option("--axis", metavar="NAME", default=None, help="Mesh axis the op runs along (default: the last).")
@click.option("--min-busbw", "min_busbw", type=Number(minimum=0.0, maximum=1e9), default=None, metavar="GBPS",
              help="Exit 3 when an op's average busbw (GB/s) is below this floor.")
@click.option("--slow-threshold", "slow_threshold", type=Number(minimum=0.0, maximum=1e6), default=20.0,
              show_default=True, metavar="PCT",
              help="Flag a process whose time is more than PCT percent over the median.")
@click.option("--force", is_flag=True, help="Replace the --json file if it exists.")
@click.option("--json", "json_path", type=PathParam(path_type=str), metavar="FILE", default=None,
              help="Write the JSON document to FILE (- for stdout instead of the table).")
@click.option("--launch", type=Count(1, 1024), default=None, metavar="N",
              help="Start N local processes joined by jax.distributed on 127.0.0.1 (gloo between them).")
@click.option("--coordinator", metavar="HOST:PORT", default=None,
              help="Address of process 0's coordinator (several processes or hosts).")
@click.option("--num-processes", "num_processes", type=Count(1, 1 << 20), default=None, metavar="N",
              help="Number of processes in the run.")
@click.option("--process-id", "process_id", type=Count(0, 1 << 20), default=None, metavar="I",
              help="This process's id, 0 to N-1 (process 0 serves the coordinator and prints).")
@runtime_options(default_host_devices=DEFAULT_HOST_DEVICES, default_timeout_s=DEFAULT_TIMEOUT_S)
@common_options
def collectives_command(op, dtype, check: str, slow_threshold: float, force: bool, json_path: str | None,
                        launch: int | None,
                        coordinator: str | None, num_processes: int | None, process_id: int | None,
                        policy: RuntimePolicy, timeout_s: float, **options: Any) -> int:
    """Measure collective bandwidth and check every result, on one host or many.

    OP: all-reduce (default), all-gather, reduce-scatter, all-to-all, permute, broadcast, or all.
    """
    from tpu_tools.collectives.distributed import JoinSpec
    from tpu_tools.collectives.settings import build_settings

    ctx = click.get_current_context()
    settings, notes = build_settings(ops=op, dtype=dtype, check=check in ("on", "1"),
                                     slow_threshold_percent=slow_threshold, timeout_s=timeout_s, **options)
    for line in notes:
        note(f"note: {line}")
    join = JoinSpec(coordinator, num_processes, process_id)
    join.validate()
    if json_path is not None and json_path != "-":
        from tpu_tools.atomic import check_writable

        check_writable(json_path, force, what="--json", option="--json")
    if launch is not None:
        return _launch(ctx, launch, join, policy, timeout_s)
    from tpu_tools.collectives.launch import adopt_launcher

    adopt_launcher()
    return _run(ctx, settings, join, policy, json_path, force)


def _launch(ctx: click.Context, processes: int, join, policy: RuntimePolicy, timeout_s: float) -> int:
    from tpu_tools.collectives.distributed import check_port_free, free_port, is_loopback, parse_address
    from tpu_tools.collectives.launch import Launcher, devices_per_process, strip_option

    if join.num_processes is not None or join.process_id is not None:
        raise UsageError("--launch chooses the process ids itself: drop --num-processes and --process-id")
    if processes < 1:
        raise UsageError(f"--launch must be at least 1, got {processes}")
    if policy.requested_platforms() not in ([], ["cpu"]):
        raise UsageError("--launch runs local processes on the CPU platform; on accelerators start one process "
                         "per host with --coordinator, --num-processes and --process-id")
    if join.coordinator is not None:
        host, port = parse_address(join.coordinator)
        if not is_loopback(host):
            raise UsageError("--launch serves its coordinator on this machine: use a loopback --coordinator "
                             "such as 127.0.0.1:PORT")
        check_port_free(host, port)
        coordinator = f"{host}:{port}"
    else:
        coordinator = f"127.0.0.1:{free_port()}"
    args = strip_option(strip_option(ctx.meta["raw_args"], "--launch"), "--coordinator")
    per_process = policy.host_devices if _given(ctx, "host_devices") else devices_per_process(
        DEFAULT_HOST_DEVICES, processes)
    args += ["--platform", "cpu", "--host-devices", str(per_process)]
    outcome = Launcher(processes, args, coordinator, timeout_s, note, debug=is_debug()).run()
    launched_first_answered(outcome)
    if outcome.exit_code:
        raise _error(outcome.exit_code, outcome.message or "a launched process failed")
    return 0


def _error(code: int, message: str) -> ToolError:
    """The error a run ended with, carrying its exit status."""
    kind = {EXIT_USAGE: UsageError, EXIT_GATE: GateFailed}.get(code, RuntimeFailure)
    return kind(message)


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _run(ctx: click.Context, settings, join, policy: RuntimePolicy, json_path: str | None, force: bool) -> int:
    from tpu_tools.collectives.runner import CollectivesRun

    prog = ctx.find_root().info_name or "tpu-collectives-test"
    command = " ".join([prog, *ctx.meta["raw_args"]])
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    table = json_path != "-"
    run: CollectivesRun | None = None

    def write_json(message: str | None, code: int) -> None:
        if json_path is None or (run is not None and not run.is_reporter):
            return
        from tpu_tools.collectives.report import STATUS_FAILED, failure_document

        report = run.report if run is not None else None
        if report is None:
            document = failure_document(command, started, message or "", code)
        else:
            if message and not report.error:
                report.error, report.status, report.exit_code = message, STATUS_FAILED, code
            document = report.to_dict()
        _write_document(json_path, document, force)

    def on_fatal(message: str) -> None:  # from the watchdog thread, just before the process ends
        write_json(message, 1)
        sys.stderr.write(f"{prog}: error: {message}\n")
        sys.stderr.flush()

    reserve_stdout()
    run = CollectivesRun(settings, policy, join, on_fatal, command)
    try:
        report = run.open()
        show = table and run.is_reporter
        if show:
            from tpu_tools.render.collectives_view import header_lines

            _lines(header_lines(report, f"tpu-collectives-test {_title(settings)}"))
        for test in settings.tests:
            section = run.begin(test)
            if section.note and run.is_reporter:
                note(f"note: {section.note}")
            _render_section(run, section, settings, show)
        code = run.finish()
        if show:
            from tpu_tools.render.collectives_view import footer_lines

            _lines(footer_lines(report))
        write_json(None, code)
    except ToolError as error:
        write_json(str(error), error.exit_code)
        raise
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM: the sizes measured so far are kept
        from tpu_tools import signals

        signals.note_interrupt(error)
        with signals.deferred():
            write_json(f"{signals.interrupt_word()}: partial results", signals.interrupted_exit_code())
        raise
    finally:
        run.close()
    if code and run.is_reporter and report.error:
        raise _error(code, report.error)  # process 0 says why; the others just share the exit status
    return code



def _render_section(run, section, settings, show: bool) -> None:
    from tpu_tools.render.collectives_view import row_line, section_footer, section_lines

    if show:
        _lines(section_lines(section.result, settings.stats))
    for row in run.run(section):
        if show:
            _lines([row_line(row, settings.stats)])
        if row.calibration_note and run.is_reporter:
            note(f"note: {row.calibration_note}")
    if show and len(settings.tests) > 1:
        _lines([section_footer(section.result)])


def _title(settings) -> str:
    names = list(dict.fromkeys(t.op.name for t in settings.tests))
    return names[0] if len(names) == 1 else "all"


def _lines(lines: list[str]) -> None:
    try:
        for line in lines:
            sys.stdout.write(safe_text(line, multiline=True) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader has what it wanted (`| head`): go on quietly, so every process ends in order.
        closed_pipe()


def _write_document(path: str, document: dict[str, Any], force: bool) -> None:
    text = jsonout.dumps(document) + "\n"
    if path == "-":
        json_written()
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from tpu_tools.atomic import write_file

    # Written whole and renamed into place: a reader never sees half a document, a planted link is not followed.
    write_file(path, text, force, what="--json", option="--json")


def main() -> None:
    run_cli(collectives_command)


if __name__ == "__main__":
    main()
