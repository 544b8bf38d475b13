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
from hypothesis import given
from hypothesis import strategies as st

from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import wire

BIG = "x" * (4 << 20)  # far beyond a Unix socket's buffer: the answer must wait in the selector for the reader


def answer(request: str) -> dict[str, Any]:
    return {"schema": wire.SNAPSHOT_SCHEMA, "request": request, "big": BIG if request == "arrays" else None}


@pytest.fixture
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
    assert server.counters.served == 20
    assert server.counters.malformed == 0


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
    assert document["request"] == "arrays"
    assert document["big"] == BIG


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


OUR_LINES = [wire.encode_request(n, keep).rstrip(b"\n") for n in wire.REQUESTS for keep in (False, True)]


@given(st.binary(max_size=200) | st.sampled_from(OUR_LINES + [b'{"request": "ping"}', b'{"request":"ping","keep":1}',
                                                              b'{"request":"snapshot","version":2,"keep":true}']))
def test_a_request_line_decodes_as_its_json_says(line):
    # our clients' exact lines skip the JSON parse; every line still means what its JSON means
    try:
        document = json.loads(line.decode("utf-8"))
        why = "^unknown request$"  # JSON, but not a request of ours
    except ValueError:
        document, why = None, "^not JSON$"
    expected = document["request"] if isinstance(document, dict) and document.get("request") in wire.REQUESTS else None
    if expected is None:
        with pytest.raises(wire.MalformedRequest, match=why):
            wire.decode_request(line)
    else:
        assert wire.decode_request(line) == (expected, document.get("keep") is True)


def test_an_answer_holds_any_figure_a_job_may_have():
    import numpy as np

    def strict(line: bytes) -> Any:
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1
        return json.loads(line, parse_constant=lambda token: pytest.fail(f"{token} in an answer"))

    document = strict(wire.encode_response({"nan": float("nan"), 3: np.float32(1.5), "count": np.int64(7),
                                            "thing": object.__new__(object), "pair": (1, 2)}))
    assert document == {"nan": None, "3": 1.5, "count": 7, "thing": document["thing"], "pair": [1, 2]}
    assert document["thing"].startswith("<object object")
    # an integer beyond 64 bits: the standard library's encoder writes it, and still no NaN token
    assert strict(wire.encode_response({"big": 2**70, "nan": [float("inf")]})) == {"big": 2**70, "nan": [None]}


def test_an_answer_no_json_can_hold_is_an_error_answer_and_the_server_goes_on():
    loop: dict[str, Any] = {}
    loop["self"] = loop  # a cycle: neither encoder can write it
    directory = Path(tempfile.mkdtemp(prefix="tts", dir="/tmp"))
    served = AgentServer(directory / "agent.sock", lambda request: loop if request == "snapshot" else answer(request))
    served.start()
    try:
        for request in ("snapshot", "ping"):
            with connect(served) as client:
                client.sendall(wire.encode_request(request))
                reply = read_answer(client)
            if request == "snapshot":
                assert reply["schema"] == wire.SNAPSHOT_SCHEMA
                assert reply["error"].split(":")[0] in ("ValueError", "RecursionError")
            else:
                assert reply["request"] == "ping"
    finally:
        served.stop()
        shutil.rmtree(directory, ignore_errors=True)


def read_line(client: socket.socket) -> dict[str, Any]:
    received = bytearray()
    while not received.endswith(b"\n"):
        chunk = client.recv(1 << 16)
        assert chunk, "the agent closed a kept connection"
        received += chunk
    return json.loads(received)


def test_a_kept_connection_is_answered_request_after_request(server):
    with connect(server) as client:
        for request in ("ping", "snapshot", "ping"):
            client.sendall(wire.encode_request(request, keep=True))
            assert read_line(client)["request"] == request
        client.sendall(wire.encode_request("ping", keep=True) + wire.encode_request("snapshot", keep=True))
        with client.makefile("rb") as answers:  # two at once: answered in order
            assert [json.loads(answers.readline())["request"] for _ in range(2)] == ["ping", "snapshot"]
        client.sendall(wire.encode_request("ping"))  # without keep: the last answer, then the agent closes
        assert read_answer(client)["request"] == "ping"
    assert server.counters.accepted == 1
    assert server.counters.served == 6


def test_a_kept_connection_left_idle_is_closed_and_is_no_fault():
    directory = Path(tempfile.mkdtemp(prefix="tts", dir="/tmp"))
    served = AgentServer(directory / "agent.sock", answer, keep_idle_s=0.2)
    served.start()
    try:
        with connect(served) as client:
            client.sendall(wire.encode_request("ping", keep=True))
            assert read_line(client)["request"] == "ping"
            assert client.recv(1) == b""  # closed by the agent once idle (the socket waits up to 30 s)
        assert served.counters.timed_out == 0
    finally:
        served.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_new_client_takes_the_place_of_the_connection_kept_idle_the_longest(server):
    from tpu_tools.agent.server import MAX_CONNECTIONS

    kept = []
    try:
        for _ in range(MAX_CONNECTIONS):
            client = connect(server)
            kept.append(client)
            client.sendall(wire.encode_request("ping", keep=True))
            assert read_line(client)["request"] == "ping"
        with connect(server) as newcomer:
            newcomer.sendall(wire.encode_request("ping"))
            assert read_answer(newcomer)["request"] == "ping"
        assert kept[0].recv(1) == b""  # the first kept, idle the longest, made room
        kept[1].sendall(wire.encode_request("ping", keep=True))
        assert read_line(kept[1])["request"] == "ping"  # the others are still served
    finally:
        for client in kept:
            client.close()


def test_part_of_a_next_request_sent_with_a_kept_one_has_the_request_time_limit(server):
    with connect(server) as client:
        client.sendall(wire.encode_request("ping", keep=True) + b'{"requ')  # the rest never comes
        assert read_line(client)["request"] == "ping"
        assert client.recv(1) == b""  # dropped after the request's time limit, not the 60 s of an idle one
    wait_for(lambda: server.counters.timed_out == 1, 30, 0.01)
