"""Entry point of the isolated runtime process (see `isolate`).

argv: the result pipe's file descriptor and a JSON request
{"target": "module:function", "params": {...}}. The answer is one JSON
document on that pipe: {"ok": true, "value": ...} or the error.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback


def die_with_parent() -> None:
    """Ask Linux to kill this process if the parent dies, so no orphan holds a device."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the parent is already gone
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main() -> None:
    """Entry point of the isolated child: run the requested query and write its JSON answer.

    The answer goes to the file descriptor in argv[1]: {"ok": true, "value": ...} or the error's
    type, message and traceback. Never raises: every exception becomes an answer.
    """
    result_fd = int(sys.argv[1])
    request = json.loads(sys.argv[2])
    die_with_parent()
    try:
        module_name, _, function_name = request["target"].partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        answer = {"ok": True, "value": function(**request.get("params", {}))}
    except BaseException as exc:  # noqa: BLE001 report everything, including SystemExit from plugins
        answer = {
            "ok": False,
            "error_type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    data = json.dumps(answer, default=str).encode()
    with os.fdopen(result_fd, "wb") as pipe:
        pipe.write(data)
    # Skip interpreter teardown: some runtimes hang or crash while shutting down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
