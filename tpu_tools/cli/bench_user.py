"""`tpu-bench fn` and `tpu-bench program`: the user's own function or program, measured and gated as the
built-in benchmarks are."""

from __future__ import annotations

import click

from tpu_tools.cli.bench_options import RunArgs, run_options
from tpu_tools.cli.bench_run import execute
from tpu_tools.cli.common import ToolCommand


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
