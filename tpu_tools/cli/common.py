"""What every command shares: options, the runtime policy, errors and exit codes.

Every console script and the `tpu-tools` group run through `run_cli`, which
turns expected failures (`ToolError`, click usage errors, Ctrl-C) into one
line on stderr and the documented exit status; a closed pipe (`| head`) ends
any command quietly with status 141, as coreutils do. `--debug` or
TPU_TOOLS_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import click

from tpu_tools import signals
from tpu_tools.cli.output import (
    FORMAT_CHOICES,
    Output,
    error_document,
    expect_json,
    json_written,
    resolve_format,
)
from tpu_tools.cli.params import Count, Number, Seconds
from tpu_tools.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, ToolError
from tpu_tools.parsing import MAX_TIMEOUT_S
from tpu_tools.pjrt.runtime import PLATFORM_CHOICES, RuntimePolicy
from tpu_tools.sanitize import safe_text

# a runtime cannot start, nor a case be given up on, in less: a shorter --timeout would be silently ignored
MIN_RUNTIME_TIMEOUT_S = 1.0

DEFAULT_TIMEOUT_S = 30.0
MAX_HOST_DEVICES = 4096  # the CPU platform's device count: more is no test setup, just memory exhaustion
MAX_METRICS_TIMEOUT_S = 600.0  # the deadline of one read of libtpu's metrics: longer is no deadline at all
_debug = False


HELP_OPTION_NAMES = ["-h", "--help"]


def _short_help_option(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every tool answers -h as well as --help."""
    settings = kwargs.get("context_settings") or {}
    kwargs["context_settings"] = {"help_option_names": HELP_OPTION_NAMES, **settings}
    return kwargs


class _ToolParsing:
    """What ToolCommand and ToolGroup share: the context errors are named after, and whether the command was asked
    for a JSON document on stdout (`json_schema` is that document's schema), which its failures answer in JSON."""

    json_schema: str | None = None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        global _parsing
        _parsing = ctx
        given = list(args)  # click's parser consumes the list it is given
        try:
            rest: list[str] = super().parse_args(ctx, args)  # type: ignore[misc]
        except click.UsageError:
            self._note_json(self._seen_options(ctx, given))
            raise
        self._note_json(ctx.params)
        return rest

    def _seen_options(self, ctx: click.Context, args: list[str]) -> dict[str, Any]:
        """The options given before the one click refused, as raw text: enough to tell whether JSON was asked for."""
        probe = click.Context(self, info_name=ctx.info_name, parent=ctx.parent,  # type: ignore[arg-type]
                              resilient_parsing=True, ignore_unknown_options=True)
        opts, _, _ = self.make_parser(probe).parse_args(args=args)  # type: ignore[attr-defined]
        return dict(opts)

    def _note_json(self, values: dict[str, Any]) -> None:
        if self.json_schema and (values.get("json_flag") is True or values.get("output_format") == "json"
                                 or values.get("json_path") == "-"):
            expect_json(self.json_schema)


class ToolCommand(_ToolParsing, click.Command):
    """A click command that also carries the extra sections of its man page.

    `man_sections` maps a section title (e.g. "JSON OUTPUT") to its text; the
    docs generator writes them after the generated OPTIONS section. `json_schema` names the document that
    --json (--format json, --json -) prints; a failure then prints one with `error` and `exit_code`.
    """

    def __init__(self, *args: Any, man_sections: dict[str, str] | None = None, json_schema: str | None = None,
                 **kwargs: Any):
        super().__init__(*args, **_short_help_option(kwargs))
        self.man_sections = man_sections or {}
        self.json_schema = json_schema


class ToolGroup(_ToolParsing, click.Group):
    """A click group whose subcommands are defined in their own modules and imported on use.

    `programs`: each subcommand is a program of its own (the `tpu-tools` group), so errors name the program as
    `tpu-tools monitor`, as the console script `tpu-monitor` names itself.
    """

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None,
                 man_sections: dict[str, str] | None = None, json_schema: str | None = None, programs: bool = False,
                 **kwargs: Any):
        super().__init__(*args, **_short_help_option(kwargs))
        self.lazy_commands = lazy_commands or {}
        self.man_sections = man_sections or {}
        self.json_schema = json_schema
        self.programs = programs

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.lazy_commands, *super().list_commands(ctx)}, key=self._order)

    def _order(self, name: str) -> tuple[int, str]:
        names = list(self.lazy_commands)
        return (names.index(name) if name in names else len(names), name)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy_commands and name not in self.commands:
            module_name, _, attribute = self.lazy_commands[name].partition(":")
            import importlib

            self.add_command(getattr(importlib.import_module(module_name), attribute), name)
        return super().get_command(ctx, name)


_parsing: click.Context | None = None  # the deepest command whose options were parsed: errors name its program


def program_name(ctx: click.Context | None, default: str) -> str:
    """The program as invoked, as errors name it: tpu-monitor, tpu-profile, or `tpu-tools monitor`."""
    if ctx is None:
        return default
    chain = [ctx]
    while chain[-1].parent is not None:
        chain.append(chain[-1].parent)  # type: ignore[arg-type]
    root = chain[-1]
    names = [root.info_name or default]
    if getattr(root.command, "programs", False) and len(chain) > 1 and chain[-2].info_name:
        names.append(chain[-2].info_name)
    return " ".join(names)


def is_debug() -> bool:
    return _debug or os.environ.get("TPU_TOOLS_DEBUG", "") not in ("", "0")


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _debug
    if value:
        _debug = True


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from tpu_tools.pjrt.tpuvm import accelerator_summary, slice_info
    from tpu_tools.versions import version_text

    click.echo(version_text(ctx.find_root().info_name or "tpu-tools"))
    # As tpu-info --version: the accelerator type, from PCI and (on a TPU VM) the slice's own name for it.
    tpu_slice = slice_info()
    line = f"accelerator: {accelerator_summary() or 'none found'}"
    click.echo(line + (f" (slice {tpu_slice.accelerator_type})" if tpu_slice.accelerator_type else ""))
    ctx.exit(0)


def _apply(options: list[Callable], function: Callable) -> Callable:
    for option in reversed(options):
        function = option(function)
    return function


def common_options(function: Callable) -> Callable:
    """--debug and --version, on every command and on the group."""
    return _apply([
        click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                     help="Show Python tracebacks for errors (also TPU_TOOLS_DEBUG=1)."),
        click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
                     help="Print the toolkit, jax, jaxlib and PJRT plugin (libtpu) versions and the accelerator "
                          "type, and exit."),
    ], function)


def runtime_options(function: Callable | None = None, *, timeout: bool = True,
                    default_host_devices: int | None = None, validate: bool = True,
                    default_timeout_s: float = DEFAULT_TIMEOUT_S) -> Callable:
    """--platform, --host-devices, --xla-flag (and --timeout) collected into `policy` (and `timeout_s`).

    `validate=False` leaves a bad JAX_PLATFORMS to whoever starts the runtime (tpu-dump records it
    instead of refusing to run).
    """

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, platform: str, host_devices: int | None, xla_flags: tuple[str, ...],
                    **kwargs: Any) -> Any:
            policy = RuntimePolicy(platform=platform, host_devices=host_devices, xla_flags=xla_flags)
            if validate:
                policy.requested_platforms()  # validates JAX_PLATFORMS now, as a usage error
            return function(*args, policy=policy, **kwargs)

        options = [
            click.option("--platform", type=click.Choice(PLATFORM_CHOICES), default="auto", show_default=True,
                         help="PJRT platform to use; auto follows JAX_PLATFORMS, else jax's own choice."),
            click.option("--host-devices", type=Count(1, MAX_HOST_DEVICES), default=default_host_devices,
                         metavar="N", show_default=default_host_devices is not None,
                         help="Make the CPU platform expose N devices."),
            click.option("--xla-flag", "xla_flags", multiple=True, metavar="FLAG",
                         help="Extra XLA flag, e.g. --xla-flag=--xla_dump_to=/tmp/xla (repeatable)."),
        ]
        if timeout:
            options.append(click.option(
                "--timeout", "timeout_s", type=Number(minimum=MIN_RUNTIME_TIMEOUT_S, maximum=MAX_TIMEOUT_S),
                default=default_timeout_s, show_default=True,
                metavar="SECONDS",
                help="Give up on a runtime that does not answer within this many seconds."))
        return _apply(options, wrapper)

    return decorate(function) if function is not None else decorate


def metrics_options(function: Callable | None = None, *, validate: bool = True) -> Callable:
    """--metrics-addr (repeatable) and --metrics-timeout -> `metrics_addresses` (the default address, every port
    of TPU_RUNTIME_METRICS_PORTS, then the given ones) and `metrics_timeout_s`: libtpu's metrics services.

    A bad --metrics-addr is always a usage error; `validate=False` leaves a bad TPU_RUNTIME_METRICS_PORTS out
    instead of refusing to run (tpu-dump records it).
    """

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, metrics_addr: tuple[str, ...], **kwargs: Any) -> Any:
            from tpu_tools.metrics.libtpu.addresses import (
                DEFAULT_ADDRESS,
                default_address,
                metrics_addresses,
                normalize_address,
            )

            given = [normalize_address(address) for address in metrics_addr]
            try:
                addresses = metrics_addresses(given)
            except ToolError:
                if validate:
                    raise
                try:
                    first = default_address()
                except ToolError:
                    first = DEFAULT_ADDRESS
                addresses = list(dict.fromkeys([first, *given]))
            return function(*args, metrics_addresses=addresses, **kwargs)

        return _apply([
            click.option("--metrics-addr", multiple=True, metavar="HOST:PORT",
                         help="Also read libtpu's runtime metrics service here (repeatable); localhost:8431 and "
                              "the ports in TPU_RUNTIME_METRICS_PORTS are always read."),
            click.option("--metrics-timeout", "metrics_timeout_s", type=Seconds(maximum=MAX_METRICS_TIMEOUT_S),
                         default=2.0, show_default=True, metavar="SECONDS",
                         help="Deadline of every call to a metrics service."),
        ], wrapper)

    return decorate(function) if function is not None else decorate


def output_options(function: Callable) -> Callable:
    """--json and --format, resolved into an `out: Output`."""

    @functools.wraps(function)
    def wrapper(*args: Any, json_flag: bool, output_format: str, **kwargs: Any) -> Any:
        return function(*args, out=Output(resolve_format(output_format, json_flag, sys.stdout)), **kwargs)

    return _apply([
        click.option("--json", "json_flag", is_flag=True, help="Print one JSON document (same as --format json)."),
        click.option("--format", "output_format", type=click.Choice(FORMAT_CHOICES), default="auto",
                     show_default=True, help="auto: a table on a terminal, plain text in a pipe or with NO_COLOR."),
    ], wrapper)


def launched_first_answered(outcome: Any) -> None:
    """After a --launch run: process 0 writes on this program's stdout, and where it exited by itself (not killed
    by a signal) it wrote the run's document, a failure's JSON included; this program then writes none."""
    first = outcome.ranks[0] if outcome.ranks else None
    if first is not None and first.returncode is not None and first.returncode >= 0:
        json_written()


def silence_stdout() -> None:
    """After the reader of stdout went away, send the rest to /dev/null so exit stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what coreutils report when the reader of their output went away
_stdout_closed = False


def stdout_is_closed() -> bool:
    """Whether the reader of stdout went away (a BrokenPipeError may also come from a socket)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def closed_pipe() -> None:
    """The reader of stdout went away: the rest of the output goes nowhere and the program ends, quietly, with
    EXIT_CLOSED_PIPE. Commands that must go on (to stop child processes in order) call this and carry on."""
    global _stdout_closed
    _stdout_closed = True
    silence_stdout()


def run_cli(command: click.Command, prog_name: str | None = None) -> NoReturn:
    """Run a command as a program: documented exit codes, no traceback for expected failures."""
    prog = prog_name or os.path.basename(sys.argv[0]) or command.name or "tpu-tools"
    signals.install()  # SIGTERM unwinds like Ctrl-C: partial results are kept, then exit 143
    try:
        result = command.main(prog_name=prog, standalone_mode=False)
        code = result if isinstance(result, int) else 0
        sys.stdout.flush()
        if _stdout_closed:
            code = EXIT_CLOSED_PIPE
    except BrokenPipeError as error:
        if not (_stdout_closed or stdout_is_closed()):  # a socket's, not our output's: a failure like any other
            code = _fail(program_name(_parsing, prog), f"internal error: {type(error).__name__}: {error}", error,
                         EXIT_FAILURE, hint=True)
        else:
            closed_pipe()
            code = EXIT_CLOSED_PIPE
    except SystemExit:
        # click ends a command whose output met a closed pipe with sys.exit(1); it is a closed pipe like any other
        if not (_stdout_closed or stdout_is_closed()):
            raise
        closed_pipe()
        code = EXIT_CLOSED_PIPE
    except click.ClickException as error:
        if isinstance(error, _NO_ARGS_IS_HELP):  # a group given no subcommand: its help, as the user needs it
            error.show()
            code = error.exit_code
        else:  # one line, as every other error, not click's usage line and hint
            where = error.ctx if isinstance(error, click.UsageError) and error.ctx is not None else _parsing
            code = _fail(program_name(where, prog), error.format_message(), error, error.exit_code)
    except (click.Abort, KeyboardInterrupt) as error:
        signals.note_interrupt(error)
        code = _interrupted(prog)
    except ToolError as error:
        code = _fail(program_name(_parsing, prog), str(error), error, error.exit_code)
    except Exception as error:  # noqa: BLE001 the last resort: a bug becomes one line, its traceback under --debug
        if signals.received() is not None:  # the signal's exception turned into another on its way (an import)
            code = _interrupted(prog)
        else:  # a bug: say so in one line, traceback under --debug
            code = _fail(program_name(_parsing, prog), f"internal error: {type(error).__name__}: {error}", error,
                         EXIT_FAILURE, hint=True)
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED) and "jax" in sys.modules:
        # The runtime's threads may still be compiling or running: tearing the interpreter down under them can
        # crash it (SIGSEGV instead of 143). What was to be kept is written; leave without the teardown.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


_NO_ARGS_IS_HELP: tuple[type, ...] = tuple(
    kind for kind in [getattr(click.exceptions, "NoArgsIsHelpError", None)] if kind is not None)  # click >= 8.2


def _interrupted(prog: str) -> int:
    code = signals.interrupted_exit_code()
    what = "terminated" if code == EXIT_TERMINATED else "interrupted"
    sys.stderr.write(f"{program_name(_parsing, prog)}: {what}\n")
    _answer_json(what, code)
    return code


def _fail(name: str, message: str, error: BaseException, code: int, hint: bool = False) -> int:
    """Report a failure on one line of stderr, `name: error: message` (and in JSON on stdout where JSON was asked
    for); return its exit code."""
    if is_debug():
        traceback.print_exception(type(error), error, error.__traceback__)
        for extra in ("child_traceback", "child_stderr"):
            text = getattr(error, extra, "")
            if text:
                sys.stderr.write(f"--- {extra.replace('_', ' ')} ---\n{text}\n")
    sentence = " ".join(line.strip() for line in message.splitlines() if line.strip())
    suffix = " (rerun with --debug for the traceback)" if hint and not is_debug() else ""
    sys.stderr.write(f"{name}: error: {safe_text(sentence)}{suffix}\n")
    sys.stderr.flush()
    _answer_json(sentence, code)
    return code


def _answer_json(message: str, code: int) -> None:
    """The one JSON document of a command asked for JSON that fails before writing its own."""
    document = error_document(message, code)
    if document is None or _stdout_closed:
        return
    try:
        Output("json", sys.stdout).json(document)
    except (OSError, ValueError):  # stdout gone: the line on stderr said it
        pass
