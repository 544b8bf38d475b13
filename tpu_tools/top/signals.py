"""Sending SIGINT, SIGTERM or SIGKILL to a process shown by tpu-top, with the kernel's permission rules.

`refusal()` asks the kernel first (signal 0 checks permission without sending
anything), so a process of another user is refused with a message before the
confirmation line; `send()` reports what happened in one sentence.
"""

from __future__ import annotations

import os
import signal

from tpu_tools.top.model import ProcessRow


def _label(row: ProcessRow) -> str:
    return f"{row.pid}" + (f" ({row.tag})" if row.tag else "")


def refusal(row: ProcessRow) -> str | None:
    """Why this process may not be signalled from here, or None when it may."""
    if row.host is not None:
        return f"{_label(row)} runs on {row.host}: signals reach only processes of this host"
    try:
        os.kill(row.pid, 0)
    except ProcessLookupError:
        return f"process {_label(row)} has already exited"
    except PermissionError:
        owner = f"user {row.user}" if row.user else "another user"
        return f"not permitted to signal {_label(row)}: it belongs to {owner}"
    return None


def send(row: ProcessRow, signal_name: str) -> tuple[bool, str]:
    """Send `signal_name` ("SIGTERM", ...) to the row's process; (delivered, message)."""
    reason = refusal(row)
    if reason:
        return False, reason
    try:
        os.kill(row.pid, getattr(signal, signal_name))
    except ProcessLookupError:
        return False, f"process {_label(row)} has already exited"
    except PermissionError:
        return False, f"not permitted to signal {_label(row)}"
    except (OSError, AttributeError) as error:
        return False, f"{signal_name} to {_label(row)} failed: {error}"
    return True, f"{signal_name} sent to {_label(row)}"
