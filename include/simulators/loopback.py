"""A quiet, threaded HTTP server on loopback: the plumbing every partner simulator needs.

A simulator subclasses `LoopbackServer` (lifecycle, request log, error record)
and `LoopbackHandler` (its routes and how it writes a response), so what stays
in the simulator is its protocol. Stopping is clean: keep-alive handler threads
blocked on a read are woken, so tests never wait for idle connections.

What real servers do to idle connections is here too, for every simulator:
``keep_alive_timeout`` closes a keep-alive connection that waited that long for its
next request (Apache's ``KeepAliveTimeout``, 5 s by default) and announces it in a
``Keep-Alive: timeout=N`` header; ``keep_alive_max`` closes one after that many
responses. ``close_idle_connections()`` does at once what the timeout does, so a
test drives it at the moment it chooses instead of sleeping past the timeout.
"""

from __future__ import annotations

import math
import socket
import ssl
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import SplitResult, urlsplit

TEXT_TYPE = "text/plain; charset=utf-8"


@dataclass
class Response:
    """One HTTP answer, built without HTTP so tests can call a simulator directly.

    With `stream`, the body is those chunks instead, written as they come and ended by
    closing the connection (an endless body is an endless iterable); `pause` waits
    before each chunk (a slow drip), and `drip_head` drips the status line and headers
    too, one byte per pause. Simulators send it with `LoopbackHandler._send_stream`.
    """

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterable[bytes] | None = None
    pause: float = 0.0
    drip_head: bool = False


def status_phrase(status: int) -> str:
    """The reason phrase of `status`; "Error" for codes `HTTPStatus` does not know."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def query_log_form(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Request-log form: name -> value, or a list of values when repeated."""
    query: dict[str, Any] = {}
    for key, value in pairs:
        if key in query:
            previous = query[key]
            query[key] = previous + [value] if isinstance(previous, list) else [previous, value]
        else:
            query[key] = value
    return query


class LoopbackServer:
    """Serve `handler` on loopback from a daemon thread; use as a context manager.

    Tests assert on ``requests`` (the simulator's own request log) and ``errors``
    (unexpected server-side exceptions, which should stay empty).
    """

    _base_path = ""  # base_url is http://host:port followed by this
    _thread_prefix = "loopback-server"

    def __init__(self, host: str, port: int, handler: type[LoopbackHandler], *,
                 tls: ssl.SSLContext | None = None, keep_alive_timeout: float | None = None,
                 keep_alive_max: int | None = None) -> None:
        self.host = host
        self.tls = tls  # serve HTTPS with this server-side context (tests of a partner's own CA)
        # Idle keep-alive connections close after this many wall-clock seconds (None: never),
        # and any connection after this many responses (None: no limit); see the module doc.
        self.keep_alive_timeout = keep_alive_timeout
        self.keep_alive_max = keep_alive_max
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []  # unexpected server-side exceptions (should stay empty)
        self._requested_port = port
        self._handler = handler
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # set by stop(): releases handlers that wait on purpose
        self._httpd: QuietServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._idle: set[socket.socket] = set()  # connections waiting for their next request
        self._busy: set[socket.socket] = set()  # connections answering a request
        self._answering = threading.Condition(self._lock)
        self.idle_closed = 0  # idle connections closed, by the timeout or close_idle_connections()

    def start(self) -> Self:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = QuietServer((self.host, self._requested_port), self._handler)
        self._httpd.sim = self
        if self.tls is not None:  # handshake in the handler thread, so a bad client blocks no one
            self._httpd.socket = self.tls.wrap_socket(self._httpd.socket, server_side=True,
                                                      do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{self._thread_prefix}-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # wake keep-alive handler threads blocked on read
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("simulator is not running")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}{self._base_path}"

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    def close_idle_connections(self) -> int:
        """Close every keep-alive connection waiting for its next request now, as the server
        does when ``keep_alive_timeout`` passes; returns how many. The client's next request
        on one of them meets a connection its server has closed."""
        with self._answering:  # a response being written (the client may hold it already) ends first
            self._answering.wait_for(lambda: not self._busy, timeout=5)
            idle = list(self._idle)
            self._idle.clear()
            self.idle_closed += len(idle)
        for conn in idle:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(idle)

    def _track(self, conn: socket.socket, opened: bool) -> None:
        with self._lock:
            (self._connections.add if opened else self._connections.discard)(conn)
            if not opened:
                self._idle.discard(conn)
                self._busy.discard(conn)
                self._answering.notify_all()

    def _mark(self, conn: socket.socket, state: str) -> None:
        """``conn`` is "busy" answering a request, "idle" waiting for the next, or "done"."""
        with self._lock:
            (self._busy.add if state == "busy" else self._busy.discard)(conn)
            (self._idle.add if state == "idle" else self._idle.discard)(conn)
            self._answering.notify_all()

    def _record_error(self, exc: BaseException) -> None:
        with self._lock:
            self.errors.append(f"{type(exc).__name__}: {exc}")


class QuietServer(ThreadingHTTPServer):
    """Daemon handler threads, and no tracebacks on stderr: errors go to ``sim.errors``."""

    daemon_threads = True
    sim: LoopbackServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet: dropped connections are normal, anything else goes to sim.errors."""
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError)):
            self.sim._record_error(exc)


class LoopbackHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 handler; subclasses supply `_respond` and `_send`.

    GET passes no body, POST passes the request body; a simulator bug becomes a
    500 (and an entry in ``sim.errors``) rather than a hung client.
    """

    protocol_version = "HTTP/1.1"
    sys_version = ""
    disable_nagle_algorithm = True  # avoid 40 ms delayed-ACK stalls on keep-alive
    server: QuietServer

    @property
    def sim(self) -> LoopbackServer:
        return self.server.sim

    def setup(self) -> None:
        super().setup()
        self.served_on_connection = 0
        self.server.sim._track(self.connection, True)

    def handle_one_request(self) -> None:
        """Wait for the next request at most ``keep_alive_timeout`` (once one was served)."""
        sim = self.sim
        if self.served_on_connection:
            self.connection.settimeout(sim.keep_alive_timeout)
        try:
            super().handle_one_request()  # a timeout while idle: "Request timed out" (log_error), closed
        finally:
            sim._mark(self.connection, "idle" if self.served_on_connection and not self.close_connection else "done")

    def parse_request(self) -> bool:
        """The request line came: busy until answered; the answer is not bound by the idle timeout."""
        self.sim._mark(self.connection, "busy")
        self.connection.settimeout(None)
        return super().parse_request()

    def log_error(self, format: str, *args: Any) -> None:
        """An idle connection timed out (http.server's "Request timed out"): closed as idle."""
        if format.startswith("Request timed out"):
            with self.sim._lock:
                self.sim.idle_closed += 1

    def end_headers(self) -> None:
        """Every response says how long its connection may idle, or that it closes."""
        sim = self.sim
        self.served_on_connection += 1
        left = None if sim.keep_alive_max is None else sim.keep_alive_max - self.served_on_connection + 1
        if left is not None and left <= 0:
            self.send_header("Connection", "close")
        elif sim.keep_alive_timeout is not None and not self.close_connection:
            limit = f", max={left}" if left is not None else ""  # counting down, as Apache's
            self.send_header("Keep-Alive", f"timeout={math.ceil(sim.keep_alive_timeout)}{limit}")
        super().end_headers()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.sim._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        """No per-request logging; the simulator keeps its own request log."""

    def do_GET(self) -> None:
        self._dispatch(None)

    def do_POST(self) -> None:
        self._dispatch(self._read_body())

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self, body: bytes | None) -> None:
        url = urlsplit(self.path)
        try:
            response = self._respond(url, body)
        except Exception as exc:  # a simulator bug must not hang the client
            self.server.sim._record_error(exc)
            response = Response(500, f"simulator error: {exc}\n".encode(), TEXT_TYPE)
        if response is not None:
            self._send(response)

    def _respond(self, url: SplitResult, body: bytes | None) -> Response | None:
        """The answer to this request, or None when nothing is to be written."""
        raise NotImplementedError

    def _send(self, response: Response) -> None:
        raise NotImplementedError

    def _send_stream(self, response: Response) -> None:
        """Write a streamed (possibly endless, possibly dripping) response until the
        chunks run out, the client hangs up or the simulator stops."""
        assert response.stream is not None
        self.close_connection = True
        lines = [f"HTTP/1.1 {response.status} {status_phrase(response.status)}",
                 f"Content-Type: {response.content_type}", "Connection: close",
                 *(f"{name}: {value}" for name, value in response.headers.items())]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        stopping = self.sim._stopping
        try:
            if response.drip_head:
                for i in range(len(head)):
                    if stopping.wait(response.pause):
                        return
                    self.wfile.write(head[i:i + 1])
            else:
                self.wfile.write(head)
            for chunk in response.stream:
                if stopping.wait(response.pause) if response.pause else stopping.is_set():
                    return
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what a hostile server hopes for
