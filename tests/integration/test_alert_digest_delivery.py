"""A digest is settled only once a channel delivered it (the module's "at least once")."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
import pytest

from partner_harvest.airflow import alert_digest, notifiers
from partner_harvest.store.alert_digest import record_failure
from tests.support.webhook import WebhookSink


def _due_group(conn: psycopg.Connection) -> None:
    for partner in ("a", "b", "c"):
        record_failure(conn, "h.example.org|ConnectionError", partner, {"partner": partner}, timedelta(minutes=5))
    conn.execute("UPDATE alert_groups SET fold_until = now()")
    conn.commit()


def _webhook(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": url}))


def test_a_digest_no_channel_delivered_stays_due_and_goes_out_once_one_does(conn: psycopg.Connection,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _due_group(conn)
    down = WebhookSink(status=503)  # the webhook is down at that moment
    _webhook(monkeypatch, down.url)
    try:
        assert alert_digest.flush_digests(conn, notifiers.send_alert) == 0
        assert len(down.bodies) == 1
    finally:
        down.close()
    assert conn.execute("SELECT count(*) FROM alert_groups WHERE digest_sent_at IS NULL").fetchone() == (1,), \
        "the digest was marked sent although no channel delivered it"
    conn.execute("UPDATE alert_groups SET claim_until = now()")  # its claim runs out: the next flush sends it
    conn.commit()
    up = WebhookSink()
    _webhook(monkeypatch, up.url)
    try:
        assert alert_digest.flush_digests(conn, notifiers.send_alert) == 1
    finally:
        up.close()
    assert [body["harvest"]["kind"] for body in up.bodies] == ["digest"]
    assert conn.execute("SELECT count(*) FROM alert_groups WHERE closed_at IS NULL").fetchone() == (0,)


def test_without_any_channel_the_logged_digest_is_all_there_is(conn: psycopg.Connection,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SMTP", "WEBHOOK", "APPRISE"):
        monkeypatch.delenv(f"AIRFLOW_CONN_HARVEST_ALERTS_{name}", raising=False)
    _due_group(conn)
    assert alert_digest.flush_digests(conn, notifiers.send_alert) == 1
    assert conn.execute("SELECT count(*) FROM alert_groups WHERE closed_at IS NULL").fetchone() == (0,)
