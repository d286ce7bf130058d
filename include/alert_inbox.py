"""Where the local UI's alerts land: a webhook receiver on loopback that a person can read.

The local Airflow (scripts/airflow_ui.py) points its ``harvest_alerts_webhook`` Connection
here. Every alert is appended to a text file (``<AIRFLOW_HOME>/alerts.log``: subject and
lines, newest last) and listed, newest first, on the page this server serves
(``http://127.0.0.1:<port>/``). Nothing leaves the machine; the demo only, never a deployment.
"""

from __future__ import annotations

import html
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_BODY = 1 << 20  # an alert is a few lines


class AlertInbox:
    """``with AlertInbox(path, port) as inbox:`` serves until the block ends; ``inbox.url`` receives."""

    def __init__(self, log_file: Path, port: int = 0) -> None:
        self.log_file = log_file
        self._lock = threading.Lock()
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                inbox.add(str(body.get("text") or body))
                self.send_response(204)
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                page = inbox.page().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: object) -> None:  # the requests are the alerts themselves
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, text: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        with self._lock, self.log_file.open("a", encoding="utf-8") as out:
            out.write(f"=== {stamp}\n{text.rstrip()}\n\n")

    def alerts(self) -> list[str]:
        if not self.log_file.exists():
            return []
        return [block.strip() for block in self.log_file.read_text(encoding="utf-8").split("=== ") if block.strip()]

    def page(self) -> str:
        items = "".join(f"<li><pre>{html.escape(a)}</pre></li>" for a in reversed(self.alerts()))
        return ("<!doctype html><meta charset=utf-8><title>Partner harvest alerts</title>"
                "<meta http-equiv=refresh content=10>"
                f"<h1>Alerts of the local Airflow</h1><p>{len(self.alerts())} alert(s), newest first; also in "
                f"<code>{html.escape(str(self.log_file))}</code>.</p><ol id=alerts>{items or '<li>none yet</li>'}</ol>")

    def __enter__(self) -> AlertInbox:
        threading.Thread(target=self._server.serve_forever, name="alert-inbox", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
