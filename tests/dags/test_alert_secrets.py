"""Alert channels never put a credential in a log line: a webhook URL is one."""

from __future__ import annotations

import json
import logging

import pytest

from partner_harvest.airflow.notifiers import send_alert
from tests.support.airflow_stack import free_loopback_port as closed_port  # nothing listens there
from tests.support.webhook import TOKEN, Sink

pytestmark = pytest.mark.airflow


@pytest.mark.parametrize("case", ["http 404", "connection refused"])
def test_a_failing_webhook_is_logged_without_its_url(case: str, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink(status=404) if case == "http 404" else None
    url = sink.url if sink else f"http://127.0.0.1:{closed_port()}/hooks/T0/B0/{TOKEN}"
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": url}))
    try:
        with caplog.at_level(logging.INFO):  # Airflow's default logging_level
            sent = send_alert("[partner harvest] p: failed", ["Partner: p"], {"partner": "p"})
    finally:
        if sink:
            sink.close()
    assert sent == []
    failures = [r.getMessage() for r in caplog.records if "could not send the webhook alert" in r.getMessage()]
    assert failures and ("HTTP 404" in failures[0] if sink else "unreachable" in failures[0])
    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    assert TOKEN not in logged and "/hooks/" not in logged


def test_overdue_alert_only_for_a_run_still_unfinished(monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest.airflow.notifiers import run_overdue_alert

    sink = Sink()
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": sink.url}))
    try:
        kwargs = {"partner_id": "p", "dag_id": "harvest_p", "pool": "partner_p", "run_deadline": "20:00:00"}
        assert run_overdue_alert(**kwargs, context={"dag_run": {"dag_run_id": "r1", "state": "failed"}}) == []
        assert run_overdue_alert(**kwargs, context={"dag_run": {"dag_run_id": "r2", "state": "queued"}}) == ["webhook"]
        # A backfill's day: queued after its deadline (logical date + run_deadline) had passed.
        backfill = {"dag_run": {"dag_run_id": "r3", "state": "queued", "queued_at": "2026-03-05T10:00:00Z"},
                    "deadline": {"deadline_time": "2026-03-02T22:00:00Z"}}
        assert run_overdue_alert(**kwargs, context=backfill) == []
    finally:
        sink.close()
    assert [b["harvest"]["run_id"] for b in sink.bodies] == ["r2"]
