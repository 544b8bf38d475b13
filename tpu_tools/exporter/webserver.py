"""The exporter's /metrics server: one event loop for every connection, a small pool of workers for answers.

Plain HTTP or TLS (with basic auth from a --web-config). Threads, sockets and memory are bounded whatever
the clients do (`Limits`):

- one loop thread accepts, does TLS handshakes, reads request heads and writes answers, all non-blocking,
  so an idle client, a client sending a byte a second or a stalled handshake holds only its socket and
  never a thread; it is closed when its head is not complete `header_timeout_s` after it connected or
  after its last answer (as Go's ReadHeaderTimeout / IdleTimeout);
- a scrape of an unchanged report with known credentials is answered by the loop from the last rendering;
  anything else goes to one of `workers` threads (bcrypt check, rendering), the only work it waits for;
- at most `max_connections` open connections: past that, the one idle the longest is closed, so a flood of
  idle connections cannot lock scrapers out;
- a request head longer than `max_request_bytes` (a 1 MiB request line, 10^4 headers) is answered 431 and
  closed; request bodies are never read (the connection closes after the answer);
- concurrent scrapes share one rendering: a scrape gets a body rendered after it arrived;
- before the collector's first data (tpu-monitor's first round) a scrape waits for it, `first_data_wait_s`
  from its arrival at most, then gets 503: never a 200 with no series.
"""

from __future__ import annotations

import errno
import gzip
import queue
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector, CollectorRegistry

from tpu_tools.errors import RuntimeFailure
from tpu_tools.exporter.webconfig import Authenticator, WebConfig, ssl_context

_CHECK_EVERY_S = 0.25  # how often deadlines are looked at (their precision)
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
            505: "HTTP Version Not Supported"}


@dataclass(frozen=True)
class Limits:
    workers: int = 4
    backlog: int = 1024  # the kernel caps it at net.core.somaxconn
    max_connections: int = 4096  # also kept under half the process's open-file limit
    header_timeout_s: float = 10.0  # TLS handshake + request head, from connect or from the last answer
    write_timeout_s: float = 10.0  # for the whole answer to leave
    max_request_bytes: int = 8 * 1024  # a scrape's head is a few hundred bytes
    first_data_wait_s: float = 5.0  # within Prometheus's default scrape timeout (10 s)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    has_body: bool


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False


def parse_head(head: bytes) -> Request | None:
    """The request of an HTTP/1.x head (without its blank line); None when it is not one."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    length = headers.get("content-length", "0")
    has_body = "transfer-encoding" in headers or not length.isdigit() or int(length) > 0
    return Request(parts[0], parts[1], parts[2], headers, has_body)


def keep_alive(request: Request) -> bool:
    connection = request.headers.get("connection", "").lower()
    if request.version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


def encode(answer: Answer, head_only: bool) -> bytes:
    lines = [f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'Error')}",
             f"Content-Length: {len(answer.body)}", *(f"{name}: {value}" for name, value in answer.headers)]
    if answer.close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + answer.body


class Renderer:
    """Renders the registry, reusing a body while it is current: while `generation()` (the collector's data
    version, where it has one) is unchanged, and otherwise when its rendering started after the scrape
    arrived (so concurrent scrapes share one rendering, never older than any of them)."""

    def __init__(self, registry: CollectorRegistry, generation: Callable[[], int] | None = None):
        self.registry = registry
        self.generation = generation
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, bool], tuple[float, int | None, bytes]] = {}

    def body(self, accept: str, compress: bool, arrived: float) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        key = (content_type, compress)
        with self._lock:
            generation = self.generation() if self.generation is not None else None
            cached = self._cache.get(key)
            if cached is not None and (cached[0] >= arrived or (generation is not None and cached[1] == generation)):
                return cached[2], content_type
            started = time.monotonic()
            output = encoder(self.registry)
            if compress:
                output = gzip.compress(output, compresslevel=1)
            self._cache[key] = (started, generation, output)
            return output, content_type

    def current(self, accept: str, compress: bool) -> tuple[bytes, str] | None:
        """The body if one rendered from the collector's current data is at hand now (without waiting)."""
        if self.generation is None or not self._lock.acquire(blocking=False):
            return None
        try:
            _, content_type = choose_encoder(accept)
            cached = self._cache.get((content_type, compress))
            if cached is None or cached[1] != self.generation():
                return None
            return cached[2], content_type
        finally:
            self._lock.release()


class _Conn:
    __slots__ = ("sock", "handshaking", "inbuf", "out", "close_after", "deadline", "active", "busy", "events")

    def __init__(self, sock: socket.socket, handshaking: bool, deadline: float, now: float):
        self.sock = sock
        self.handshaking = handshaking
        self.inbuf = bytearray()
        self.out: memoryview | None = None
        self.close_after = False
        self.deadline = deadline
        self.active = now  # last time it was accepted or answered: the idle one goes first at the limit
        self.busy = False  # a worker has its request
        self.events = 0


Handler = Callable[[Request, float], Answer]
# An answer the loop thread may give at once when it is at hand without blocking, else None (to a worker).
QuickHandler = Callable[[Request], Answer | None]


class MetricsServer:
    """Serves `handler`'s answers on (host, port); `start()` runs it in daemon threads."""

    def __init__(self, address: tuple[str, int], handler: Handler, context: ssl.SSLContext | None = None,
                 limits: Limits = Limits()):
        self.handler = handler
        quick = getattr(handler, "quick", None)
        self.quick: QuickHandler | None = quick if callable(quick) else None
        self.context = context
        self.limits = limits
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.max_connections = max(8, min(limits.max_connections, soft // 2))
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(limits.backlog)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: dict[int, _Conn] = {}
        # Connections waiting for a request head, the one idle longest first: evicted first at the limit,
        # and their deadlines come in this order (header_timeout_s after `active`).
        self._idle: OrderedDict[_Conn, None] = OrderedDict()
        self._work: queue.SimpleQueue[tuple[_Conn, Request, bool, float] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[_Conn, bytes, bool]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept_paused_until = 0.0
        self._pipelined: list[_Conn] = []

    @property
    def connections(self) -> int:
        return len(self._conns)

    def start(self) -> MetricsServer:
        name = f"tpu-tools-metrics:{self.server_address[1]}"
        self._threads = [threading.Thread(target=self._loop, name=name, daemon=True)]
        self._threads += [threading.Thread(target=self._worker, name=f"{name}-{i}", daemon=True)
                          for i in range(self.limits.workers)]
        for thread in self._threads:
            thread.start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        for _ in range(self.limits.workers):
            self._work.put(None)
        self._wake()
        for thread in self._threads:
            thread.join(timeout=5)

    def server_close(self) -> None:
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # The loop thread.

    def _loop(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        next_check = time.monotonic() + _CHECK_EVERY_S
        while not self._stop.is_set():
            for key, mask in self._selector.select(0 if self._pipelined else _CHECK_EVERY_S):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    self._take_answers()
                else:
                    self._service(key.data, mask)
            # Requests a client sent ahead, one per connection per turn: a loop, not a recursion, so a
            # connection that pipelines thousands of requests neither exhausts the stack nor starves others.
            pipelined, self._pipelined = self._pipelined, []
            for conn in pipelined:
                if self._conns.get(conn.sock.fileno()) is conn:
                    self._guarded(self._dispatch, conn)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _CHECK_EVERY_S
                self._expire(now)
        for conn in list(self._conns.values()):
            self._close(conn)
        self._selector.close()

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: make room, and let the backlog wait a moment
                if not self._evict_idle():
                    self._selector.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + 0.05
                return
            if len(self._conns) >= self.max_connections and not self._evict_idle():
                sock.close()
                continue
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = time.monotonic()
            if self.context is not None:
                try:
                    sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (ssl.SSLError, OSError):
                    sock.close()
                    continue
            conn = _Conn(sock, self.context is not None, now + self.limits.header_timeout_s, now)
            self._conns[sock.fileno()] = conn
            self._idle[conn] = None
            self._watch(conn, selectors.EVENT_READ)

    def _evict_idle(self) -> bool:
        if not self._idle:
            return False
        self._close(next(iter(self._idle)))
        return True

    def _expire(self, now: float) -> None:
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self._listener, selectors.EVENT_READ)
        while self._idle:
            oldest = next(iter(self._idle))
            if now <= oldest.deadline:
                break
            self._close(oldest)
        for conn in [c for c in self._conns.values() if c.out is not None and now > c.deadline]:
            self._close(conn)  # an answer the client does not read

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        elif events == 0:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        self._idle.pop(conn, None)
        self._watch(conn, 0)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _guarded(self, step: Callable[[_Conn], None], conn: _Conn) -> None:
        """Run `step` on `conn`; whatever goes wrong closes that connection, never the loop."""
        try:
            step(conn)
        except Exception:  # noqa: BLE001 whatever goes wrong closes that connection, never the loop
            self._close(conn)

    def _service(self, conn: _Conn, mask: int) -> None:
        try:
            if conn.handshaking:
                self._handshake(conn)
            elif conn.out is not None:
                self._send(conn)
            else:
                self._receive(conn)
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
        except Exception:  # noqa: BLE001 reset, broken pipe, a bad TLS record, or a fault here: that connection goes
            self._close(conn)

    def _handshake(self, conn: _Conn) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)
        conn.sock.do_handshake()
        conn.handshaking = False
        self._watch(conn, selectors.EVENT_READ)
        self._receive(conn)

    def _receive(self, conn: _Conn) -> None:
        while True:
            try:  # never more than the limit held: the rest waits in the kernel (TCP pushes back)
                data = conn.sock.recv(self.limits.max_request_bytes + 1 - len(conn.inbuf))
            except BlockingIOError:
                return  # wait for the rest
            if not data:
                self._close(conn)
                return
            conn.inbuf += data
            if b"\r\n\r\n" in conn.inbuf or len(conn.inbuf) > self.limits.max_request_bytes:
                break
            if not (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                return  # wait for the rest
        self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        """Hand the complete request head in `conn.inbuf` (if there is one) to a worker."""
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0 or end > self.limits.max_request_bytes:
            if len(conn.inbuf) > self.limits.max_request_bytes:
                self._answer(conn, encode(Answer(431, b"Request head too large\n", close=True), False), True)
            return
        head = bytes(conn.inbuf[:end])
        del conn.inbuf[:end + 4]
        request = parse_head(head)
        if request is None:
            self._answer(conn, encode(Answer(400, b"Bad Request\n", close=True), False), True)
            return
        # A request with a body is answered and closed: the body is never read, so never taken for a request.
        close = request.has_body or not keep_alive(request)
        answer = self.quick(request) if self.quick is not None else None
        if answer is not None:  # a scrape of an unchanged report: no thread switch, no rendering
            close = close or answer.close
            self._answer(conn, encode(Answer(answer.status, answer.body, answer.headers, close),
                                      request.method == "HEAD"), close)
            return
        conn.busy = True
        self._idle.pop(conn, None)
        self._watch(conn, 0)
        self._work.put((conn, request, close, time.monotonic()))

    def _take_answers(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                conn, data, close = self._done.get_nowait()
            except queue.Empty:
                return
            conn.busy = False
            if self._conns.get(conn.sock.fileno()) is conn:
                self._answer(conn, data, close)

    def _answer(self, conn: _Conn, data: bytes, close: bool) -> None:
        conn.out, conn.close_after = memoryview(data), close
        self._idle.pop(conn, None)
        conn.deadline = time.monotonic() + self.limits.write_timeout_s
        try:
            self._send(conn)
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
        except OSError:
            self._close(conn)

    def _send(self, conn: _Conn) -> None:
        assert conn.out is not None
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except BlockingIOError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            conn.out = conn.out[sent:]
        conn.out = None
        if conn.close_after:
            self._close(conn)
            return
        now = time.monotonic()
        conn.active, conn.deadline = now, now + self.limits.header_timeout_s
        self._idle[conn] = None
        if b"\r\n\r\n" in conn.inbuf:  # a pipelined request already read: the loop takes it next turn
            self._watch(conn, 0)
            self._pipelined.append(conn)
        else:
            self._watch(conn, selectors.EVENT_READ)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # already full (the loop will look) or closed at shutdown
            pass

    # The workers.

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, request, close, arrived = item
            try:
                answer = self.handler(request, arrived)
            except Exception:  # noqa: BLE001 a collector that fails must not take the server down
                answer = Answer(500, b"Internal Server Error\n", close=True)
            close = close or answer.close
            if close and not answer.close:
                answer = Answer(answer.status, answer.body, answer.headers, close=True)
            self._done.put((conn, encode(answer, request.method == "HEAD"), close))
            self._wake()


class MetricsHandler:
    """The exporter's pages: /metrics (with content negotiation and gzip), a link at /, 401 without the
    right credentials."""

    def __init__(self, registry: CollectorRegistry, authenticator: Authenticator,
                 generation: Callable[[], int] | None = None, ready: Callable[[float], bool] | None = None,
                 ready_wait_s: float = Limits.first_data_wait_s):
        self.renderer = Renderer(registry, generation)
        self.authenticator = authenticator
        self.ready, self.ready_wait_s = ready, ready_wait_s

    def quick(self, request: Request) -> Answer | None:
        """/metrics from the rendering of the current report, for credentials already checked; else None."""
        if request.method not in ("GET", "HEAD") or request.target.split("?", 1)[0] != "/metrics":
            return None
        if not self.authenticator.remembered(request.headers.get("authorization")):
            return None
        compress = gzip_accepted(request.headers.get("accept-encoding", ""))
        found = self.renderer.current(request.headers.get("accept", ""), compress)
        if found is None:
            return None
        return self._metrics(*found, compress)

    def _metrics(self, body: bytes, content_type: str, compress: bool) -> Answer:
        headers: tuple[tuple[str, str], ...] = (("Content-Type", content_type),)
        if compress:
            headers += (("Content-Encoding", "gzip"),)
        return Answer(200, body, headers)

    def __call__(self, request: Request, arrived: float) -> Answer:
        if request.method not in ("GET", "HEAD"):
            return Answer(405, b"Method Not Allowed\n", (("Allow", "GET, HEAD"),), close=True)
        if not self.authenticator.check(request.headers.get("authorization")):
            return Answer(401, b"Unauthorized\n", (("Content-Type", "text/plain; charset=utf-8"),
                                                   ("WWW-Authenticate", 'Basic realm="tpu-tools"')))
        path = request.target.split("?", 1)[0]
        if path == "/metrics":
            if self.ready is not None and not self.ready(arrived + self.ready_wait_s - time.monotonic()):
                return Answer(503, b"No report yet: the first round is still running\n",
                              (("Content-Type", "text/plain; charset=utf-8"), ("Retry-After", "1")))
            compress = gzip_accepted(request.headers.get("accept-encoding", ""))
            return self._metrics(*self.renderer.body(request.headers.get("accept", ""), compress, arrived), compress)
        if path == "/":
            return Answer(200, b'<html><body><a href="/metrics">metrics</a></body></html>\n',
                          (("Content-Type", "text/html"),))
        return Answer(404, b"Not Found\n", (("Content-Type", "text/plain; charset=utf-8"),))


def serve_metrics(collector: Collector, host: str, port: int, config: WebConfig | None = None,
                  limits: Limits = Limits()) -> MetricsServer:
    """Serve /metrics of `collector` (with the TLS and basic auth of `config`, if any) in daemon threads;
    RuntimeFailure when the port is taken."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    context = ssl_context(config.tls) if config is not None and config.tls is not None else None
    # A collector whose data changes only at known times (ReportCollector: once a round) says so with a
    # `generation()` method; its body is then rendered once per change, not once per scrape.
    generation = getattr(collector, "generation", None)
    # One that fills in later (ReportCollector: after the first round) says when it has data with `wait_ready`.
    ready = getattr(collector, "wait_ready", None)
    handler = MetricsHandler(registry, Authenticator(config.users if config is not None else {}),
                             generation if callable(generation) else None, ready if callable(ready) else None,
                             limits.first_data_wait_s)
    try:
        server = MetricsServer((host, port), handler, context, limits)
    except OSError as error:
        in_use = error.errno == errno.EADDRINUSE
        reason = "is already in use" if in_use else f"cannot be used ({error.strerror or error})"
        raise RuntimeFailure(f"cannot serve Prometheus metrics: port {port} on {host} {reason}") from error
    return server.start()


def serve_secure(collector: Collector, host: str, port: int, config: WebConfig) -> MetricsServer:
    """Serve /metrics with the TLS and basic auth of `config`; RuntimeFailure when the port is taken."""
    return serve_metrics(collector, host, port, config)

