"""Every program answers SIGINT and SIGTERM while it waits on something that never answers: a hung libtpu
metrics service, a profiler server or coordinator that accepts and stays silent, a silent Prometheus."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from agentjobs import agent_env, make_rundir, remove_rundir, wait_for
from conftest import clean_env, tool_command
from libtpu_server import FakeMetricsService, v5e_host

ENV = clean_env(JAX_PLATFORMS="cpu")
ANSWER_S = 30  # far below every wait the commands are given (60 s and more): only a signal ends them sooner


def _wait(condition: Callable[[], bool], process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command never reached its wait"
        time.sleep(0.05)


def _signalled(process: subprocess.Popen, number: int) -> subprocess.CompletedProcess:
    process.send_signal(number)
    try:
        stdout, stderr = process.communicate(timeout=ANSWER_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{process.args[0]} did not answer {signal.Signals(number).name} while blocked")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([*tool_command(args[0]), *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or ENV)


@contextmanager
def _silent_server(unix_path: str | None = None) -> Iterator[tuple[str, Callable[[int], bool]]]:
    """A server that accepts connections and never answers; `connected(n)`: n connections so far."""
    listener = socket.socket(socket.AF_UNIX) if unix_path else socket.socket()
    if unix_path:
        listener.bind(unix_path)
        os.chmod(unix_path, 0o600)
    else:
        listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    held: list[socket.socket] = []

    def connected(count: int) -> bool:
        try:
            held.append(listener.accept()[0])
        except BlockingIOError:
            pass
        return len(held) >= count

    try:
        yield unix_path or f"127.0.0.1:{listener.getsockname()[1]}", connected
    finally:
        for connection in held:
            connection.close()
        listener.close()


HUNG_LIBTPU = [
    (("tpu-monitor", "--count", "1"), signal.SIGINT, 0),
    (("tpu-monitor", "--count", "1"), signal.SIGTERM, 0),
    (("tpu-ls",), signal.SIGTERM, 143),
    (("tpu-top", "--once"), signal.SIGINT, 130),
    (("tpu-dump", "--only", "accelerators.libtpu", "-o", "{tmp}/b.tar.gz"), signal.SIGTERM, 143),
]


@pytest.mark.parametrize(("args", "number", "code"), HUNG_LIBTPU, ids=lambda v: " ".join(v) if isinstance(v, tuple)
                         else str(v))
def test_a_hung_libtpu_service_does_not_hold_a_signal(args, number, code, tmp_path):
    with FakeMetricsService(v5e_host()) as service:
        service.hang()
        command = [a.replace("{tmp}", str(tmp_path)) for a in args]
        process = _start(*command, "--metrics-addr", service.address, "--metrics-timeout", "60")
        try:
            _wait(lambda: sum(service.servicer.calls.values()) > 0, process)
            result = _signalled(process, number)
        finally:
            process.kill()
            service.release()
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr


def test_a_silent_profiler_server_does_not_hold_a_signal(tmp_path):
    with _silent_server() as (address, connected):
        process = _start("tpu-profile", "capture", "--addr", address, "--duration", "600",
                         "--out", str(tmp_path / "out"))
        try:
            _wait(lambda: connected(1), process)
            result = _signalled(process, signal.SIGINT)
        finally:
            process.kill()
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_silent_coordinator_does_not_hold_a_signal():
    with _silent_server() as (address, connected):
        process = _start("tpu-collectives-test", "--coordinator", address, "--num-processes", "2",
                         "--process-id", "1")
        try:
            _wait(lambda: connected(2), process)  # the reachability probe, then jax.distributed's own connection
            result = _signalled(process, signal.SIGTERM)
        finally:
            process.kill()
    assert result.returncode == 143, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_silent_prometheus_does_not_hold_a_signal():
    with _silent_server() as (address, connected):
        process = _start("tpu-monitor", "--count", "1", "--from-prometheus", f"http://{address}",
                         "--from-prometheus-timeout", "60")
        try:
            _wait(lambda: connected(1), process)
            result = _signalled(process, signal.SIGINT)
        finally:
            process.kill()
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "number", "code"), [(("tpu-monitor", "--count", "1"), signal.SIGTERM, 0),
                                                      (("tpu-top", "--once"), signal.SIGINT, 130)])
def test_a_silent_agent_does_not_hold_a_signal(args, number, code):
    rundir = make_rundir()
    try:
        # an agent socket named after this (live) test process, answering nothing
        with _silent_server(str(rundir / f"agent-{os.getpid()}.sock")) as (_, connected):
            process = _start(*args, "--agent-timeout", "60", env=agent_env(rundir, JAX_PLATFORMS="cpu"))
            try:
                _wait(lambda: connected(1), process)
                result = _signalled(process, number)
            finally:
                process.kill()
    finally:
        remove_rundir(rundir)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# A process of its own behind each socket (the client checks that the socket's process is the one it is named
# after): it accepts, marks the connection with a file, and never answers.
SILENT_AGENT = textwrap.dedent("""
    import os, socket, sys, time
    path, marker = os.path.join(sys.argv[1], f"agent-{os.getpid()}.sock"), sys.argv[2]
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".new")  # listening before it has its name: no client finds it refusing
    os.chmod(path + ".new", 0o600)
    listener.listen(16)
    os.rename(path + ".new", path)
    held = []
    deadline = time.monotonic() + 300
    listener.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            held.append(listener.accept()[0])
            open(marker, "w").close()
        except TimeoutError:
            pass
""")


@pytest.mark.parametrize(("args", "number", "code"), [(("tpu-monitor", "--count", "1"), signal.SIGTERM, 0),
                                                      (("tpu-top", "--once"), signal.SIGINT, 130)])
def test_several_silent_agents_asked_side_by_side_do_not_hold_a_signal(args, number, code):
    rundir = make_rundir()
    agents: list[subprocess.Popen] = []
    try:
        markers = [rundir / f"asked-{index}" for index in range(2)]
        for marker in markers:
            agents.append(subprocess.Popen([sys.executable, "-c", SILENT_AGENT, str(rundir), str(marker)]))

        def listening() -> bool:
            assert all(agent.poll() is None for agent in agents), "an agent exited before it listened"
            return len(list(rundir.glob("agent-*.sock"))) == len(agents)

        wait_for(listening, timeout=60)
        process = _start(*args, "--agent-timeout", "60", env=agent_env(rundir, JAX_PLATFORMS="cpu"))
        try:
            _wait(lambda: all(marker.exists() for marker in markers), process)
            result = _signalled(process, number)
        finally:
            process.kill()
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
        remove_rundir(rundir)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
