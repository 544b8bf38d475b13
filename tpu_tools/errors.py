"""Expected failures and the exit codes they map to.

Layers below the CLI raise these; the CLI turns them into one sentence on
stderr and the matching exit status. Anything else is an internal error.
"""

from __future__ import annotations

from tpu_tools.shorten import shorten

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_GATE = 3
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C)
EXIT_TERMINATED = 143  # SIGTERM


def first_line(error: BaseException, *, limit: int | None = None, default: str | None = None) -> str:
    """The first non-blank line of an error's message, for one-sentence reports.

    An error with no message gives `default`, or its type's name when no default is given;
    a line longer than `limit` is cut to `limit` characters ending in "...".
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else (type(error).__name__ if default is None else default)
    return text if limit is None else shorten(text, limit)


class ToolError(Exception):
    """A failure the user can act on; `str(err)` is the sentence shown."""

    exit_code = EXIT_FAILURE


class UsageError(ToolError):
    """Bad input from the command line, the environment or a config file."""

    exit_code = EXIT_USAGE


class RuntimeFailure(ToolError):
    """The accelerator runtime could not be used or failed while in use."""

    exit_code = EXIT_FAILURE


class PlatformUnavailable(RuntimeFailure):
    """The requested PJRT platform cannot be loaded on this machine."""


class RuntimeHang(RuntimeFailure):
    """The runtime did not answer within its time limit."""


class RuntimeCrash(RuntimeFailure):
    """The runtime process died (signal or abnormal exit)."""


class GateFailed(ToolError):
    """A check that CI gates on did not pass (regression, bandwidth floor, wrong values)."""

    exit_code = EXIT_GATE
