"""Option values of `tpu-bench`: parsing and checking sizes, names, files; the options every run takes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tpu_tools.cli.common import common_options, runtime_options
from tpu_tools.cli.output import FORMAT_CHOICES
from tpu_tools.cli.params import Count, Number, PathParam, Seconds
from tpu_tools.errors import UsageError
from tpu_tools.parsing import parse_number
from tpu_tools.pjrt.runtime import RuntimePolicy
from tpu_tools.shorten import quoted
from tpu_tools.workloads.transformer import COMPUTE_DTYPES, PRESETS

DEFAULT_BENCH_TIMEOUT_S = 600.0
MAX_BUFFER_BYTES = 1 << 50  # 1 PiB: larger is no buffer any device holds
MAX_MIN_TIME_S = 3600.0  # per case; an hour of samples is already far past any useful precision
MAX_WARMUP = 100_000
MAX_SEED = 2**32 - 1  # what jax.random.key takes on every platform
MAX_MODEL_DIMENSION = 1 << 24
MAX_PRICE_PER_HOUR = 1e6


def split_list(values: tuple[str, ...]) -> list[str]:
    """Repeated options and comma-separated lists, both: --dtype f32,bf16 --dtype int8. An empty value or item
    ('', 'f32,,bf16') is refused: it would silently mean the defaults."""
    parts = [part.strip() for value in values for part in value.split(",")]
    if any(not part for part in parts):
        raise click.BadParameter("an empty value; give one or more names, separated by commas")
    return parts


def matrix_sizes(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple | None:
    from tpu_tools.bench.matmul import parse_shape

    try:
        return tuple(parse_shape(text) for text in split_list(values)) or None
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def byte_sizes(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...] | None:
    from tpu_tools.parsing import parse_size

    sizes = []
    for text in split_list(values):
        try:
            size = parse_size(text)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
        if size < 1:
            raise click.BadParameter(f"size {text!r} must be at least 1 byte")
        if size > MAX_BUFFER_BYTES:
            raise click.BadParameter(f"size {text!r} is absurdly large (at most 1P)")
        sizes.append(size)
    return tuple(sizes) or None


def names_from(allowed: tuple[str, ...], what: str) -> Callable:
    def check(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...] | None:
        names = split_list(values)
        for name in names:
            if name not in allowed:
                raise click.BadParameter(f"unknown {what} {name!r}: choose from {', '.join(allowed)}")
        return tuple(dict.fromkeys(names)) or None

    return check


def matmul_dtypes(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...] | None:
    from tpu_tools.bench.matmul import DTYPES, dtype_named

    names = []
    for text in split_list(values):
        try:
            names.append(dtype_named(text).name)
        except KeyError:
            raise click.BadParameter(f"unknown dtype {text!r}: choose from {', '.join(DTYPES)}") from None
    return tuple(dict.fromkeys(names)) or None


def batch_size_list(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...] | None:
    from tpu_tools.bench.infer import MAX_BATCH

    sizes = []
    for text in split_list(values):
        try:
            size = parse_number(text, "batch size", integer=True)
        except ValueError:
            raise click.BadParameter(f"{quoted(text, 40)} is not a batch size (a whole number)") from None
        if size < 1:
            raise click.BadParameter(f"batch size {size} must be at least 1")
        if size > MAX_BATCH:
            raise click.BadParameter(f"batch size {size} is absurdly large (at most {MAX_BATCH})")
        sizes.append(size)
    return tuple(sorted(set(sizes))) or None


def tolerance_value(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from tpu_tools.bench.compare import parse_tolerance

    try:
        return parse_tolerance(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a file that cannot be written now, rather than after the benchmarks ran."""
    if value is None or value == "-":
        return value
    path = Path(value)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory")
    if not folder.is_dir():
        raise click.BadParameter(f"cannot write {value}: the directory {folder} does not exist")
    return value


force_option = click.option("--force", is_flag=True, help="Replace --json and --junit files that exist.")
allow_missing_option = click.option(
    "--allow-missing", is_flag=True,
    help="Let the gate pass when baseline cases were not measured (by default they fail it, exit 3).")


# --- options every run takes ------------------------------------------------------------------------

@dataclass(frozen=True)
class RunArgs:
    suite: str
    min_time_s: float | None
    warmup: int
    seed: int
    json_path: str | None
    junit_path: str | None
    baseline_path: str | None
    tolerance: float
    allow_mismatch: bool
    output_format: str
    policy: RuntimePolicy
    timeout_s: float
    force: bool = False
    allow_missing: bool = False


def run_options(function: Callable) -> Callable:
    """The options of every run (suite or single benchmark), collected into `args: RunArgs`."""

    @functools.wraps(function)
    def wrapper(*pos: Any, suite: str, min_time_s: float | None, warmup: int, seed: int, json_path: str | None,
                junit_path: str | None, baseline_path: str | None, tolerance: float, allow_mismatch: bool,
                output_format: str, policy: RuntimePolicy, timeout_s: float, force: bool, allow_missing: bool,
                **kwargs: Any) -> Any:
        args = RunArgs(suite, min_time_s, warmup, seed, json_path, junit_path, baseline_path, tolerance,
                       allow_mismatch, output_format, policy, timeout_s, force, allow_missing)
        return function(*pos, args=args, **kwargs)

    options = [
        click.option("--suite", type=click.Choice(("quick", "full")), default="quick", show_default=True,
                     help="quick: under 2 minutes on a small CPU host; full: larger sizes. For a single "
                          "benchmark: whose default sizes to use."),
        click.option("--min-time", "min_time_s", type=Seconds(maximum=MAX_MIN_TIME_S), default=None,
                     metavar="SECONDS",
                     help="Time budget of the timed samples per case (default: 0.5 quick, 2 full)."),
        click.option("--warmup", type=Count(0, MAX_WARMUP), default=3, show_default=True, metavar="N",
                     help="Untimed calls before the samples."),
        click.option("--seed", type=Count(0, MAX_SEED), default=0, show_default=True,
                     help="Seed of the random inputs (0 to 2^32-1)."),
        click.option("--json", "json_path", type=PathParam(path_type=str), metavar="FILE", callback=output_file,
                     help="Write the results as JSON (tpu-tools/bench/v1) to FILE; - prints them."),
        click.option("--junit", "junit_path", type=PathParam(path_type=str), metavar="FILE", callback=output_file,
                     help="Write JUnit XML to FILE: a testcase per case, failures for regressions."),
        force_option,
        click.option("--baseline", "baseline_path", type=PathParam(path_type=str), metavar="FILE",
                     help="Compare with an earlier --json result; exit 3 on a regression."),
        click.option("--tolerance", default="5%", show_default=True, metavar="PERCENT", callback=tolerance_value,
                     help="How much worse than the baseline a figure may be, beyond its spread."),
        click.option("--allow-mismatch", is_flag=True,
                     help="Compare with a baseline from another platform or device kind anyway."),
        allow_missing_option,
        click.option("--format", "output_format", type=click.Choice(FORMAT_CHOICES), default="auto",
                     show_default=True, help="auto: a table on a terminal, plain text in a pipe; json: the "
                                             "document on stdout."),
    ]
    decorated = runtime_options(default_timeout_s=DEFAULT_BENCH_TIMEOUT_S)(common_options(wrapper))
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def model_options(many_presets: bool = False) -> Callable[[Callable], Callable]:
    """--preset (repeatable for train) and the sizes that change it, for train, infer and compile."""
    sizes = [("--layers", "n_layers", "Transformer blocks."), ("--d-model", "d_model", "Model width."),
             ("--heads", "n_heads", "Attention heads (must divide --d-model)."),
             ("--d-ff", "d_ff", "MLP hidden width."), ("--seq-len", "seq_len", "Tokens per sample."),
             ("--vocab", "vocab_size", "Vocabulary size."),
             ("--batch-per-device", "batch_per_device", "Samples per device per step.")]
    options = [click.option("--preset", "presets" if many_presets else "preset", type=click.Choice(tuple(PRESETS)),
                            multiple=many_presets, default=None,
                            help="Model size (tiny, small, base); other options below change it"
                                 + (" (repeatable)." if many_presets else "."))]
    dimension = Number(above=0, maximum=MAX_MODEL_DIMENSION, integer=True)  # model.py has the tighter limits
    options += [click.option(flag, name, type=dimension, default=None, metavar="N", help=text)
                for flag, name, text in sizes]
    options.append(click.option("--model-dtype", "model_dtype", type=click.Choice(COMPUTE_DTYPES), default=None,
                                help="Compute dtype (parameters and optimizer state stay float32)."))

    def decorate(function: Callable) -> Callable:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def model_choices(presets: tuple[str, ...], sizes: dict[str, Any]) -> tuple | None:
    """None when nothing was given (the suite decides), else one validated ModelChoice per preset."""
    from tpu_tools.bench.model import ModelChoice

    overrides = {("dtype" if k == "model_dtype" else k): v for k, v in sizes.items() if v is not None}
    if not presets and not overrides:
        return None
    choices = tuple(ModelChoice(preset, overrides) for preset in (presets or ("tiny",)))
    for choice in choices:
        try:
            choice.config()
        except ValueError as error:
            raise UsageError(str(error)) from None
    return choices


price_option = click.option("--price-per-hour", type=Number(minimum=0.0, maximum=MAX_PRICE_PER_HOUR), default=None,
                             metavar="PRICE",
                             help="What the machine costs per hour; adds the cost of 1M samples.")
cache_option = click.option("--cache-dir", type=PathParam(path_type=str, file_okay=False, readable=True), default=None,
                             help="Root of the compile benchmark's cache directories "
                                  "(default ~/.cache/tpu-tools/bench-compile-cache).")
