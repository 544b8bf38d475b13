"""The agent's socket protocol: one bounded request line in, one JSON document out.

Request: a JSON object on one line, at most MAX_REQUEST_BYTES, naming one of
REQUESTS. The agent answers with one JSON object followed by a newline and
closes the connection, unless the request says `"keep": true`: then the
connection stays open for the client's next request, until the client closes
it or leaves it idle for KEEP_IDLE_S (a monitor asking 10 times a second then
costs the job no connection set-up per request). An agent that does not know
`keep` answers and closes, as before. A request that is too long, not JSON, not
an object or names an unknown request gets no answer: the connection is closed.
Nothing a client sends is ever evaluated or run.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import orjson

from tpu_tools.jsonout import finite_document

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 4096
MAX_RESPONSE_BYTES = 64 << 20
REQUEST_TIMEOUT_S = 2.0  # the agent drops a client that has not sent its request by then
REPLY_TIMEOUT_S = 5.0  # ... or that does not read the answer within this time
KEEP_IDLE_S = 60.0  # a kept connection with no request for this long is closed
SNAPSHOT_SCHEMA = "tpu-tools/agent/v1"

REQUEST_SNAPSHOT = "snapshot"
REQUEST_PING = "ping"
REQUEST_ARRAYS = "arrays"  # device memory by allocation, read on this request only (agent/arrays.py)
REQUEST_STACKS = "stacks"  # every Python thread's stack, made on this request only (agent/stacks.py)
REQUESTS = (REQUEST_SNAPSHOT, REQUEST_PING, REQUEST_ARRAYS, REQUEST_STACKS)


class MalformedRequest(ValueError):
    pass


def encode_request(name: str, keep: bool = False) -> bytes:
    """One request line of the agent protocol, JSON and a newline; `keep` asks the agent to keep the connection."""
    document: dict[str, Any] = {"request": name, "version": PROTOCOL_VERSION}
    if keep:
        document["keep"] = True
    return json.dumps(document).encode() + b"\n"


def decode_request(line: bytes) -> tuple[str, bool]:
    """(the request name, whether to keep the connection) from one received line; raises MalformedRequest."""
    known = _ENCODED_REQUESTS.get(line)
    if known is not None:  # what our own clients send: no JSON parse in the job's process
        return known
    if len(line) > MAX_REQUEST_BYTES:
        raise MalformedRequest("request too long")
    try:
        document = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise MalformedRequest("not JSON") from error
    if not isinstance(document, dict) or document.get("request") not in REQUESTS:
        raise MalformedRequest("unknown request")
    return str(document["request"]), document.get("keep") is True


_ENCODED_REQUESTS = {encode_request(name, keep).rstrip(b"\n"): (name, keep)
                     for name in REQUESTS for keep in (False, True)}


_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def encode_response(document: dict[str, Any]) -> bytes:
    """One answer line of the agent protocol: compact JSON and a newline; unknown types as strings, a number that
    is not finite as null.

    The job's process pays for every answer; orjson encodes a snapshot in a tenth of json's time. What orjson
    refuses (an integer beyond 64 bits, nesting past its limit) is left to json.
    """
    try:
        return orjson.dumps(document, default=str, option=_ORJSON_OPTIONS)
    except TypeError:
        return (json.dumps(finite_document(document)[0], separators=(",", ":"), default=str, allow_nan=False).encode()
                + b"\n")


def decode_response(data: bytes | bytearray) -> Any:
    """The JSON document of an answer; ValueError when it is not JSON (or not UTF-8)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # NaN and Infinity, as Python's json writes them (earlier agents did): json
        return json.loads(data.decode("utf-8"))  # reads them, and the snapshot's check names the figure


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(connection: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(raw)
