"""The exporter's /metrics server under load and abuse: bounded threads and sockets, deadlines, bad heads."""

from __future__ import annotations

import gzip
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import as_report
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.core import GaugeMetricFamily
from test_exporter_webconfig import certificate

from tpu_tools.errors import RuntimeFailure
from tpu_tools.exporter.webconfig import TLSConfig, WebConfig
from tpu_tools.exporter.webserver import Limits, MetricsServer, parse_head, serve_metrics


class Chips:
    """Eight chips' duty cycle; counts its renderings."""

    def __init__(self) -> None:
        self.renderings = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.renderings += 1
        family = GaugeMetricFamily("tpu_tools_device_utilization_ratio", "Duty cycle.", labels=["device"])
        for chip in range(8):
            family.add_metric([f"tpu:{chip}"], 0.5 + chip / 16)
        yield family


def server_threads(port: int) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"tpu-tools-metrics:{port}")]


@pytest.fixture
def served(request) -> Iterator[tuple[MetricsServer, Chips]]:
    limits = getattr(request, "param", Limits())
    chips = Chips()
    server = serve_metrics(chips, "127.0.0.1", 0, limits=limits)
    try:
        yield server, chips
    finally:
        server.shutdown()
        server.server_close()


def scrape(port: int, method: str = "GET", path: str = "/metrics", headers: dict[str, str] | None = None,
           connection: http.client.HTTPConnection | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        if connection is None:
            conn.close()


def closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the server closes `sock` (end of stream or reset) before `timeout`."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def test_get_head_keep_alive_gzip_and_errors(served):
    server, _ = served
    port = server.server_address[1]
    status, headers, body = scrape(port)
    assert status == 200
    assert b'tpu_tools_device_utilization_ratio{device="tpu:7"} 0.9375' in body
    assert headers["content-type"].startswith("text/plain")
    assert int(headers["content-length"]) == len(body)
    status, head_headers, head_body = scrape(port, "HEAD")
    assert status == 200
    assert head_body == b""
    assert head_headers["content-length"] == headers["content-length"]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(5):  # one connection, several scrapes
        assert scrape(port, connection=connection)[0] == 200
    connection.close()
    status, headers, body = scrape(port, headers={"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip"
    assert b"tpu:7" in gzip.decompress(body)
    status, headers, body = scrape(port, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert scrape(port, path="/")[0] == 200
    assert scrape(port, path="/nothing")[0] == 404
    assert scrape(port, "POST")[0] == 405


def test_concurrent_scrapers_all_answered_by_a_fixed_pool(served):
    server, chips = served
    port = server.server_address[1]
    threads_before = len(server_threads(port))
    failures: list[BaseException] = []
    statuses: list[int] = []

    def scraper() -> None:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for _ in range(5):
                statuses.append(scrape(port, connection=connection)[0])
            connection.close()
        except BaseException as error:  # noqa: BLE001 (reported below)
            failures.append(error)

    clients = [threading.Thread(target=scraper) for _ in range(64)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(timeout=60)
    assert not failures
    assert statuses == [200] * 320
    assert len(server_threads(port)) == threads_before == 1 + Limits().workers  # no thread per connection
    assert chips.renderings <= 320  # concurrent scrapes may share a rendering


@pytest.mark.parametrize("served", [Limits(max_connections=16, header_timeout_s=30)], indirect=True)
def test_idle_connections_are_bounded_and_never_lock_scrapers_out(served):
    server, _ = served
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
    try:
        for _ in range(3):
            assert scrape(port)[0] == 200
        assert server.connections <= 16
        # The ones idle the longest went first.
        assert closed_by_server(idle[0], timeout=10)
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("served", [Limits(header_timeout_s=0.5)], indirect=True)
def test_idle_and_slow_clients_are_closed_after_the_header_deadline(served):
    server, _ = served
    port = server.server_address[1]
    idle = socket.create_connection(("127.0.0.1", port))
    slow = socket.create_connection(("127.0.0.1", port))
    stop = threading.Event()

    def trickle() -> None:  # a byte at a time, never a whole head
        try:
            for byte in b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * 10_000:
                if stop.wait(0.05):
                    return
                slow.send(bytes([byte]))
        except OSError:
            return

    trickler = threading.Thread(target=trickle)
    trickler.start()
    try:
        assert scrape(port)[0] == 200  # served meanwhile
        assert closed_by_server(idle)
        assert closed_by_server(slow)
    finally:
        stop.set()
        trickler.join()
        idle.close()
        slow.close()
    assert scrape(port)[0] == 200


def test_huge_heads_are_refused_and_the_server_goes_on(served):
    server, _ = served
    port = server.server_address[1]
    for request in (b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n",
                    b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)) + b"\r\n"):
        sock = socket.create_connection(("127.0.0.1", port))
        try:
            sock.sendall(request)
        except OSError:
            pass  # closed while we were still sending: refused all the same
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431")
        sock.close()
    for garbage in (b"\x16\x03\x01garbage\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/1.1\r\n bad\r\n\r\n"):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(garbage)
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")
        sock.close()
    assert scrape(port)[0] == 200


def test_clients_that_leave_mid_request_or_mid_answer_stall_no_worker(served):
    server, _ = served
    port = server.server_address[1]
    for _ in range(3 * Limits().workers):
        mid_body = socket.create_connection(("127.0.0.1", port))
        mid_body.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\nabc")
        mid_body.close()
        gone = socket.create_connection(("127.0.0.1", port))
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
        gone.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * 50)
        gone.close()
    for _ in range(2 * Limits().workers):  # every worker still answers
        assert scrape(port)[0] == 200


def test_pipelined_requests_are_answered_in_order(served):
    server, _ = served
    sock = socket.create_connection(("127.0.0.1", server.server_address[1]))
    sock.sendall(b"HEAD /metrics HTTP/1.1\r\n\r\nGET /nothing HTTP/1.1\r\nConnection: close\r\n\r\n")
    received = b""
    sock.settimeout(10)
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert b"HTTP/1.1 404" in received


def test_a_stalled_tls_handshake_holds_no_thread(tmp_path: Path):
    cert, key = certificate(tmp_path)
    config = WebConfig(tls=TLSConfig(cert_file=cert, key_file=key))
    server = serve_metrics(Chips(), "127.0.0.1", 0, config, Limits(header_timeout_s=0.5, workers=1))
    port = server.server_address[1]
    context = ssl.create_default_context(cafile=str(cert))
    try:
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        stalled[0].sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
        assert scrape(port, connection=connection)[0] == 200
        connection.close()
        assert all(closed_by_server(sock) for sock in stalled)
        for sock in stalled:
            sock.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_taken_port_is_one_sentence():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeFailure, match="is already in use"):
            serve_metrics(Chips(), "127.0.0.1", taken.getsockname()[1])


def test_renderings_are_shared_but_never_older_than_the_scrape():
    from prometheus_client.registry import CollectorRegistry

    from tpu_tools.exporter.webserver import Renderer

    chips = Chips()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(chips)
    renderer = Renderer(registry)
    arrived = time.monotonic()
    first, _ = renderer.body("", False, arrived)
    assert renderer.body("", False, arrived)[0] == first
    assert chips.renderings == 1  # rendered after it arrived
    renderer.body("", False, time.monotonic() + 1)  # arrived after that rendering started: a new one
    assert chips.renderings == 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_head_parses_or_is_refused(head):
    request = parse_head(head)
    if request is not None:
        assert request.version.startswith("HTTP/1.")
        assert request.method.isalpha()


def test_a_report_is_rendered_once_however_many_scrapes():
    from prometheus_client.registry import CollectorRegistry

    from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector
    from tpu_tools.exporter.webserver import Renderer

    collector = ReportCollector(dict(BUILTIN))
    collector.update(as_report({"host": {"error": None, "cpu_percent": 12.0}}))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    renderer = Renderer(registry, collector.generation)
    first, _ = renderer.body("", False, time.monotonic())
    assert renderer.body("", False, time.monotonic() + 1)[0] is first  # same report: same body
    collector.update(as_report({"host": {"error": None, "cpu_percent": 34.0}}))
    assert b"tpu_tools_host_cpu_percent 34.0" in renderer.body("", False, time.monotonic())[0]


def test_scrapes_with_credentials_are_answered_from_the_rendering_of_the_report():
    import base64

    import bcrypt

    from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector

    collector = ReportCollector(dict(BUILTIN))
    collector.update(as_report({"host": {"error": None, "cpu_percent": 12.0}}))
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    server = serve_metrics(collector, "127.0.0.1", 0, WebConfig(users={"prom": hashed}))
    port = server.server_address[1]
    good = {"Authorization": "Basic " + base64.b64encode(b"prom:pw").decode()}
    bad = {"Authorization": "Basic " + base64.b64encode(b"prom:nope").decode()}
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(20):  # the first checks the password and renders; the others come from the loop
            status, _, body = scrape(port, headers=good, connection=connection)
            assert status == 200
            assert b"tpu_tools_host_cpu_percent 12.0" in body
            assert scrape(port, "HEAD", headers=bad, connection=connection)[0] == 401
        collector.update(as_report({"host": {"error": None, "cpu_percent": 34.0}}))
        assert b"tpu_tools_host_cpu_percent 34.0" in scrape(port, headers=good, connection=connection)[2]
        assert scrape(port, headers={}, connection=connection)[0] == 401
        connection.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_flood_of_pipelined_scrapes_is_answered_in_turn_with_bounded_buffers():
    from tpu_tools.exporter.prometheus import BUILTIN, ReportCollector

    collector = ReportCollector(dict(BUILTIN))
    collector.update(as_report({"host": {"error": None, "cpu_percent": 12.0}}))
    server = serve_metrics(collector, "127.0.0.1", 0)
    try:
        flood = socket.create_connection(("127.0.0.1", server.server_address[1]))
        count = 3000  # far more than the stack would take one answer inside another
        request = b"GET /metrics HTTP/1.1\r\n\r\n"
        sender = threading.Thread(target=flood.sendall, args=(request * (count - 1) + request.replace(
            b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),))
        sender.start()
        received = bytearray()
        flood.settimeout(30)
        while chunk := flood.recv(1 << 20):
            received += chunk
        sender.join()
        flood.close()
        assert received.count(b"HTTP/1.1 200 OK") == count
        assert scrape(server.server_address[1])[0] == 200
    finally:
        server.shutdown()
        server.server_close()
