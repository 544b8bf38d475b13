"""Where libtpu's metrics services listen: the default port, TPU_RUNTIME_METRICS_PORTS, explicit addresses."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping

from tpu_tools.errors import UsageError
from tpu_tools.parsing import port_number

DEFAULT_ADDRESS = "localhost:8431"  # where libtpu serves its runtime metrics unless told otherwise
# Moves that default address: for a host whose runtime serves elsewhere, and for tests, which must not depend on
# what listens on localhost:8431 (a TPU VM with a job running serves there).
DEFAULT_ADDRESS_VARIABLE = "TPU_TOOLS_LIBTPU_DEFAULT_ADDR"
PORTS_VARIABLE = "TPU_RUNTIME_METRICS_PORTS"
DEFAULT_TIMEOUT_S = 2.0  # deadline of every call
_CONNECT_PROBE_S = 0.5


def normalize_address(text: str) -> str:
    """"HOST:PORT", "[IPv6]:PORT" or a bare "PORT" (meaning localhost). Raises UsageError."""
    value = text.strip()
    if port_number(value) is not None:
        return f"localhost:{int(value)}"
    host, colon, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        bare_host = host[1:-1]
    else:
        bare_host = host
        if ":" in host:
            raise UsageError(f"metrics address {text!r}: write an IPv6 host in brackets, e.g. [::1]:8431")
    if not colon or not bare_host or port_number(port) is None or any(c.isspace() for c in value):
        raise UsageError(f"metrics address {text!r} is not HOST:PORT (e.g. localhost:8431) with a port 1-65535")
    return f"{host}:{int(port)}"


def default_address(environ: Mapping[str, str] | None = None) -> str:
    """localhost:8431, or the address in TPU_TOOLS_LIBTPU_DEFAULT_ADDR. Raises UsageError for a bad one."""
    raw = (environ if environ is not None else os.environ).get(DEFAULT_ADDRESS_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_ADDRESS
    try:
        return normalize_address(raw)
    except UsageError as error:
        raise UsageError(f"{DEFAULT_ADDRESS_VARIABLE}={raw!r}: {error}") from None


def ports_from_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """localhost:PORT for every port in TPU_RUNTIME_METRICS_PORTS ("8431,8432"). Raises UsageError."""
    raw = (environ if environ is not None else os.environ).get(PORTS_VARIABLE, "")
    addresses = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        port = port_number(item)
        if port is None:
            raise UsageError(f"{PORTS_VARIABLE}={raw!r}: {item!r} is not a port number (1-65535)")
        addresses.append(f"localhost:{port}")
    return addresses


def metrics_addresses(explicit: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> list[str]:
    """The default address, then every port of TPU_RUNTIME_METRICS_PORTS, then explicit ones; no repeats."""
    found = [default_address(environ), *ports_from_environment(environ), *(normalize_address(a) for a in explicit)]
    return list(dict.fromkeys(found))


def refused_sentence(address: str) -> str:
    """The error of an address where nothing listens."""
    return f"no metrics service at {address} (connection refused)"


def probe_connection(address: str, timeout_s: float = _CONNECT_PROBE_S) -> bool | None:
    """True when something accepts a TCP connection at address, False when every address it names refused one,
    None when neither is known (no answer within timeout_s, a name that does not resolve): a cheap test before
    paying for gRPC."""
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") else host
    try:
        candidates = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None
    refused = 0
    for family, kind, protocol, _, sockaddr in candidates:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.settimeout(timeout_s)
                probe.connect(sockaddr)
                return True
        except ConnectionRefusedError:
            refused += 1
        except OSError:
            continue
    return False if candidates and refused == len(candidates) else None


def accepts_connections(address: str, timeout_s: float = _CONNECT_PROBE_S) -> bool:
    """Whether anything accepts a TCP connection at address."""
    return probe_connection(address, timeout_s) is True
