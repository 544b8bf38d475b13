"""`tpu-top`: a live, full-screen view of the devices, the jobs running the agent, and the host."""

from __future__ import annotations

import re
import shutil
import sys

import click

from tpu_tools.cli.common import ToolCommand, common_options, metrics_options, run_cli
from tpu_tools.cli.monitor import Duration, Regex
from tpu_tools.errors import EXIT_OK, UsageError
from tpu_tools.sanitize import safe_text
from tpu_tools.top.model import DEFAULT_SORT, SORT_KEYS

MAN_SECTIONS = {
    "DESCRIPTION": (
        "A full-screen view refreshed every --interval: a header (host, platforms, time, refresh), the host "
        "(CPU and memory bars, load, swap), the devices (memory used / total with a bar, utilization where a "
        "source reports it, the processes holding each device), and the processes: every job running the "
        "tpu-tools agent and every process holding a device, with PID, user, tag, CPU %, RSS, device memory, "
        "compilations, recompilations and steps per second, sorted by device memory. The two lines under "
        "the processes describe the selected one: its step times (last, p50, p99), compile time, persistent "
        "cache hits and misses, and its last recompilation with JAX's reason (when the job was started with "
        "--explain-recompiles).\n"
        "The figures are those of tpu-monitor's report: devices from passive discovery (tpu-top never opens "
        "a runtime, so it never takes a TPU) and runtime figures from the agents and from libtpu's runtime "
        "metrics services (localhost:8431, the ports in TPU_RUNTIME_METRICS_PORTS and each --metrics-addr, read "
        "on one channel per address for the whole session): on a TPU VM, the running job's HBM used / total and "
        "its TensorCore duty cycle (UTIL%, of the chip when the runtime keys it by chip). The Devices title says "
        "which services answered, or why none did (no metrics service, or one that does not answer within "
        "--metrics-timeout); a figure that the job's libtpu version does not serve shows as n/s (not served by "
        "this runtime), one that is unknown as -. When a service stops, the panel falls back to what discovery "
        "and the agents know and picks the service up again when it returns. A process that exits disappears "
        "at the next refresh.\n"
        "--once prints one frame to stdout with the same rendering, sized to the terminal (or $COLUMNS, else "
        "120 columns) and as tall as needed, and exits; it works in a pipe. Without --once, stdin and stdout "
        "must be a terminal."
    ),
    "KEYS": (
        "q  quit (Ctrl-C and SIGTERM also quit; the terminal is restored in every case).\n"
        "up / down, k / j  select a process; PgUp / PgDn move by 10, Home / End to the first or last.\n"
        "s / S  sort by the next / previous column: PID, USER, TAG, CPU%, RSS, DEV MEM, COMP, RECOMP, STEP/S.\n"
        "r  reverse the sort order.\n"
        "p  pause or resume refreshing.\n"
        "h or ?  show the keys; any key closes them."
    ),
    "EXAMPLES": (
        "tpu-top\n"
        "tpu-top --interval 0.5 --sort steps\n"
        "tpu-top --once | head -20\n"
        "tpu-top --metrics-addr localhost:8432 --metrics-timeout 0.5\n"
        "python -m tpu_tools.agent --tag train train.py & tpu-top --tag-filter '^train'"
    ),
}


@click.command(name="top", cls=ToolCommand, man_sections=MAN_SECTIONS)
@click.option("--interval", type=Duration(), default="1s", show_default=True, metavar="SECONDS",
              help="Time between refreshes (seconds, or with ms, s, m).")
@click.option("--once", is_flag=True, help="Print one frame to stdout and exit (works in a pipe).")
@click.option("--sort", type=click.Choice(SORT_KEYS), default=DEFAULT_SORT, show_default=True,
              help="Initial sort column of the process panel.")
@click.option("--tag-filter", type=Regex(), default=None, metavar="REGEX",
              help="Only agents whose tag matches this regular expression.")
@click.option("--agent-timeout", type=Duration(), default="0.5s", show_default=True, metavar="SECONDS",
              help="How long to wait for each agent's answer.")
@metrics_options
@common_options
def top_command(interval: float, once: bool, sort: str, tag_filter: re.Pattern[str] | None,
                agent_timeout: float, metrics_addresses: list[str], metrics_timeout_s: float) -> int:
    """Live view of accelerator devices, the jobs using them, and the host."""
    if interval < 0.1:
        raise UsageError(f"--interval must be at least 0.1 s, got {interval:g}")
    if not once and not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise UsageError("tpu-top needs a terminal (stdin and stdout); use --once to print one frame, "
                         "or tpu-monitor for a stream of reports")
    from tpu_tools.metrics.groups.base import CollectOptions
    from tpu_tools.metrics.report import ReportBuilder
    from tpu_tools.top.model import ViewState

    state = ViewState(sort_index=SORT_KEYS.index(sort), interval_s=interval)
    builder = ReportBuilder(options=CollectOptions(agent_timeout_s=agent_timeout, tag_filter=tag_filter,
                                                   metrics_addresses=metrics_addresses,
                                                   metrics_timeout_s=metrics_timeout_s))
    try:
        if once:
            from tpu_tools.top.frame import frame_text, render

            width = shutil.get_terminal_size((120, 40)).columns
            frame = frame_text(render(builder.build(), state, width, None, interactive=False))
            sys.stdout.write(safe_text(frame, multiline=True) + "\n")
            sys.stdout.flush()
        else:
            from tpu_tools.top.screen import run_screen

            run_screen(builder.build, state)
    finally:
        builder.close()
    return EXIT_OK


def main() -> None:
    run_cli(top_command)
