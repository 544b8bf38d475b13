"""`tpu-top`: a live, full-screen view of the devices, the jobs running the agent, and the host."""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from tpu_tools.cli.common import ToolCommand, common_options, metrics_options, run_cli
from tpu_tools.cli.monitor import Regex
from tpu_tools.cli.params import Count, Duration
from tpu_tools.errors import EXIT_OK, RuntimeFailure, UsageError
from tpu_tools.parsing import MIN_PERIOD_S, terminal_size
from tpu_tools.sanitize import safe_text
from tpu_tools.shorten import quoted
from tpu_tools.top.keys import man_text
from tpu_tools.top.model import DEFAULT_SORT, SORT_KEYS

MAX_PID = 1 << 22  # Linux's largest pid_max
DEVICE_PLATFORMS = ("tpu", "cuda", "gpu", "rocm", "cpu")
_DEVICE = re.compile(r"^([a-z]+)(?::[0-9]{1,6}(?:@[0-9]{1,7})?)?$", re.ASCII)


def device_names(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--device: a platform or a device key (tpu:0, cuda:1@4242); anything else would match nothing, silently."""
    for value in values:
        match = _DEVICE.match(value)
        if not match or match.group(1) not in DEVICE_PLATFORMS:
            raise click.BadParameter(f"{quoted(safe_text(value), 40)} is not a device: give a platform "
                                     f"({', '.join(DEVICE_PLATFORMS)}) or a device key such as tpu:0")
    return values

MAN_SECTIONS = {
    "DESCRIPTION": (
        "A full-screen view refreshed every --interval: a header (host, platforms, time, refresh), the host "
        "(CPU and memory bars, load, swap), the devices (memory used / total with a bar, utilization where a "
        "source reports it, temperature and power where a source reports them, a graph of the recent "
        "utilization, else memory, and the processes holding each device; a lost device is marked LOST, a "
        "throttled one THROTTLED), and the processes: every job running the tpu-tools agent and every process "
        "holding a device, with PID, user, tag, CPU %, RSS, device memory, compilations, recompilations and steps "
        "per second, sorted by device memory. When the terminal has room, a history panel graphs each device's "
        "utilization and memory over the last ten minutes and the selected job's steps per second. The two lines "
        "under the processes describe the selected one: its step times (last, p50, p99), compile time, persistent "
        "cache hits and misses, and its last recompilation with JAX's reason (when the job was started with "
        "--explain-recompiles).\n"
        "Enter opens the selected job's own screen: its full command line, user and start time, CPU and RSS with "
        "their history, step times (p50, p90 of the samples, p99), a graph of its steps per second, its devices "
        "with memory used, peak and limit and its live arrays, the compile table by function (compiles, "
        "recompiles, time, persistent cache hits and misses, JAX's last recompilation reason), the recent "
        "recompilations with time and reason, and a histogram of its sampled step times. Esc goes back.\n"
        "Reports are gathered in the background, once per --interval; the screen redraws from the last one, so "
        "keys take effect at once even when a source is slow (a libtpu service at its deadline, an agent that "
        "does not answer). History is kept in memory while tpu-top runs: at most ten minutes (and 3600 samples) "
        "per device and job.\n"
        "The figures are those of tpu-monitor's report: devices from passive discovery (tpu-top never opens "
        "a runtime, so it never takes a TPU) and runtime figures from the agents and from libtpu's runtime "
        "metrics services (localhost:8431, the ports in TPU_RUNTIME_METRICS_PORTS and each --metrics-addr, read "
        "on one channel per address for the whole session): on a TPU VM, the running job's HBM used / total and "
        "its TensorCore duty cycle (UTIL%, of the chip when the runtime keys it by chip). The Devices title says "
        "which services answered, or why none did (no metrics service, or one that does not answer within "
        "--metrics-timeout); a figure that the job's libtpu version does not serve shows as n/s (not served by "
        "this runtime), one that is unknown as -. When a service stops, the panel falls back to what discovery "
        "and the agents know and picks the service up again when it returns. A process that exits disappears "
        "at the next refresh. When a report holds several hosts, a HOST column names each record's host.\n"
        "On a narrow terminal, columns are dropped whole, least useful first (at 80 columns every column is "
        "shown). Colours mean something: bars and utilization go from green to amber to red as they fill; red "
        "marks errors and lost devices. With NO_COLOR set, or on a terminal without colours, bold, dim and "
        "reverse video take their place; text keeps the terminal's background, so light themes stay readable.\n"
        "--from-prometheus URL shows every host that a Prometheus server scrapes (each running tpu-monitor "
        "--prometheus) instead of this host, with the same keys and layout: a Hosts panel (chips, mean "
        "utilization, HBM, jobs, steps per second, median step time) lists first the slice's outliers, marked "
        "<< with why (the host furthest from the median duty cycle or step time: the slow worker), and the device "
        "and process panels gain the host. When the server cannot be read, the last figures stay, marked STALE "
        "with the reason; --once with nothing to show says why and exits 1.\n"
        "--once prints one frame to stdout with the same rendering, sized to the terminal (or $COLUMNS, else "
        "120 columns) and as tall as needed, and exits; it works in a pipe. Without --once, stdin and stdout "
        "must be a terminal."
    ),
    "KEYS": man_text(),
    "EXAMPLES": (
        "tpu-top\n"
        "tpu-top --interval 0.5 --sort steps\n"
        "tpu-top --once | head -20\n"
        "tpu-top --user alice --device tpu:0\n"
        "tpu-top --metrics-addr localhost:8432 --metrics-timeout 0.5\n"
        "python -m tpu_tools.agent --tag train train.py & tpu-top --tag-filter '^train'\n"
        "tpu-top --from-prometheus http://prometheus.monitoring:9090"
    ),
}


def _offer_environment(state: Any) -> None:
    """`e`: a process's environment with the support bundle's redaction (values of secret-named variables,
    tokens, passwords in URLs all become <redacted>)."""
    import functools

    from tpu_tools.dump.redact import make_redactor
    from tpu_tools.top.environ import read_environment

    state.read_environment = functools.partial(read_environment, redact=make_redactor(True).env_value)


@click.command(name="top", cls=ToolCommand, man_sections=MAN_SECTIONS)
@click.option("--interval", type=Duration(minimum=MIN_PERIOD_S), default="1s", show_default=True, metavar="SECONDS",
              help="Time between refreshes (seconds, or with ms, s, m).")
@click.option("--once", is_flag=True, help="Print one frame to stdout and exit (works in a pipe).")
@click.option("--readonly", is_flag=True, help="Send no signals: I, T and K only say so (a shared screen).")
@click.option("--sort", type=click.Choice(SORT_KEYS), default=DEFAULT_SORT, show_default=True,
              help="Initial sort column of the process panel.")
@click.option("--tag-filter", type=Regex(), default=None, metavar="REGEX",
              help="Only agents whose tag matches this regular expression.")
@click.option("--user", "users", multiple=True, metavar="USER",
              help="Only processes of this user (repeat for several).")
@click.option("--pid", "pids", type=Count(1, MAX_PID), multiple=True, metavar="PID",
              help="Only this process (repeat for several).")
@click.option("--device", "devices", multiple=True, metavar="DEVICE", callback=device_names,
              help="Only this device (a key such as tpu:0, or a platform) and the processes using it; repeatable.")
@click.option("--agent-timeout", type=Duration(), default="0.5s", show_default=True, metavar="SECONDS",
              help="How long to wait for each agent's answer.")
@click.option("--from-prometheus", "from_prometheus", default=None, metavar="URL",
              help="Show every host that this Prometheus server scrapes instead of this host.")
@click.option("--from-prometheus-timeout", type=Duration(), default="2s", show_default=True, metavar="SECONDS",
              help="Deadline of each query to the --from-prometheus server.")
@metrics_options
@common_options
def top_command(interval: float, once: bool, readonly: bool, sort: str, tag_filter: re.Pattern[str] | None,
                users: tuple[str, ...],
                pids: tuple[int, ...], devices: tuple[str, ...], agent_timeout: float, from_prometheus: str | None,
                from_prometheus_timeout: float, metrics_addresses: list[str], metrics_timeout_s: float) -> int:
    """Live view of accelerator devices, the jobs using them, and the host."""
    if not once and not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise UsageError("tpu-top needs a terminal (stdin and stdout); use --once to print one frame, "
                         "or tpu-monitor for a stream of reports")
    from tpu_tools.metrics.groups.base import CollectOptions
    from tpu_tools.metrics.report import GroupPlan, ReportBuilder
    from tpu_tools.top.frame import SHOWN_GROUPS
    from tpu_tools.top.model import Filters, ViewState

    state = ViewState(sort_index=SORT_KEYS.index(sort), interval_s=interval,
                      filters=Filters(users=users, pids=pids, devices=devices), unicode=_unicode_output(),
                      readonly=readonly)
    if from_prometheus is None:  # this host's processes: their start times and parents, from /proc
        from tpu_tools.top.procinfo import ProcessInfo

        state.annotate = ProcessInfo().annotate
        _offer_environment(state)
    builder: Any  # one source or the other, each with build() -> report and close()
    if from_prometheus is not None:
        from tpu_tools.metrics.fleet.source import FleetSource

        builder = FleetSource(from_prometheus, from_prometheus_timeout)
    else:
        builder = ReportBuilder(plan=[GroupPlan(name) for name in SHOWN_GROUPS],
                                options=CollectOptions(agent_timeout_s=agent_timeout, tag_filter=tag_filter,
                                                       metrics_addresses=metrics_addresses,
                                                       metrics_timeout_s=metrics_timeout_s))
    try:
        if once:
            from tpu_tools.top.frame import frame_text, render

            width = terminal_size(sys.stdout.fileno(), (120, 40)).columns  # COLUMNS, bounded
            report = builder.build()
            fleet = report.fleet
            if fleet is not None and fleet.error and not fleet.hosts:  # --from-prometheus with nothing to show
                raise RuntimeFailure(fleet.error)
            frame = frame_text(render(report, state, width, None, interactive=False))
            sys.stdout.write(safe_text(frame, multiline=True) + "\n")
            sys.stdout.flush()
        else:
            from tpu_tools.top.collector import Collector
            from tpu_tools.top.history import History
            from tpu_tools.top.screen import run_screen

            collector = Collector(builder.build, interval).start()
            try:
                run_screen(collector, state, History(interval))
            finally:
                collector.close()
    finally:
        builder.close()
    return EXIT_OK


def _unicode_output() -> bool:
    """Block characters for graphs only where the terminal's encoding has them."""
    import locale

    encoding = (getattr(sys.stdout, "encoding", None) or locale.getpreferredencoding(False) or "").lower()
    return encoding.replace("-", "") in ("utf8", "utf16", "utf32")


def main() -> None:
    run_cli(top_command)
