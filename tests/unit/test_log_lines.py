"""Log lines an operator reads: the retry counter, one line per retry, the frozen window."""

from __future__ import annotations

import logging
import re
import socket
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from partner_harvest.transport import HttpPolicy, build_session
from partner_harvest.window import Window


class FlakyServer:
    """Loopback server answering 503 to the first ``failures`` requests, then 200."""

    def __init__(self, failures: int) -> None:
        self.left = failures
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                failing = server.left > 0
                server.left -= 1
                body = b"busy" if failing else b"ok"
                self.send_response(503 if failing else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/oai"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "retr" in r.getMessage().lower()]


def test_retry_counter_counts_up_to_the_configured_retries(caplog: pytest.LogCaptureFixture) -> None:
    server = FlakyServer(failures=3)
    session = build_session("p", HttpPolicy(retries=3, backoff_factor=0.001, backoff_max=0.01))
    try:
        with caplog.at_level(logging.INFO):
            assert session.get(server.url).status_code == 200
    finally:
        server.close()
    counters = [found.groups() for line in retry_lines(caplog) if (found := re.search(r"retry (\d+) of (\S+) in", line))]
    assert counters == [("1", "3"), ("2", "3"), ("3", "3")]  # was "retry 2 of 2", "retry 3 of 1"


def test_each_connection_retry_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    session = build_session("p", HttpPolicy(retries=2, backoff_factor=0.001, backoff_max=0.01))
    with caplog.at_level(logging.INFO), pytest.raises(requests.ConnectionError):
        session.get(f"http://127.0.0.1:{port}/oai")
    lines = retry_lines(caplog)
    assert len(lines) == 2, lines  # urllib3's own "Retrying (...)" line doubled each one
    assert all(line.startswith("p: GET /oai failed (NewConnectionError") for line in lines)


def test_a_requested_window_is_not_a_window_window() -> None:
    until = datetime(2026, 1, 2, tzinfo=timezone.utc)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert Window("window", start, until, "seconds", False).describe() == \
        "requested window from 2026-01-01T00:00:00Z until 2026-01-02T00:00:00Z (seconds)"
    assert Window("full", None, until, "day", False).describe().startswith("full window from the beginning")
