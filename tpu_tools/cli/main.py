"""The `tpu-tools` command group; each subcommand is also its own console script."""

from __future__ import annotations

import click

from tpu_tools.cli.common import ToolGroup, common_options, run_cli
from tpu_tools.environment import man_section

# Subcommand name -> "module:command object". The console scripts (tpu-ls, ...)
# run these same objects; the group imports a module only when it is used.
COMMANDS = {
    "ls": "tpu_tools.cli.ls:ls_command",
    "monitor": "tpu_tools.cli.monitor:monitor_command",
    "top": "tpu_tools.cli.top:top_command",
    "bench": "tpu_tools.cli.bench:bench_command",
    "profile": "tpu_tools.cli.profile:profile_group",
    "collectives-test": "tpu_tools.cli.collectives:collectives_command",
    "dump": "tpu_tools.cli.dump:dump_command",
    "diag": "tpu_tools.cli.diag:diag_command",
}

MAN_SECTIONS = {
    "EXIT STATUS": (
        "0  success.\n"
        "1  runtime failure: no device, the runtime failed, hung or crashed, a probe or test failed.\n"
        "2  usage error: a bad option value (also NaN, infinite or absurd numbers), an unknown platform, a bad "
        "JAX_PLATFORMS, an XLA flag XLA does not know, an output file that exists without --force.\n"
        "3  a gate failed: a benchmark regression, a collective below its bandwidth floor, wrong values; tpu-diag: "
        "warnings only (nondeterminism, a slow device, throttled clocks).\n"
        "130  interrupted (Ctrl-C); 143  terminated (SIGTERM, as sent by timeout, CI runners and Kubernetes). "
        "Both keep the partial results of long commands (bench --json, profile run, collectives-test --json); "
        "tpu-monitor ends with 0 after either.\n"
        "141  the reader of the output went away (a closed pipe, as in | head); nothing is printed."
    ),
    "ERRORS": (
        "Every error is one line on stderr, PROG: error: SENTENCE, where PROG is the program as invoked (tpu-monitor, "
        "or tpu-tools monitor); a usage error too, without click's Usage: and Try lines. --debug (or "
        "TPU_TOOLS_DEBUG=1) adds the traceback before it.\n"
        "A command asked for JSON on stdout (--json, --format json, or --json - where --json takes a file) writes one "
        "JSON document on every exit: when it fails before writing its own, the document is {\"schema\": the schema "
        "of the document it would have written, \"error\": the sentence of the stderr line, \"exit_code\": the exit "
        "status}, e.g. {\"schema\": \"tpu-tools/cache/v1\", \"error\": \"cache directory /x does not exist\", "
        "\"exit_code\": 1}. A usage error answers in JSON too once --json is on the command line; an interrupted or "
        "terminated command says \"interrupted\" or \"terminated\". A document with an error key is a failure's; "
        "a failed collectives run keeps its own keys, with status failed, error and exit_code."
    ),
    "ENVIRONMENT": man_section("tpu-tools"),
}


@click.group(cls=ToolGroup, name="tpu-tools", lazy_commands=COMMANDS, man_sections=MAN_SECTIONS, programs=True)
@common_options
def cli() -> None:
    """Runtime tools for accelerators driven through PJRT (TPU, GPU, CPU)."""


# The programs named from the table the group runs, so that a new one cannot be left out of the help.
cli.help = (f"{cli.help}\n\nEach subcommand is also installed as its own program: "
            f"{', '.join('tpu-' + name for name in COMMANDS)}.")


def main() -> None:
    run_cli(cli, prog_name="tpu-tools")
