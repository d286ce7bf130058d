"""The stack's readiness probes treat a slow answer as "not yet", not as a failure.

CI lost two e2e modules at setup: under load the api-server took longer than the probe's read
timeout to answer ``GET /dags/{id}`` once, and the ReadTimeout escaped ``poll`` although its
deadline was minutes away.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.airflow_stack import AirflowServices


class StallsOnce(ThreadingHTTPServer):
    """Answers the first ``GET /api/v2/dags/d`` only once released; every later one at once."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.released = threading.Event()
        self.gets = 0
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: StallsOnce

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        with self.server.lock:
            self.server.gets += 1
            first = self.server.gets == 1
        if first:
            self.server.released.wait(30)  # the client gives up long before; the test releases it
        body = json.dumps({"dag_id": "d", "is_paused": False}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the stalled answer's client is gone
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stalling_api() -> Iterator[StallsOnce]:
    server = StallsOnce()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()


def services_at(server: StallsOnce, tmp_path: Path) -> AirflowServices:
    services = AirflowServices({"AIRFLOW_HOME": str(tmp_path)}, tmp_path, server.server_address[1])
    services.probe_timeout = 0.2
    return services


def test_a_dag_probe_answered_too_slowly_reads_not_yet_parsed(stalling_api: StallsOnce, tmp_path: Path) -> None:
    services = services_at(stalling_api, tmp_path)
    assert services.dag_parsed("d") is None
    assert services.dag_parsed("d") == {"dag_id": "d", "is_paused": False}
    assert stalling_api.gets == 2


def test_waiting_for_dags_outlasts_one_slow_answer(stalling_api: StallsOnce, tmp_path: Path) -> None:
    services = services_at(stalling_api, tmp_path)
    services.wait_for_dags(["d"], timeout=20)
    assert stalling_api.gets == 2
