"""The agent's socket server on real Unix sockets: the request answered at accept when it is already there, and
every slower path still served (a request in pieces, an answer larger than the socket's buffer read slowly, a
client that leaves early), with other clients served meanwhile."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentjobs import wait_for

from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import wire

BIG = "x" * (4 << 20)  # far beyond a Unix socket's buffer: the answer must wait in the selector for the reader


def answer(request: str) -> dict[str, Any]:
    return {"schema": wire.SNAPSHOT_SCHEMA, "request": request, "big": BIG if request == "arrays" else None}


@pytest.fixture()
def server() -> Iterator[AgentServer]:
    directory = Path(tempfile.mkdtemp(prefix="tts", dir="/tmp"))  # short: a socket path has at most 107 bytes
    served = AgentServer(directory / "agent.sock", answer)
    served.start()
    yield served
    served.stop()
    shutil.rmtree(directory, ignore_errors=True)


def connect(server: AgentServer) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(30)
    client.connect(str(server.path))
    return client


def read_answer(client: socket.socket) -> dict[str, Any]:
    received = bytearray()
    while chunk := client.recv(1 << 16):
        received += chunk
    assert received.endswith(b"\n")
    return json.loads(received)


def test_a_request_sent_with_the_connection_is_answered(server):
    for _ in range(20):
        with connect(server) as client:
            client.sendall(wire.encode_request("snapshot"))
            assert read_answer(client)["request"] == "snapshot"
    assert server.counters.served == 20 and server.counters.malformed == 0


def test_a_request_in_pieces_is_answered_once_whole(server):
    request = wire.encode_request("ping")
    with connect(server) as client:
        client.sendall(request[:5])
        # A later client is accepted after this one (the backlog is in order) and served while it is incomplete.
        with connect(server) as other:
            other.sendall(wire.encode_request("snapshot"))
            assert read_answer(other)["request"] == "snapshot"
        assert server.counters.served == 1
        client.sendall(request[5:])
        assert read_answer(client)["request"] == "ping"
    assert server.counters.served == 2


def test_an_answer_larger_than_the_socket_buffer_reaches_a_slow_reader_whole(server):
    with connect(server) as slow:
        slow.sendall(wire.encode_request("arrays"))
        first = slow.recv(1024)
        with connect(server) as other:  # the big answer waits in the selector; others are served meanwhile
            other.sendall(wire.encode_request("ping"))
            assert read_answer(other)["request"] == "ping"
        rest = bytearray(first)
        while chunk := slow.recv(1 << 16):
            rest += chunk
    document = json.loads(rest)
    assert document["request"] == "arrays" and document["big"] == BIG


def test_clients_that_leave_early_or_send_garbage_cost_nothing_else(server):
    with connect(server) as leaving:
        leaving.sendall(wire.encode_request("arrays"))  # asks for the big answer, then goes away unread
    with connect(server) as garbage:
        garbage.sendall(b"not json\n")
        assert garbage.recv(10) == b""
    with connect(server) as nothing:
        nothing.shutdown(socket.SHUT_WR)  # connects and closes its side without a request
        assert nothing.recv(10) == b""
    with connect(server) as client:
        client.sendall(wire.encode_request("ping"))
        assert read_answer(client)["request"] == "ping"
    wait_for(lambda: server.counters.malformed == 1, 30, 0.01)
