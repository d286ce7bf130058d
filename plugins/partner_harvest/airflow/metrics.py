"""Sending the run's metrics (``partner_harvest.metrics``) through Airflow's own Stats.

Airflow decides where they go (``[metrics] statsd_on``, ``statsd_host``..., Datadog or
OpenTelemetry) and drops them when no backend is configured; a metric that cannot be sent
never fails a task. The names and their meaning: docs/operator/metrics.md (generated).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone

from airflow.sdk.observability import stats
from requests import Response

from partner_harvest.metrics import APPLY_COUNTS, metric

log = logging.getLogger(__name__)


def _send(kind: str, key: str, partner_id: str, value: float) -> None:
    m = metric(key)
    assert m.kind == kind, f"{key} is a {m.kind}"
    tags = {"partner_id": partner_id}
    try:
        if kind == "counter":
            stats.incr(m.name(partner_id), int(value), tags=tags)
        elif kind == "gauge":
            stats.gauge(m.name(partner_id), value, tags=tags)
        else:
            stats.timing(m.name(partner_id), value, tags=tags)
    except Exception as exc:  # a metrics backend never fails a harvest
        log.warning("%s: metric %s not sent: %s", partner_id, m.name(partner_id), exc)


def count(key: str, partner_id: str, value: int) -> None:
    _send("counter", key, partner_id, value)


def gauge(key: str, partner_id: str, value: float) -> None:
    _send("gauge", key, partner_id, value)


def timing(key: str, partner_id: str, milliseconds: float) -> None:
    _send("timer", key, partner_id, milliseconds)


@dataclass
class Traffic:
    """What the running task received from its partner: fed by the session's response hook
    (``factory.build_adapter(on_response=...)``), sent when the task body ends."""

    requests: int = 0
    response_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, response: Response) -> None:
        """The body is read already (transport.PartnerAdapter); a pipelined page's fetch runs in a thread."""
        size = len(response.content or b"")
        with self._lock:
            self.requests += 1
            self.response_bytes += size

    def send(self, partner_id: str) -> None:
        with self._lock:
            done, size = self.requests, self.response_bytes
            self.requests = self.response_bytes = 0
        if done:
            count("requests", partner_id, done)
            count("response_bytes", partner_id, size)


TRAFFIC = Traffic()  # one task runs per process (dag.test() runs them one after another)


def send_apply(partner_id: str, applied: dict[str, int], warnings: dict[str, int], started: datetime | None) -> None:
    """The applied run's figures: its counts, its warnings, its duration."""
    for key in APPLY_COUNTS:
        count(key, partner_id, int(applied.get(key, 0)))
    count("warnings", partner_id, sum(warnings.values()))
    count("runs_applied", partner_id, 1)
    if started is not None:
        timing("run_seconds", partner_id, (datetime.now(timezone.utc) - started).total_seconds() * 1000)


def send_cursor_lag(partner_id: str, until: datetime | None) -> None:
    if until is not None:
        gauge("cursor_lag_seconds", partner_id, max(0.0, (datetime.now(timezone.utc) - until).total_seconds()))
