"""A loopback webhook that keeps every JSON body POSTed to it: where alerts are read back."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A Slack-shaped URL path whose last part is a secret: what must never reach a log line.
TOKEN = "s3cr3t-token"
SECRET_PATH = f"/hooks/T0/B0/{TOKEN}"


class WebhookSink:
    """Keeps each JSON body in ``bodies``; answers ``status``; listens at ``url`` (``path`` on 127.0.0.1)."""

    def __init__(self, status: int = 200, path: str = "/hooks/alerts") -> None:
        self.bodies: list[dict] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def Sink(status: int = 200) -> WebhookSink:  # noqa: N802 (the tests' name for the secret-URL sink)
    """The sink at a URL whose path ends in a secret token."""
    return WebhookSink(status, SECRET_PATH)
