"""`tpu-bench fn` and `tpu-bench program`: the user's own function or program, measured and gated as the
built-in benchmarks are."""

from __future__ import annotations

import click

from tpu_tools.cli.bench_options import RunArgs, run_options
from tpu_tools.cli.bench_run import execute
from tpu_tools.cli.common import ToolCommand
from tpu_tools.cli.params import Duration
from tpu_tools.errors import UsageError


@click.command(name="fn", cls=ToolCommand)
@click.argument("target", metavar="MODULE:FUNCTION")
@click.option("--arg", "arg_specs", multiple=True, metavar="SPEC",
              help="One argument's dtype and shape, e.g. f32[128,512], bf16[8], i32[] (repeatable, in order; "
                   "the specs tpu-profile hlo takes). The inputs are random arrays of these shapes.")
@run_options
def fn_command(target: str, arg_specs: tuple[str, ...], args: RunArgs) -> int:
    """Time your own function: compiled once, calls back to back; FLOP/s, bytes/s, % of peak, roofline."""
    from tpu_tools.bench.fn import FnOptions, plan
    from tpu_tools.bench.runner import Selection
    from tpu_tools.userfn.specs import parse_arg_spec
    from tpu_tools.userfn.target import check_target

    options = FnOptions(target, tuple(parse_arg_spec(text) for text in arg_specs))
    check_target(target)  # a typo is told before the runtime starts
    return execute([Selection("fn", lambda platform: plan(options))], args)


MAX_DURATION_S = 7 * 24 * 3600.0


@click.command(name="program", cls=ToolCommand,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--duration", "duration_s", type=Duration(minimum=0.1, maximum=MAX_DURATION_S), default="30s",
              show_default=True, metavar="SECONDS",
              help="Run the program this long (it is then stopped: SIGINT, then SIGTERM), or until it ends.")
@click.option("--sample-interval", "sample_interval_s", type=Duration(minimum=0.05, maximum=3600.0), default="1s",
              show_default=True, metavar="SECONDS", help="How often the agent is asked for its figures.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True, metavar="[--] PROGRAM [ARGS]...")
@run_options
def program_command(duration_s: float, sample_interval_s: float, command: tuple[str, ...], args: RunArgs) -> int:
    """Run your program under the agent for a bounded time: its steps/s, step time, MFU, compile time."""
    from tpu_tools.bench.program import ProgramOptions, plan
    from tpu_tools.bench.runner import Selection

    words = command[1:] if command[:1] == ("--",) else command
    _refuse_sampling_options()
    _check_program(words)
    options = ProgramOptions(tuple(words), duration_s, sample_interval_s)
    return execute([Selection("program", lambda platform: plan(options))], args)


def _refuse_sampling_options() -> None:
    """The program's length is --duration and its samples are the agent's: the timing loop's options would do
    nothing, so they are refused rather than ignored."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    for name in ("suite", "min_time_s", "warmup", "seed"):
        if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT,
                                              ParameterSource.DEFAULT_MAP):
            flag = "--" + name.removesuffix("_s").replace("_", "-")
            raise UsageError(f"{flag} does not apply to `tpu-bench program` (its length is --duration, its samples "
                             "the agent's figures)")


def _check_program(words: tuple[str, ...]) -> None:
    """A script that is not there is told before anything starts (a module is looked for by the program)."""
    import os

    if not words:
        raise UsageError("name the program to run: tpu-bench program -- train.py ARGS")
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError("-m needs a module name")
    elif not os.path.isfile(words[0]):
        raise UsageError(f"no such program file: {words[0]!r}")
