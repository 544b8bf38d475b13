"""Every writer renames over only a regular file or a link: a FIFO or the null device is written in place (or
refused with one line when nobody reads it), any other device is refused, and none becomes a regular file."""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool, tool_command

from tpu_tools.atomic import check_writable, stream_kind, write_file
from tpu_tools.errors import UsageError

CPU = {"JAX_PLATFORMS": "cpu"}
RESULT = {"schema": "tpu-tools/bench/v1", "device": {"platform": "cpu", "kind": "cpu"}, "results": [
    {"id": "x/a", "benchmark": "x", "name": "a", "status": "ok", "params": {}, "values": {}, "stats": {
        "time_us": {"median": 2.0, "p25": 1.0, "p75": 3.0, "p90": 3.0, "p99": 3.0, "min": 1.0, "max": 3.0,
                    "mean": 2.0, "stdev": 1.0, "count": 5, "higher_is_better": False}}}]}


def _null_device(folder: Path) -> Path:
    """A character device 1,3 (the null device) of our own; /dev/null itself only when we cannot make one."""
    if os.geteuid() != 0:
        return Path("/dev/null")
    path = folder / "nd"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def _read_fifo_while(fifo: Path, command: list[str], cwd: Path | None = None, timeout: float = 180) \
        -> tuple[subprocess.CompletedProcess, bytes]:
    """Run `command` with a reader on `fifo` (opened first, so the writer finds it); what came through."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=clean_env(**CPU), cwd=cwd)
    received = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ended = process.poll() is not None
            ready, _, _ = select.select([reader], [], [], 0.05)
            chunk = os.read(reader, 1 << 16) if ready else b""
            received += chunk  # b"" only means no writer at this moment
            if ended and not chunk:
                break
        stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        process.kill()
        os.close(reader)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), bytes(received)


def _still(path: Path, kind) -> None:
    assert kind(os.lstat(path).st_mode), f"{path} was replaced: {oct(os.lstat(path).st_mode)}"


def test_the_writer_streams_into_fifos_and_the_null_device_and_refuses_other_devices(tmp_path):
    null = _null_device(tmp_path)
    assert stream_kind(null) == "null device"
    write_file(null, "data", force=False)  # nothing is replaced: no --force needed
    write_file(null, "data", force=True)
    _still(null, stat.S_ISCHR)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO with no reader"):
        write_file(fifo, "data", force=True)
    check_writable(fifo, force=False)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_file(fifo, "through the pipe", force=False)
        assert os.read(reader, 100) == b"through the pipe"
    finally:
        os.close(reader)
    _still(fifo, stat.S_ISFIFO)
    with pytest.raises(UsageError, match="character device"):
        check_writable("/dev/zero", force=True)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "s"))
        with pytest.raises(UsageError, match="it is a socket"):
            write_file(tmp_path / "s", "x", force=True)
    _still(tmp_path / "s", stat.S_ISSOCK)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_every_writer_leaves_a_device_node_a_device(tmp_path):
    null = _null_device(tmp_path)
    (tmp_path / "r.json").write_text(json.dumps(RESULT))
    result = str(tmp_path / "r.json")
    runs = [
        ("tpu-dump", "--only", "system.os", "-o", str(null), "--force"),
        ("tpu-dump", "--only", "system.os", "-o", str(null)),
        ("tpu-bench", "compare", result, result, "--json", str(null), "--junit", str(null), "--force"),
    ]
    for args in runs:
        completed = run_tool(*args, env=clean_env(**CPU), timeout=120)
        assert completed.returncode == 0, (args, completed.stderr)
        _still(null, stat.S_ISCHR)


def test_every_writer_streams_into_a_fifo(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(RESULT))
    result = str(tmp_path / "r.json")
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    completed, data = _read_fifo_while(fifo, [*tool_command("tpu-bench"), "compare", result, result,
                                              "--json", str(fifo)])
    assert completed.returncode == 0, completed.stderr
    assert json.loads(data)["schema"] == "tpu-tools/bench-compare/v1"
    completed, data = _read_fifo_while(fifo, [*tool_command("tpu-dump"), "--only", "system.os", "-o", str(fifo),
                                              "--force"])
    assert completed.returncode == 0, completed.stderr
    assert data[:2] == b"\x1f\x8b"  # the gzip bundle came through the pipe
    completed, data = _read_fifo_while(fifo, [*tool_command("tpu-collectives-test"), "-b", "64", "-e", "64",
                                              "-n", "1", "-w", "1", "--json", str(fifo)])
    assert completed.returncode == 0, completed.stderr
    assert json.loads(data)["schema"].startswith("tpu-tools/collectives")
    completed, data = _read_fifo_while(fifo, [*tool_command("tpu-bench"), "compare", result, result,
                                              "--junit", str(fifo)])
    assert completed.returncode == 0, completed.stderr
    assert b"<testsuite" in data
    _still(fifo, stat.S_ISFIFO)


def test_a_fifo_nobody_reads_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    (tmp_path / "r.json").write_text(json.dumps(RESULT))
    result = str(tmp_path / "r.json")
    for args in (("tpu-bench", "compare", result, result, "--json", str(fifo)),
                 ("tpu-dump", "--only", "system.os", "-o", str(fifo), "--force")):
        assert_one_line_error(run_tool(*args, env=clean_env(**CPU), timeout=120), 2, "FIFO with no reader")
    # tpu-profile hlo writes its HLO files into --out: a FIFO planted there is not waited on either
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import jax
        @jax.jit
        def f(x):
            return x * 2.0
    """))
    out = tmp_path / "h"
    out.mkdir()
    os.mkfifo(out / "model.f.stablehlo.mlir")
    completed = run_tool("tpu-profile", "hlo", "model:f", "--arg", "f32[4]", "--out", str(out), "--force",
                         cwd=tmp_path, env=clean_env(**CPU), timeout=120)
    assert_one_line_error(completed, 2, "FIFO with no reader")
    _still(out / "model.f.stablehlo.mlir", stat.S_ISFIFO)
    _still(fifo, stat.S_ISFIFO)
