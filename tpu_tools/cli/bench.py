"""`tpu-bench`: accelerator benchmarks that CI can gate on.

`tpu-bench` runs a suite; `tpu-bench <benchmark>` runs one benchmark with its
own options; `tpu-bench compare BASELINE CURRENT` compares two result files.
Options given before a benchmark's name apply to it as if given after it.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from click.core import ParameterSource

from tpu_tools.bench.names import BENCHMARKS, USER_BENCHMARKS
from tpu_tools.cli.bench_options import (
    RunArgs,
    allow_missing_option,
    batch_size_list,
    byte_sizes,
    cache_option,
    force_option,
    matmul_dtypes,
    matrix_sizes,
    model_choices,
    model_options,
    names_from,
    output_file,
    price_option,
    run_options,
    tolerance_value,
)
from tpu_tools.cli.bench_run import check_outputs, execute, gate, json_text, render_comparison, write_file
from tpu_tools.cli.common import ToolCommand, ToolGroup, common_options, run_cli
from tpu_tools.cli.output import FORMAT_CHOICES, Output, resolve_format
from tpu_tools.cli.params import Count, PathParam
from tpu_tools.errors import EXIT_OK, UsageError

BENCH_SCHEMA = "tpu-tools/bench/v1"  # bench.records.SCHEMA, named here without importing the benchmarks' records

SUBCOMMANDS = {name: f"tpu_tools.cli.bench:{name}_command" for name in (*BENCHMARKS, "compare")}
SUBCOMMANDS.update({name: f"tpu_tools.cli.bench_user:{name}_command" for name in USER_BENCHMARKS})

MAN_SECTIONS = {
    "DESCRIPTION": (
        "Without a benchmark name, runs a suite: --suite quick (the default; under two minutes on a 2-core "
        "CPU host) or --suite full. With a name, runs that benchmark with its own options; sizes not given "
        "come from the suite's choice for the platform (accelerators get larger problems than CPUs).\n"
        "Measurement: inputs are random (never zeros); compilation is timed on its own and excluded from the "
        "samples; --warmup untimed calls come first. Throughput figures (matmul, memory, train, infer "
        "throughput) time calls back to back: each sample issues k calls, each taking the previous call's "
        "output, and waits once at the end; k is calibrated so that a sample lasts at least a tenth of "
        "--min-time (2 to 50 ms), so the host's launch-and-wait round trip is noise; the figure is the sample's time "
        "over k. Latency figures "
        "(dispatch latency_us, infer latency_ms, transfers) wait for every call. Samples are taken in 3 "
        "bursts, apart in time, until --min-time seconds of samples (and at least 3) are collected. "
        "The table shows each case's headline figure as MEDIAN, SPREAD (half the interquartile range, relative "
        "to the median) and N (samples); the quartiles span at least the bursts' medians, so the spread "
        "shows the variation between runs. A case is flagged noisy (a warning, and a note beside its changes "
        "in a comparison) when its bursts differ by more than 5%, or, on the CPU platform, when other "
        "processes took more than 10% of the host's CPU while it ran, or, on an NVIDIA GPU, when heat or a "
        "power brake held its clocks back; values.interference records their CPU share, the load average, "
        "steal time, CPU frequency and the GPU's clocks, temperature, power and clock event reasons (NVML) at "
        "the end of the case. FLOPs are counted analytically and cross-checked with XLA's cost analysis: a "
        "difference over 10% is a warning where both counts exist; a count XLA does not have "
        "(-1) or one that leaves out library calls (cuBLAS, cuDNN) is not compared, and the notes say so.\n"
        "train uses every local device (data parallel; --host-devices N gives the CPU platform N devices); the "
        "other benchmarks use the first device. The compile benchmark runs first, in child processes, before "
        "this process opens the device: a TPU belongs to one process at a time.\n"
        "A case that cannot run is a result, and the suite goes on: a dtype the platform lacks is reported "
        "as \"unsupported on <platform>\", a size that does not fit as \"out of memory\" (sizes beyond free "
        "memory are refused before anything is allocated). Ctrl-C stops the run, writes the results so far "
        "with a note, and exits 130 (SIGTERM: the same, exit 143). --json and --junit files are written whole "
        "(temporary file and rename), never over an existing file without --force, never through a link.\n"
        "% of peak uses the per-chip dense peaks of known TPUs and NVIDIA GPUs (bf16/f16, TF32, FP32, FP8, "
        "int8, memory bandwidth), divided by the devices per chip; an f32 matmul takes the peak of what it "
        "runs as at its --precision (values.arithmetic: tf32 on NVIDIA at default, bf16 passes on a TPU); none "
        "is shown for CPUs or unknown devices."
    ),
    "BENCHMARKS": (
        "compile   compile time of the reference train step, cold and warm from jax's persistent compilation "
        "cache, each in a fresh process; the cache hit is verified.\n"
        "dispatch  latency of launching a tiny compiled computation, and of an eager jax.numpy op (us).\n"
        "matmul    GEMM throughput per size and dtype (f32, bf16, f16, int8; also fp8, int4), TFLOP/s or "
        "TOP/s, % of peak.\n"
        "memory    on-device bandwidth: copy, scale, add, triad (STREAM); bytes read plus written; GB/s.\n"
        "transfer  host-to-device and device-to-host bandwidth over sizes (GB/s), from pageable numpy memory and "
        "from the device's pinned_host memory space.\n"
        "train     a transformer training step (embedding, attention, MLP, loss, gradients, AdamW), data "
        "parallel over all local devices: samples/s, tokens/s, step p50/p90/p99, compile time, model FLOPs "
        "per step, MFU, cost per 1M samples with --price-per-hour.\n"
        "infer     the same model's forward pass at batch sizes 1..N on one device: latency p50/p99, "
        "throughput.\n"
        "fn        your own function, MODULE:FUNCTION with --arg specs (those of tpu-profile hlo): random inputs "
        "of those shapes on the first device, compiled once, timed back to back as matmul is; FLOP/s and "
        "bytes/s from XLA's cost analysis over the measured time, % of the compute peak (of the inputs' dtype) "
        "and of the memory bandwidth, and where the call sits on the roofline: the best case (the larger of its "
        "FLOPs at the peak and its bytes at the bandwidth) over the time it took (values.percent_of_roofline), "
        "the bound XLA's counts predict (roofline_bound) and the ceiling the measured rates are nearer "
        "(measured_bound). Never part of a suite.\n"
        "program   your own program (-- script.py ARGS, or -- -m module ARGS) run under the agent "
        "(python -m tpu_tools.agent) for --duration (30 s; then SIGINT, SIGTERM 10 s later, SIGKILL 10 s after "
        "that), or until it ends, before this process opens the device. The agent is asked for its figures every "
        "--sample-interval: its steps/s (over its last 10 s) and median step time are the samples, the first half "
        "of them the warm-up; values hold the agent's last figures: steps, agent_steps_per_s, step_time_p50_ms, "
        "step_time_p99_ms, mfu_percent, goodput_percent (since the start), compile_count, recompile_count, "
        "compile_time_s, run_s, ended, exit_code. Steps are those the program marks (tpu_tools.agent.step()). A "
        "program that exits with a failure is a failed case with the last line of its output, and so is one whose "
        "agent has not answered within --timeout. --suite, --min-time, --warmup and --seed do not apply. Never part "
        "of a suite."
    ),
    "BASELINES AND CI": (
        "--baseline FILE compares this run with an earlier --json result: a table of every figure with its "
        "change, and exit status 3 when any figure regressed beyond --tolerance (default 5%). The spread "
        "counts: a rate regresses when the current p75 is below the baseline p25 less the tolerance, a time "
        "when the current p25 is above the baseline p75 plus the tolerance. Figures with fewer than 3 samples "
        "are shown but not gated. A case that ran in the baseline and fails now is a regression. A case the "
        "baseline measured that was not run now, or a comparison that judged no figure at all (an empty "
        "result), fails the gate too (exit 3) unless --allow-missing.\n"
        "A baseline from another platform or device kind is refused (exit 2) unless --allow-mismatch; a "
        "different device count, host, CPU, version, flag or --min-time is printed as a warning.\n"
        "tpu-bench compare BASELINE CURRENT does the same for two files.\n"
        "--junit FILE writes JUnit XML: one testcase per benchmark case; unsupported, out-of-memory and "
        "interrupted cases are skipped, failed cases are errors, regressions are failures."
    ),
    "JSON OUTPUT": (
        "--json FILE writes one document (--json - or --format json prints it), schema "
        "\"tpu-tools/bench/v1\":\n"
        "schema, time (UTC, ISO 8601), suite, interrupted, settings {min_time_s, warmup, min_samples, seed, "
        "sample_time_s, repeats, timeout_s, benchmarks[]}, environment {host, os, python, cpu_model, cpu_count, "
        "versions {tpu_tools, jax, jaxlib, plugins}, cpus_usable, variables {XLA_FLAGS, JAX_PLATFORMS, ...}, command}, "
        "device {platform, "
        "platform_version, kind, count, process_count, chip, devices_per_chip, memory_bytes, "
        "peak_ops_per_s_per_device {f32 (at the default precision), bf16, f16, int8, fp8}, f32_matmul {default, "
        "high, highest: {arithmetic, peak_ops_per_s}}, peak_memory_bandwidth_bytes_per_s_per_device}, "
        "notes[], comparison (null, or {tolerance_percent, regression_count, warnings[], baseline_only[], "
        "missing[], judged_count, allow_missing, "
        "changes[] {case_id, figure, baseline_median, current_median, change_percent, verdict, note}}).\n"
        "results[]: {id, benchmark, name, params, status (ok, unsupported, out_of_memory, failed, "
        "interrupted, not_run), message, primary, stats, values, warnings[], duration_s}. stats maps a "
        "figure named with its unit (time_us, latency_us, back_to_back_us, latency_ms, time_per_call_ms, "
        "step_time_ms, throughput_tflops, "
        "throughput_tops, bandwidth_gbps, samples_per_s, tokens_per_s, cold_compile_ms, warm_compile_ms) to "
        "{median, p25, p75, p90, p99, min, max, mean, stdev, count, higher_is_better}. values holds single "
        "figures: timing (back_to_back or per_call), calls_per_sample, sample_ms, repeats, repeat_spread_percent, "
        "noisy, interference {other_processes_cpu_percent, steal_percent, load_average_1m, cpu_mhz, cpus, gpu "
        "{index, name, sm_clock_mhz, sm_clock_max_mhz, temperature_celsius, power_draw_watts, power_limit_watts, "
        "clock_event_reasons} on an NVIDIA GPU}, "
        "precision, arithmetic, path (transfers), xla_cost_excludes, "
        "compile_ms, flops_per_call, xla_flops_per_call, peak_ops_per_s, percent_of_peak, "
        "bytes_per_call, xla_bytes_per_call, peak_bandwidth_gbps, model_flops_per_step, xla_flops_per_step, "
        "model_flops_per_call, achieved_tflops, mfu_percent, parameters, global_batch, devices, "
        "price_per_hour, cost_per_1m_samples, final_loss, speedup, cache_hit_verified, "
        "cache_entries_written, peak_dtype, percent_of_peak_bandwidth, arithmetic_intensity_flops_per_byte, "
        "roofline_bound, measured_bound, roofline_best_case_us, percent_of_roofline (fn), steps, agent_steps_per_s, "
        "step_time_p50_ms, step_time_p99_ms, goodput_percent, compile_count, recompile_count, compile_time_s, run_s, "
        "ended, exit_code, agent_reads, warmup_reads (program) (each where it applies; null where unknown). "
        "program's stats are steps_per_s and step_time_ms, its timing \"agent\"."
    ),
    "EXAMPLES": (
        "tpu-bench\n"
        "tpu-bench --suite full --json result.json --junit junit.xml\n"
        "tpu-bench --json new.json --baseline main.json --tolerance 5%\n"
        "tpu-bench matmul --size 8192 --dtype bf16,int8\n"
        "tpu-bench memory --size 1G --op copy,triad\n"
        "tpu-bench train --preset small --price-per-hour 4.20 --host-devices 8\n"
        "tpu-bench infer --preset base --max-batch 64\n"
        "tpu-bench fn mymodel:attention --arg bf16[8,1024,64] --arg bf16[8,1024,64] --arg bf16[8,1024,64]\n"
        "tpu-bench program --duration 60 --baseline main.json -- train.py --config small.yaml\n"
        "tpu-bench compare main.json new.json"
    ),
}


# --- the commands -------------------------------------------------------------------------------------

@click.group(name="bench", cls=ToolGroup, lazy_commands=SUBCOMMANDS, man_sections=MAN_SECTIONS,
             json_schema=BENCH_SCHEMA,
             invoke_without_command=True, subcommand_metavar="[COMMAND] [ARGS]...")  # the same in every click
@price_option
@cache_option
@run_options
def bench_command(price_per_hour: float | None, cache_dir: str | None, args: RunArgs) -> int:
    """Benchmark the accelerator: GEMM, memory, transfers, dispatch, compile, training, inference."""
    ctx = click.get_current_context()
    if ctx.invoked_subcommand is not None:
        _pass_down(ctx)
        return EXIT_OK
    from tpu_tools.bench.suites import suite_selections

    shared: dict[str, dict[str, Any]] = {"train": {"price_per_hour": price_per_hour},
                                         "infer": {"price_per_hour": price_per_hour},
                                         "compile": {"cache_root": cache_dir}}
    return execute(suite_selections(args.suite, shared), args)


def _pass_down(ctx: click.Context) -> None:
    """Options given before the benchmark name become that benchmark's defaults."""
    explicit = {name: value for name, value in ctx.params.items()
                if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    subcommand = ctx.invoked_subcommand or ""
    command = ctx.command.get_command(ctx, subcommand) if isinstance(ctx.command, click.Group) else None
    accepted = {param.name for param in command.params} if command is not None else set()
    for name in explicit:
        if name not in accepted:
            raise UsageError(f"--{name.replace('_', '-')} does not apply to `tpu-bench {ctx.invoked_subcommand}`")
    ctx.default_map = {subcommand: explicit}


def _single(benchmark: str, args: RunArgs, overrides: dict[str, Any]) -> int:
    from tpu_tools.bench.suites import selection

    return execute([selection(benchmark, args.suite, overrides)], args)


@click.command(name="matmul", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@click.option("--size", "sizes", multiple=True, metavar="N|MxKxN", callback=matrix_sizes,
              help="Matrix size, square N or MxKxN (repeatable, or a comma list).")
@click.option("--dtype", "dtypes", multiple=True, metavar="DTYPE", callback=matmul_dtypes,
              help="f32, bf16, f16, int8, fp8, int4 (repeatable, or a comma list; default f32,bf16,f16,int8).")
@click.option("--precision", "precisions", multiple=True, metavar="PRECISION",
              callback=names_from(("default", "high", "highest"), "precision"),
              help="JAX matmul precision: default, high, highest (repeatable, or a comma list; default: "
                   "default). On NVIDIA f32 runs as TF32 at default and high, true FP32 at highest.")
@run_options
def matmul_command(sizes: tuple | None, dtypes: tuple[str, ...] | None, precisions: tuple[str, ...] | None,
                   args: RunArgs) -> int:
    """GEMM throughput over sizes, dtypes and precisions (TFLOP/s, TOP/s) and % of peak."""
    return _single("matmul", args, {"shapes": sizes, "dtypes": dtypes, "precisions": precisions})


@click.command(name="memory", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@click.option("--size", "sizes", multiple=True, metavar="BYTES", callback=byte_sizes,
              help="Bytes per array, with K, M, G suffixes (repeatable, or a comma list).")
@click.option("--op", "operations", multiple=True, metavar="OP",
              callback=names_from(("copy", "scale", "add", "triad"), "operation"),
              help="copy, scale, add, triad (repeatable, or a comma list; default all).")
@run_options
def memory_command(sizes: tuple[int, ...] | None, operations: tuple[str, ...] | None, args: RunArgs) -> int:
    """On-device memory bandwidth: copy, scale, add, triad (GB/s, % of peak)."""
    return _single("memory", args, {"sizes": sizes, "operations": operations})


@click.command(name="transfer", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@click.option("--size", "sizes", multiple=True, metavar="BYTES", callback=byte_sizes,
              help="Bytes per transfer, with K, M, G suffixes (repeatable, or a comma list).")
@click.option("--direction", "directions", multiple=True, metavar="DIR",
              callback=names_from(("h2d", "d2h", "h2d-pinned", "d2h-pinned"), "direction"),
              help="h2d, d2h (pageable numpy memory), h2d-pinned, d2h-pinned (the device's pinned_host memory "
                   "space) (repeatable, or a comma list; default all).")
@run_options
def transfer_command(sizes: tuple[int, ...] | None, directions: tuple[str, ...] | None, args: RunArgs) -> int:
    """Host-to-device and device-to-host bandwidth over sizes (GB/s)."""
    return _single("transfer", args, {"sizes": sizes, "directions": directions})


@click.command(name="dispatch", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@click.option("--mode", "modes", multiple=True, metavar="MODE", callback=names_from(("compiled", "eager"), "mode"),
              help="compiled, eager (repeatable, or a comma list; default both).")
@run_options
def dispatch_command(modes: tuple[str, ...] | None, args: RunArgs) -> int:
    """Latency of launching a tiny compiled computation and an eager op (us)."""
    return _single("dispatch", args, {"modes": modes})


@click.command(name="compile", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@model_options(many_presets=False)
@click.option("--repeat", "repeats", type=Count(1, 1000), default=None, metavar="N",
              help="Cold and warm compiles to time (each in its own processes; default 1 quick, 3 full).")
@cache_option
@run_options
def compile_command(preset: str | None, repeats: int | None, cache_dir: str | None, args: RunArgs,
                    **sizes: Any) -> int:
    """Compile time of the train step, cold and warm from the persistent cache."""
    choices = model_choices((preset,) if preset else (), sizes)
    return _single("compile", args, {"model": choices[0] if choices else None, "repeats": repeats,
                                     "cache_root": cache_dir})


@click.command(name="train", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@model_options(many_presets=True)
@price_option
@run_options
def train_command(presets: tuple[str, ...], price_per_hour: float | None, args: RunArgs, **sizes: Any) -> int:
    """Transformer training step, data parallel: samples/s, tokens/s, MFU, cost."""
    return _single("train", args, {"models": model_choices(presets, sizes), "price_per_hour": price_per_hour})


@click.command(name="infer", cls=ToolCommand, json_schema=BENCH_SCHEMA)
@model_options(many_presets=False)
@click.option("--max-batch", type=Count(1, 1 << 20), default=None, metavar="N",
              help="Batch sizes 1, 2, 4, ... up to N (default 8 quick, 32 full on CPU).")
@click.option("--batch-sizes", multiple=True, metavar="LIST", callback=batch_size_list,
              help="Exact batch sizes instead (repeatable, or a comma list).")
@price_option
@run_options
def infer_command(preset: str | None, max_batch: int | None, batch_sizes: tuple[int, ...] | None,
                  price_per_hour: float | None, args: RunArgs, **sizes: Any) -> int:
    """Forward pass at batch sizes 1..N: latency p50/p99 and throughput."""
    from tpu_tools.bench.infer import MAX_BATCH, batch_sizes_up_to

    if max_batch is not None and batch_sizes:
        raise UsageError("give --max-batch or --batch-sizes, not both")
    if max_batch is not None and max_batch > MAX_BATCH:
        raise UsageError(f"--max-batch {max_batch} is absurdly large (at most {MAX_BATCH})")
    choices = model_choices((preset,) if preset else (), sizes)
    return _single("infer", args, {"model": choices[0] if choices else None, "price_per_hour": price_per_hour,
                                   "batch_sizes": batch_sizes or (batch_sizes_up_to(max_batch) if max_batch
                                                                  else None)})


@click.command(name="compare", cls=ToolCommand, json_schema="tpu-tools/bench-compare/v1")
@click.argument("baseline_file", type=PathParam(path_type=str), metavar="BASELINE.json")
@click.argument("current_file", type=PathParam(path_type=str), metavar="CURRENT.json")
@click.option("--tolerance", default="5%", show_default=True, metavar="PERCENT", callback=tolerance_value,
              help="How much worse than the baseline a figure may be, beyond its spread.")
@click.option("--allow-mismatch", is_flag=True,
              help="Compare results from different platforms or device kinds anyway.")
@click.option("--json", "json_path", type=PathParam(path_type=str), metavar="FILE", callback=output_file,
              help="Write the comparison as JSON to FILE; - prints it.")
@click.option("--junit", "junit_path", type=PathParam(path_type=str), metavar="FILE", callback=output_file,
              help="Write JUnit XML for CURRENT with failures for regressions.")
@click.option("--format", "output_format", type=click.Choice(FORMAT_CHOICES), default="auto", show_default=True,
              help="auto: a table on a terminal, plain text in a pipe; json: the comparison on stdout.")
@allow_missing_option
@force_option
@common_options
def compare_command(baseline_file: str, current_file: str, tolerance: float, allow_mismatch: bool,
                    json_path: str | None, junit_path: str | None, output_format: str, force: bool,
                    allow_missing: bool) -> int:
    """Compare two --json results: every figure's change; exit 3 on a regression."""
    from tpu_tools.bench.compare import compare, load_result
    from tpu_tools.bench.records import RunResult

    baseline = load_result(baseline_file, "baseline")
    current = load_result(current_file, "current")
    check_outputs(json_path, junit_path, force)
    comparison = compare(baseline, current, tolerance, allow_mismatch, allow_missing)
    document = {"schema": "tpu-tools/bench-compare/v1", "baseline": baseline_file, "current": current_file,
                **comparison.to_dict()}
    out = Output(resolve_format(output_format, json_path == "-", sys.stdout))
    if json_path and json_path != "-":
        write_file(json_path, json_text(document), force, "--json")
    if junit_path:
        from tpu_tools.bench.junit import junit_xml

        write_file(junit_path, junit_xml(RunResult.from_dict(current), comparison), force, "--junit")
    if out.is_json:
        out.json(document)
    else:
        render_comparison(comparison, out)
    return gate(comparison)


def main() -> None:
    run_cli(bench_command)
