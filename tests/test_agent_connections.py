"""A monitor keeps one connection per agent from round to round, and still answers whatever the agent did meanwhile
(restarted, or an agent that closes after each answer)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import wire
from tpu_tools.metrics.agent_client import AgentConnections, query_agents
from tpu_tools.metrics.rundir import ensure_private_dir


def snapshot(request: str) -> dict[str, Any]:
    return {"schema": wire.SNAPSHOT_SCHEMA, "pid": os.getpid(), "tag": "kept"}


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ttk", dir="/tmp"))  # short: a socket path has at most 107 bytes
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def serve(directory: Path) -> AgentServer:
    server = AgentServer(directory / f"agent-{os.getpid()}.sock", snapshot)  # this process is the agent's
    server.start()
    return server


def ask(directory: Path, connections: AgentConnections) -> None:
    scan = query_agents(5.0, directory=directory, connections=connections)
    assert [(r.tag, r.error) for r in scan.results] == [("kept", None)]


def test_rounds_ask_on_one_kept_connection(directory):
    server, connections = serve(directory), AgentConnections()
    try:
        for _ in range(3):
            ask(directory, connections)
        assert (server.counters.accepted, server.counters.served) == (1, 3)
        query_agents(5.0, directory=directory)  # a one-off client: its own connection, closed after
        assert server.counters.accepted == 2
    finally:
        connections.close()
        server.stop()


def test_an_agent_restarted_between_rounds_is_asked_on_a_new_connection(directory):
    connections = AgentConnections()
    first = serve(directory)
    ask(directory, connections)
    first.stop()  # closes the kept connection; a new agent takes the same path
    second = serve(directory)
    try:
        ask(directory, connections)
        ask(directory, connections)
        assert (second.counters.accepted, second.counters.served) == (1, 2)
    finally:
        connections.close()
        second.stop()


def test_an_agent_that_closes_after_each_answer_is_still_answered_every_round(directory):
    # an agent of before kept connections: it reads one line, answers and closes
    path = directory / f"agent-{os.getpid()}.sock"
    ensure_private_dir(directory)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(4)
    answered: list[bytes] = []

    def answer_once_each() -> None:
        while len(answered) < 3:
            connection, _ = listener.accept()
            with connection, connection.makefile("rb") as lines:
                answered.append(lines.readline())
                connection.sendall(wire.encode_response(snapshot("snapshot")))

    thread = threading.Thread(target=answer_once_each, daemon=True)
    thread.start()
    connections = AgentConnections()
    try:
        for _ in range(3):
            ask(directory, connections)
        thread.join(30)
        assert len(answered) == 3
        assert all(b'"keep": true' in line for line in answered)
    finally:
        connections.close()
        listener.close()
