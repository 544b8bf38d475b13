"""The /metrics server when a --web-config asks for TLS or basic auth.

A ThreadingHTTPServer whose TLS handshake runs in the request's own thread (a client that stalls in the
handshake never blocks the others), answering 401 without the right credentials.
"""

from __future__ import annotations

import errno
import http.server
import socket
import ssl
import threading
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from tpu_tools.errors import RuntimeFailure
from tpu_tools.metrics.webconfig import Authenticator, WebConfig, ssl_context

HANDSHAKE_TIMEOUT_S = 10.0


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, context: ssl.SSLContext | None,
                 authenticator: Authenticator):
        self.registry = registry
        self.context = context
        self.authenticator = authenticator
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is not None:
            request.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                request = self.context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):  # a plain-HTTP client, a bad certificate, a stalled handshake
                request.close()
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that goes away mid-answer is not the exporter's problem


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = 30
    head = False  # a HEAD request: the headers of GET's answer only

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name): GET's answer without the body
        self.head = True
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self.server.authenticator.check(self.headers.get("Authorization")):
            self._answer(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                         {"WWW-Authenticate": 'Basic realm="tpu-tools"'})
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/":
            self._answer(200, b'<html><body><a href="/metrics">metrics</a></body></html>\n', "text/html")
        else:
            self._answer(404, b"Not Found\n", "text/plain; charset=utf-8")

    def _answer(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if not self.head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_secure(collector: Collector, host: str, port: int, config: WebConfig) -> http.server.HTTPServer:
    """Serve /metrics with the TLS and basic auth of `config` in a daemon thread; RuntimeFailure when the
    port is taken."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    context = ssl_context(config.tls) if config.tls is not None else None
    try:
        server = _Server((host, port), registry, context, Authenticator(config.users))
    except OSError as error:
        in_use = error.errno == errno.EADDRINUSE
        reason = "is already in use" if in_use else f"cannot be used ({error.strerror or error})"
        raise RuntimeFailure(f"cannot serve Prometheus metrics: port {port} on {host} {reason}") from error
    threading.Thread(target=server.serve_forever, name="tpu-tools-metrics", daemon=True).start()
    return server
