"""A StatsD listener on loopback for the metrics tests, and Airflow's Stats of this process
sent to it (for ``dag.test()`` runs in the test's own process)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


class StatsdListener:
    """A StatsD server on loopback: keeps every datagram (``name:value|type`` lines)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self.port = self.sock.getsockname()[1]

    def lines(self) -> list[str]:
        """Everything received so far (the sender has sent it: loopback datagrams are queued)."""
        self.sock.setblocking(False)
        got: list[str] = []
        while True:
            try:
                got.extend(self.sock.recv(65536).decode().splitlines())
            except BlockingIOError:
                return got

    def close(self) -> None:
        self.sock.close()


def parse(lines: list[str], prefix: str) -> dict[str, list[tuple[float, str]]]:
    """``{name without prefix: [(value, type), ...]}`` of the lines whose name starts with ``prefix``."""
    out: dict[str, list[tuple[float, str]]] = {}
    for line in lines:
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        if name.startswith(prefix):
            out.setdefault(name[len(prefix):], []).append((float(value), kind.split("|")[0]))
    return out


@contextmanager
def stats_sent_to(listener: StatsdListener, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Airflow's Stats in this process to ``listener`` (prefix ``airflow``), as a deployment's
    ``[metrics] statsd_on`` does in each task process; the earlier backend afterwards."""
    from airflow.sdk._shared.observability.metrics import stats as backend
    from airflow.sdk.observability.metrics import statsd_logger

    for key, value in (("STATSD_ON", "True"), ("STATSD_HOST", "127.0.0.1"), ("STATSD_PORT", str(listener.port)),
                       ("STATSD_PREFIX", "airflow")):
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    factory, legacy = backend._factory, backend._export_legacy_names
    # Airflow's own pairing: its statsd factory for its initialize, whose annotation names a
    # StatsLogger protocol Airflow's SafeStatsdLogger does not declare (Airflow 3.3's typing).
    backend.initialize(factory=statsd_logger.get_statsd_logger, export_legacy_names=False)  # type: ignore[arg-type]
    try:
        yield
    finally:
        if factory is None:
            from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

            factory = NoStatsLogger
        backend.initialize(factory=factory, export_legacy_names=legacy)
