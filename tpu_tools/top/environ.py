"""The environment screen (`e`): a process's /proc/PID/environ, one VAR=value a line, secrets redacted.

The environment is read once, when the screen opens (a refresh reads nothing);
the redaction is passed in (`Redact`), so this screen shows only what the
support bundle would keep.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tpu_tools.top.drawing import DIM, ERROR, TITLE, Line
from tpu_tools.top.model import Environment, ProcessRow

# Redact(name, value) -> the value to show ("<redacted>" for a secret).
Redact = Callable[[str, str], str]
MAX_ENVIRON_BYTES = 1 << 20  # far beyond a real environment: a bound on what one key press reads


def _label(row: ProcessRow) -> str:
    return f"{row.pid}" + (f" ({row.tag})" if row.tag else "") + (f" of {row.user}" if row.user else "")


def read_environment(row: ProcessRow, redact: Redact, proc: str = "/proc") -> Environment:
    """The row's environment, sorted by name, each value passed through `redact`; `error` says why none."""
    found = Environment(row.pid, _label(row))
    if row.host is not None:
        found.error = f"{row.pid} runs on {row.host}: only this host's processes can be read"
        return found
    try:
        with open(os.path.join(proc, str(row.pid), "environ"), "rb") as handle:
            data = handle.read(MAX_ENVIRON_BYTES)
    except PermissionError:
        found.error = (f"the environment of {_label(row)} is not readable: only its owner (or root) may read "
                       f"/proc/{row.pid}/environ")
        return found
    except FileNotFoundError:
        found.error = f"process {row.pid} has exited"
        return found
    except OSError as error:
        found.error = f"cannot read /proc/{row.pid}/environ: {error.strerror or error}"
        return found
    if not data:  # a kernel thread, a zombie, or a process that cleared its environment
        found.error = f"{_label(row)} has an empty environment"
        return found
    for entry in sorted(data.split(b"\0")):
        if not entry:
            continue
        text = entry.decode("utf-8", "replace")
        name, sign, value = text.partition("=")
        found.lines.append(f"{name}={redact(name, value)}" if sign else redact("", text))
    return found


def environment_lines(env: Environment, width: int, height: int | None) -> list[Line]:
    """The screen's body: a title, then the variables from `env.top` as far as `height` allows."""
    count = f"{len(env.lines)} variables, secrets shown as <redacted>" if not env.error else ""
    lines = [Line().add(f" Environment of {env.label}", TITLE).add(f"   {count}" if count else "", DIM)]
    if env.error:
        return [*lines, Line().add(f"  {env.error}", ERROR), Line().add("  Esc goes back", DIM)]
    room = len(env.lines) if height is None else max(1, height - 1)
    env.top = max(0, min(env.top, len(env.lines) - room))
    lines += [Line().add(" " + text) for text in env.lines[env.top:env.top + room]]
    return lines
