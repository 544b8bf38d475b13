"""Capture a trace from another process that runs JAX's profiler server (`jax.profiler.start_server(port)`).

jaxlib ships the server but not the client. The client is the profiler plugin
package `xprof` (the same one `python -m jax.collect_profile` needs): its
`trace()` asks the server for a trace of a given length and writes the XSpace
under `<dir>/plugins/profile/<run>/`. xprof also converts that XSpace to the
trace-viewer JSON, which is written next to it for Perfetto.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tpu_tools.errors import RuntimeFailure, UsageError
from tpu_tools.parsing import port_number
from tpu_tools.signals import interruptible

CLIENT_PACKAGE = "xprof"
INSTALL_HINT = "pip install xprof (or: pip install 'tpu-tools[capture]')"
_ADDRESS = re.compile(r"^(?:grpc://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]+)$")
TRACING_ATTEMPTS = 3


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @property
    def text(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    match = _ADDRESS.match(text.strip())
    port = port_number(match["port"]) if match else None
    if match is None or port is None:
        raise UsageError(f"bad --addr {text!r}: expected HOST:PORT of a process that called "
                         "jax.profiler.start_server(PORT), e.g. 127.0.0.1:9999")
    return Address(match["host"], port)


def load_client():
    """The profiler client module, or a RuntimeFailure that names the package to install."""
    try:
        from xprof.convert import _pywrap_profiler_plugin  # type: ignore[import-not-found]
    except ImportError as error:
        raise RuntimeFailure(f"remote capture needs the profiler client package {CLIENT_PACKAGE!r}, which is not "
                             f"installed: {INSTALL_HINT}") from error
    return _pywrap_profiler_plugin


@contextmanager
def _quiet_client():
    """The client writes progress and logs straight to fds 1 and 2 (from C++); keep them off the terminal
    and out of the command's own output."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            for fd, copy in ((1, saved[0]), (2, saved[1])):
                os.dup2(copy, fd)
                os.close(copy)


def capture(address: Address, duration_s: float, log_dir: Path, python_trace: bool = True) -> Path:
    """Capture `duration_s` of tracing from `address` into `log_dir`; returns the run folder."""
    client = load_client()
    options = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 1 if python_trace else 0}
    with _quiet_client():
        try:
            # gRPC blocks in C++ for the whole --duration (up to an hour): Ctrl-C and SIGTERM answered at once
            interruptible(lambda: client.trace(address.text, str(log_dir), "", True, max(int(duration_s * 1000), 1),
                                               TRACING_ATTEMPTS, options), "tpu-profile-capture")
            error = None
        except Exception as caught:  # noqa: BLE001 the client raises RuntimeError("UNAVAILABLE: ...") and the like
            error = caught
    if error is not None:
        raise RuntimeFailure(f"could not capture a trace from {address.text}: {_reason(error)}; is a JAX "
                             f"process there running jax.profiler.start_server({address.port})?") from error
    runs = sorted((log_dir / "plugins" / "profile").glob("*/"))
    if not runs or not list(runs[-1].glob("*.xplane.pb")):
        raise RuntimeFailure(f"the profiler server at {address.text} returned no trace")
    return runs[-1]


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0].rstrip(".") if text else type(error).__name__


def write_perfetto_json(run_dir: Path) -> Path | None:
    """Convert the captured XSpace to trace-viewer JSON for ui.perfetto.dev; None when the client cannot."""
    try:
        from xprof.convert import raw_to_tool_data  # type: ignore[import-not-found]
    except ImportError:
        return None
    xplanes = sorted(run_dir.glob("*.xplane.pb"))
    with _quiet_client():
        try:
            data, _content_type = raw_to_tool_data.xspace_to_tool_data([str(p) for p in xplanes], "trace_viewer", {})
        except Exception:  # noqa: BLE001 the profiler's converter fails its own ways: no trace summary
            return None
    if not data:
        return None
    trace = json.loads(data)
    trace.pop("metadata", None)  # Perfetto rejects the metadata block
    from tpu_tools.atomic import write_file

    path = run_dir / "perfetto_trace.json.gz"
    write_file(path, gzip.compress(json.dumps(trace).encode("utf-8")), force=True, what="the Perfetto trace")
    return path
