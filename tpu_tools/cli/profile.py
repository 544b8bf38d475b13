"""`tpu-profile`: where the device time goes, and why a function compiled again."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tpu_tools.cli.common import ToolCommand, ToolGroup, common_options, output_options, run_cli, runtime_options
from tpu_tools.cli.output import Output, note, resolve_format
from tpu_tools.cli.params import Count, PathParam, Seconds, refuse_empty_path
from tpu_tools.errors import EXIT_OK, ToolError, UsageError
from tpu_tools.parsing import MAX_PERIOD_S
from tpu_tools.pjrt.runtime import RuntimePolicy
from tpu_tools.sanitize import safe_text

if TYPE_CHECKING:
    from tpu_tools.profile.document import ProfileSummary

MAX_CAPTURE_S = 3600.0  # the profiler server holds the whole capture in memory

SUBCOMMANDS = {
    "run": "tpu_tools.cli.profile:run_command",
    "summary": "tpu_tools.cli.profile:summary_command",
    "hlo": "tpu_tools.cli.profile:hlo_command",
    "capture": "tpu_tools.cli.profile:capture_command",
    "cache": "tpu_tools.cli.profile_cache:cache_group",
}

SUMMARY_SCHEMA = (
    "summary.json and `summary --json` hold one document, schema \"tpu-tools/profile/v1\"; times are in the unit "
    "their key names give; unknown values are null. capture --json prints the same document (source capture).\n"
    "schema, source (run, trace or capture), created (UTC, ISO 8601), host, versions {tpu_tools, jax, jaxlib, "
    "plugins}.\n"
    "program: null, or {argv[], module, status (exited, raised, interrupted), exit_code, error, wall_time_s}.\n"
    "window: null, or {mode (whole, time, or steps: a window of the steps the program marks with "
    "tpu_tools.agent.step() or step_context(), counted from 0), delay_s, duration_s, start_step, "
    "steps, opened, opened_at_s, closed_at_s, first_step, last_step, closed_by, note}.\n"
    "trace: null, or {dir, run_dir, xplane_files[], perfetto_file, start_time, duration_us, hosts[], python_frames, "
    "jax_version}.\n"
    "devices[]: {device, op_count, busy_us, idle_us, busy_percent}; device_time_us: the sum of op self times.\n"
    "top_ops[]: {name, module, count, total_us, mean_us, percent_of_device_time}; modules[]: {name, op_count, "
    "total_us, percent_of_device_time}.\n"
    "host_dispatch: {dispatches, dispatch_time_us, mean_dispatch_us, compiling_dispatches, "
    "compiling_dispatch_time_us}: calls that compiled are counted apart from the dispatch time.\n"
    "compile_source: monitoring (recorded by run from jax.monitoring), torch_xla (recorded by run from torch_xla's "
    "CompileTime samples, each compile credited to the line that called torch_xla.sync) or trace (read from the "
    "trace alone).\n"
    "compiles[]: {function, defined_at, compiles, traces, compile_time_s, trace_time_s, lowering_time_s, "
    "xla_compile_time_s, persistent_cache_hits, calls, cache_hits}.\n"
    "recompilations[]: {function, defined_at, recompiles, reasons[]: {reason, count, call_sites[]}}.\n"
    "eager: null, or {dispatches, host_time_us, ops[]: {name, count, host_time_us}, call_sites[]: {call_site, "
    "function, file, line, dispatches, host_time_us, ops {name: count}}}.\n"
    "notes[]: sentences about what could not be known or done."
)
HLO_SCHEMA = (
    "hlo --json prints one document, schema \"tpu-tools/profile-hlo/v1\": target, args[], platform, device_kind, "
    "files {stablehlo, optimized_hlo}, lowering_time_s, compile_time_s, cost {flops, transcendentals, "
    "bytes_accessed, output_bytes_accessed}, memory {argument_bytes, output_bytes, alias_bytes, temp_bytes, "
    "generated_code_bytes, peak_bytes}, roofline {chip, peak_dtype, peak_flops_per_s, "
    "memory_bandwidth_bytes_per_s, arithmetic_intensity_flops_per_byte, ridge_point_flops_per_byte, bound "
    "(compute, memory or null), compute_time_us, memory_time_us, best_case_time_us, note}, model_flops (the "
    "analytic FLOP count of a built-in workload, else null), xla_to_model_flops_ratio (cost.flops / model_flops), "
    "outputs[] {index, reach (all, partial, local, replicated_input or unknown), axes[] (the mesh axes reduced over), "
    "devices, text}: for each output of the compiled program, the cross-device reductions on its path back to "
    "the inputs, read from the optimised HLO and their replica groups (\"reduced over all 8 devices (axes data, "
    "model)\", \"partial: reduced over data only\", \"local: no cross-device reduction on its path\", "
    "\"replicated input, no reduction needed\"); the text report lists them when the program runs on more than "
    "one device."
)

GROUP_MAN = {
    "DESCRIPTION": (
        "tpu-profile shows, for any JAX program and without editing it, which device ops dominate and what was "
        "compiled, how often and why. `run` executes a program with JAX's profiler on and records JAX's compile "
        "events (jax.monitoring) and its explanations of cache misses (jax_explain_cache_misses); `summary` "
        "reports on a trace folder, also one written by jax.profiler outside this tool; `hlo` shows what XLA "
        "makes of one function; `capture` takes a trace from a process running jax.profiler.start_server.\n"
        "The program runs in the tpu-profile process itself, as `python script.py` would run it: its own "
        "argv, __main__, stdout and stderr. jax is imported only when the program imports it, so a program that "
        "sets XLA_FLAGS or JAX_PLATFORMS, or calls jax.config.update, before using jax behaves as it does alone. "
        "The trace starts when the program's JAX runtime has started. Only one jax.profiler trace can run in a "
        "process: a program that starts its own trace while tpu-profile traces gets jax's error.\n"
        "The output folder (--out, default tpu-profile-YYYYmmdd-HHMMSS) holds trace/ (the trace as JAX wrote "
        "it: trace/plugins/profile/<run>/<host>.xplane.pb for TensorBoard's profile plugin or xprof, and "
        "perfetto_trace.json.gz beside it for ui.perfetto.dev), summary.json and report.txt."
    ),
    "REPORT": (
        "Devices: busy time (the union of op intervals) and idle time over the trace, per device. On the CPU "
        "platform the device is the host, and its ops are the XLA ops that ran on host threads.\n"
        "Top ops: by device self time (nested ops subtracted), with count, total, mean and share of all device "
        "time.\n"
        "Host dispatch: the outermost calls into jitted code (jaxlib's PjitFunction events): host time spent in "
        "them, less device ops that ran inline and compilation.\n"
        "Compilation: per function, XLA compilations (with those served by the persistent compilation cache), "
        "the time to trace, lower and compile, calls seen in the trace, and cache hits: the calls that ran without "
        "compiling. Functions are named as jax names them; two functions with one name are counted together.\n"
        "Recompilations: JAX's own reason for each new trace of a function it had traced before (e.g. \"at x, "
        "now f32[4] and before f32[3]\"), grouped by function and where it is defined, with the lines that "
        "called it. JAX explains misses for functions defined in the user's files only. The explanations are "
        "recorded, not printed, unless JAX_EXPLAIN_CACHE_MISSES is set.\n"
        "Op-by-op dispatch: JAX operations called one at a time outside jit (x + 1 on arrays, jnp.tanh(x) in a "
        "Python loop), counted per op and per calling function, from the Python frames of the trace; those "
        "functions are candidates for jax.jit. The calling function is shown with the line it is defined on.\n"
        "From a trace alone (summary of a folder written by jax.profiler) compile counts and times come from "
        "the compile events inside calls, and reasons are unknown."
    ),
    "JSON OUTPUT": SUMMARY_SCHEMA + "\n" + HLO_SCHEMA,
    "EXIT STATUS": (
        "run: the program's own exit status (sys.exit(3) gives 3, an uncaught exception 1, Ctrl-C 130, SIGTERM 143; "
        "os._exit(N) in the main thread counts as exit N, with the profile kept), after "
        "the profile is written; 2 when the program cannot be started (no such script or module, a bad option, "
        "an existing --out).\n"
        "summary, hlo, capture: 0 success; 1 a trace that cannot be read, a function that does not compile, a "
        "capture that failed or a missing client package; 2 bad input (no such folder, not a trace, a bad --arg "
        "or target, an existing --out)."
    ),
    "EXAMPLES": (
        "tpu-profile run -- train.py --steps 100\n"
        "tpu-profile run --delay 30 --duration 5 --out prof -- train.py\n"
        "tpu-profile run --start-step 100 --steps 3 -- train.py   (steps marked with tpu_tools.agent.step())\n"
        "tpu-profile run -m mypkg.train -- --config small.yaml\n"
        "tpu-profile summary prof\n"
        "tpu-profile summary /tmp/tensorboard --json\n"
        "tpu-profile hlo mypkg.model:loss --arg f32[128,512] --arg f32[512,512] --chip v5e\n"
        "tpu-profile hlo train --preset small --chip v6e\n"
        "tpu-profile capture --addr 127.0.0.1:9999 --duration 2"
    ),
}


@click.group(cls=ToolGroup, name="profile", lazy_commands=SUBCOMMANDS, man_sections=GROUP_MAN)
@common_options
def profile_group() -> None:
    """Profile JAX programs: top device ops, compilation and recompilation, HLO cost."""


def _top_option(function):
    return click.option("--top", type=Count(1, 100_000), default=15, show_default=True, metavar="N",
                        help="Rows in the op, call-site and compile tables.")(function)


def _out_options(default: str):
    def decorate(function):
        function = click.option("--force", is_flag=True, help="Write into --out even when it exists.")(function)
        return click.option("--out", "out_dir", type=PathParam(readable=True), metavar="DIR",
                            help=f"Output folder (must not exist). Default: {default}.")(function)
    return decorate


def _render(document: ProfileSummary, out: Output) -> None:
    from tpu_tools.render.profile_view import report_blocks

    out.blocks(report_blocks(document))


def _where_lines(document: ProfileSummary | None, folder: Path) -> list[str]:
    from tpu_tools.profile.summary import relative_to_cwd

    shown = relative_to_cwd(str(folder))
    if document is None:
        return [f"tpu-profile: what was recorded is in {shown}"]
    lines = [f"tpu-profile: profile written to {shown} (summary.json, report.txt; "
             f"again with: tpu-profile summary {shown})"]
    trace = document.trace
    if trace:
        trace_dir = relative_to_cwd(trace.dir)
        lines.append(f"  TensorBoard: tensorboard --logdir {trace_dir}  (with tensorboard-plugin-profile; "
                     f"or: xprof --logdir {trace_dir})")
        if trace.perfetto_file:
            lines.append(f"  Perfetto:    load {relative_to_cwd(trace.perfetto_file)} in https://ui.perfetto.dev")
    return lines


# --- run -------------------------------------------------------------------------------------------

@click.command(name="run", cls=ToolCommand,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-m", "--module", metavar="MODULE", help="Run a module, as python -m MODULE does.")
@_out_options("tpu-profile-YYYYmmdd-HHMMSS in the current folder")
@click.option("--delay", "delay_s", type=Seconds(zero=True, maximum=MAX_PERIOD_S), default=0.0, metavar="SECONDS",
              help="Start tracing this many seconds after the program starts (or when its runtime is up, if later).")
@click.option("--duration", "duration_s", type=Seconds(maximum=MAX_PERIOD_S), default=None, metavar="SECONDS",
              help="Stop tracing after this many seconds; the program runs on. Default: until it ends.")
@click.option("--start-step", type=Count(0, 1 << 40), default=None, metavar="N",
              help="Trace from step N (0 for the first) of the steps the program marks with tpu_tools.agent.step() "
                   "or step_context(); needs --steps.")
@click.option("--steps", type=Count(1, 1 << 40), default=None, metavar="M",
              help="With --start-step: how many steps to trace.")
@click.option("--no-python-trace", is_flag=True,
              help="Leave Python frames out of the trace (less overhead; call sites become unknown).")
@click.option("--quiet", is_flag=True, help="Print only where the profile is, not the report.")
@_top_option
@runtime_options(timeout=False)
@common_options
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="[--] SCRIPT [ARGS]...")
def run_command(module: str | None, out_dir: Path | None, force: bool, delay_s: float, duration_s: float | None,
                start_step: int | None, steps: int | None, no_python_trace: bool, quiet: bool, top: int,
                policy: RuntimePolicy, program: tuple[str, ...]) -> int:
    """Run a Python program with JAX's profiler and compile recording on; report where the time went.

    The program and its arguments go after --: run [OPTIONS] -- script.py ARGS, or run [OPTIONS] -m MODULE -- ARGS.
    """
    from tpu_tools.pjrt.runtime import apply, check_platform_installed, check_xla_flags
    from tpu_tools.profile.runner import ProgramTarget
    from tpu_tools.profile.session import prepare_output_dir, profile_program, write_report
    from tpu_tools.profile.window import WindowSpec

    args = list(program)
    if module is None:
        if not args:
            raise UsageError("no program to run: tpu-profile run [OPTIONS] -- script.py [ARGS]... "
                             "(or -m MODULE)")
        refuse_empty_path(args[0], "the script to run")
        target = ProgramTarget(script=Path(args[0]), args=tuple(args[1:]))
    else:
        target = ProgramTarget(module=module, args=tuple(args))
    if (start_step is None) != (steps is None):
        raise UsageError("--start-step and --steps go together: trace steps N to N+M-1")
    if start_step is not None and (delay_s or duration_s is not None):
        raise UsageError("choose one trace window: --start-step/--steps, or --delay/--duration")
    window = WindowSpec(delay_s=delay_s, duration_s=duration_s, start_step=start_step, steps=steps)
    check_platform_installed(policy)
    check_xla_flags(policy)  # XLA aborts the whole process on a flag it does not know
    apply(policy)  # before anything of the program is imported: -m imports its parent packages to find it
    target.validate()
    folder = prepare_output_dir(out_dir, force)

    report = profile_program(target, folder, window, python_trace=not no_python_trace, top=top)
    outcome = report.outcome
    if outcome.traceback_text:
        sys.stderr.write(safe_text(outcome.traceback_text, multiline=True))
    if outcome.exit_message:
        sys.stderr.write(safe_text(outcome.exit_message, multiline=True) + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    stderr = Output(resolve_format("auto", False, sys.stderr), stream=sys.stderr)
    if outcome.status == "interrupted":
        note("tpu-profile: interrupted; " + ("the trace so far is kept" if outcome.window.opened
                                             else "nothing had been traced yet"))
    if report.summary is not None:
        from tpu_tools.render.profile_view import report_text

        write_report(report_text(report.summary), folder)
        if not quiet:
            stderr.text("")
            _render(report.summary, stderr)
            stderr.text("")
    else:
        note(f"tpu-profile: error: could not summarise the profile: {report.summary_error}")
    for line in _where_lines(report.summary, folder.path):
        note(line)
    return outcome.exit_code


# --- summary ---------------------------------------------------------------------------------------

@click.command(name="summary", cls=ToolCommand, json_schema="tpu-tools/profile/v1")
@click.argument("path", type=PathParam(readable=True), metavar="DIR")
@_top_option
@output_options
@common_options
def summary_command(path: Path, top: int, out: Output) -> int:
    """Report on a trace folder: one written by tpu-profile, or by jax.profiler in any program.

    DIR: a tpu-profile output folder, a jax.profiler log folder (plugins/profile/<run>/), a run folder or a file.
    """
    from tpu_tools.pjrt.runtime import apply
    from tpu_tools.profile.session import summarise_path

    apply(RuntimePolicy(platform="cpu"))  # reading a trace never needs, and must never take, an accelerator
    document = summarise_path(path, top)
    if out.is_json:
        out.json(document)
    else:
        _render(document, out)
    return EXIT_OK


# --- hlo -------------------------------------------------------------------------------------------

@click.command(name="hlo", cls=ToolCommand, json_schema="tpu-tools/profile-hlo/v1")
@click.argument("target", metavar="MODULE:FUNCTION|train|infer")
@click.option("--arg", "arg_specs", multiple=True, metavar="SPEC",
              help="One argument's dtype and shape, e.g. f32[128,512], bf16[8], i32[] (repeatable, in order).")
@click.option("--preset", default=None, metavar="NAME",
              help="Model size of the built-in train or infer workload: tiny, small or base. Default: tiny.")
@click.option("--batch", type=Count(1, 1 << 20), default=None, metavar="N",
              help="Batch size of the built-in workload. Default: the preset's batch per device.")
@click.option("--chip", metavar="NAME", help="Judge the roofline against this chip's peak (v5e, v6e, H100, ...) "
              "instead of the local device's.")
@_out_options("tpu-profile-hlo-YYYYmmdd-HHMMSS in the current folder")
@runtime_options(timeout=False)
@output_options
@common_options
def hlo_command(target: str, arg_specs: tuple[str, ...], preset: str | None, batch: int | None, chip: str | None,
                out_dir: Path | None, force: bool, policy: RuntimePolicy, out: Output) -> int:
    """Lower and compile one function: StableHLO and optimised HLO files, cost, memory, roofline.

    TARGET is MODULE:FUNCTION with its arguments given by --arg, or a built-in workload: train (one training
    step of the tpu-bench transformer) or infer (its forward pass), sized by --preset and --batch.
    """
    from tpu_tools.pjrt.runtime import import_jax
    from tpu_tools.profile.hlo import analyse, write_hlo_files
    from tpu_tools.profile.session import choose_output_dir, make_output_dir
    from tpu_tools.profile.workloads import WORKLOADS, builtin_workload, workload_config
    from tpu_tools.userfn.roofline import chip_by_name
    from tpu_tools.userfn.specs import abstract_arguments, parse_arg_spec
    from tpu_tools.userfn.target import check_target, resolve_target

    builtin = ":" not in target and target in WORKLOADS
    if builtin and arg_specs:
        raise UsageError(f"--arg is for MODULE:FUNCTION targets; the {target} workload knows its arguments "
                         "(size it with --preset and --batch)")
    if not builtin and (preset or batch):
        raise UsageError("--preset and --batch size the built-in train and infer workloads only")
    specs = [parse_arg_spec(text) for text in arg_specs]
    if chip:
        chip_by_name(chip)
    # What can be judged without jax is, before its backend starts (seconds on an accelerator).
    if builtin:
        workload_config(target, preset or "tiny")
    else:
        check_target(target)
    folder = choose_output_dir(out_dir, force, prefix="tpu-profile-hlo")
    import_jax(policy)
    if builtin:
        workload = builtin_workload(target, preset or "tiny", batch)
        analysis = analyse(workload.target, workload.function, workload.arguments, chip)
        analysis.model_flops = workload.model_flops
    else:
        analysis = analyse(target, resolve_target(target), abstract_arguments(specs), chip)
    write_hlo_files(analysis, make_output_dir(folder).path)
    if out.is_json:
        out.json(analysis.report())
    else:
        from tpu_tools.render.hlo_view import hlo_text

        out.text(hlo_text(analysis.report()))
    return EXIT_OK


# --- capture ---------------------------------------------------------------------------------------

@click.command(name="capture", cls=ToolCommand, json_schema="tpu-tools/profile/v1")
@click.option("--addr", "address", required=True, metavar="HOST:PORT",
              help="Where the program's profiler server listens (jax.profiler.start_server(PORT)).")
@click.option("--duration", "duration_s", type=Seconds(maximum=MAX_CAPTURE_S), default=2.0, show_default=True,
              metavar="SECONDS", help="How long to trace (at most an hour).")
@click.option("--no-python-trace", is_flag=True, help="Leave Python frames out of the trace.")
@_out_options("tpu-profile-capture-YYYYmmdd-HHMMSS in the current folder")
@_top_option
@output_options
@common_options
def capture_command(address: str, duration_s: float, no_python_trace: bool, out_dir: Path | None, force: bool,
                    top: int, out: Output) -> int:
    """Capture a trace from a running JAX program's profiler server, then report on it.

    Needs the profiler client package xprof (pip install xprof); the program calls jax.profiler.start_server(PORT).
    """
    from tpu_tools.pjrt.runtime import apply
    from tpu_tools.profile.capture import capture, load_client, parse_address, write_perfetto_json
    from tpu_tools.profile.session import choose_output_dir, make_output_dir, summarise_capture, write_report

    where = parse_address(address)
    load_client()
    apply(RuntimePolicy(platform="cpu"))
    folder = choose_output_dir(out_dir, force, prefix="tpu-profile-capture")
    existed = folder.path.exists()
    make_output_dir(folder)
    try:
        run_dir = capture(where, duration_s, folder.trace_dir, python_trace=not no_python_trace)
    except ToolError:
        if not existed:  # leave nothing behind that would block the same --out next time
            shutil.rmtree(folder.path, ignore_errors=True)
        raise
    write_perfetto_json(run_dir)
    document = summarise_capture(folder, where.text, duration_s, top)
    from tpu_tools.render.profile_view import report_text

    write_report(report_text(document), folder)
    if out.is_json:
        out.json(document)
    else:
        _render(document, out)
    for line in _where_lines(document, folder.path):
        note(line)
    return EXIT_OK


def main() -> None:
    run_cli(profile_group)
