"""Failure alerts folded by cause: the first failure of an outage alerts at once, the
partners failing the same way in the next minutes arrive in one digest.

The key is the failing partner's endpoint host and the error's type, so fifty partners
hosted on one platform that goes down make one alert and one digest, not fifty alerts;
two partners failing for different reasons still alert separately. The groups live in the
aggregation database (``store.alert_digest``), so every worker process folds into the same
group and one of them, holding a fenced claim, sends the digest. The digest goes out when
the fold window (``HARVEST_ALERT_DIGEST_MINUTES``, default 15; 0 turns folding off) has
ended: sent by the next failure's notifier, or by the ``partner_alert_digest`` DAG every
few minutes. When the database cannot be reached the alert is sent on its own: folding
never loses an alert.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from partner_harvest.report import endpoint_host

log = logging.getLogger(__name__)

DIGEST_MINUTES_ENV = "HARVEST_ALERT_DIGEST_MINUTES"
DEFAULT_MINUTES = 15
DIGEST_DAG_ID = "partner_alert_digest"
DIGEST_SCHEDULE = "*/5 * * * *"


def fold_window() -> timedelta:
    try:
        minutes = float(os.environ.get(DIGEST_MINUTES_ENV, DEFAULT_MINUTES))
    except ValueError:
        minutes = DEFAULT_MINUTES
    return timedelta(minutes=max(0.0, minutes))


def holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def partner_host(conn_id: str | None) -> str:
    """The host of the partner's endpoint (its Connection's host only), or 'unknown host'."""
    if not conn_id:
        return "no endpoint"
    try:
        from partner_harvest.airflow.connections import partner_endpoint

        return endpoint_host(partner_endpoint(conn_id).base_url) or "unknown host"
    except Exception:  # a missing Connection is itself the failure; it groups under its own key
        return "unknown host"


def group_key(host: str, error_type: str) -> str:
    return f"{host}|{error_type}"


def _aggregation() -> Any:
    from partner_harvest.airflow.connections import aggregation_conninfo
    from partner_harvest.store import connect, ensure_schema

    conn = connect(aggregation_conninfo())
    ensure_schema(conn)
    return conn


def alert_failure(fields: dict[str, Any], subject: str, lines: list[str], *, host: str, error_type: str,
                  send: Callable[..., list[str]], connect: Callable[[], Any] = _aggregation) -> list[str]:
    """Alert now when this failure opens its group, else fold it into the group's digest;
    then send the digests that are due. Returns the channels the immediate alert went to."""
    from partner_harvest.store.alert_digest import record_failure

    window = fold_window()
    if window <= timedelta(0):
        return send(subject, lines, fields)
    key = group_key(host, error_type)
    try:
        conn = connect()
    except Exception as exc:  # the database may be the outage: alert without folding
        log.warning("alert folding unavailable (%s); sending the alert on its own", type(exc).__name__)
        return send(subject, lines, fields)
    with conn:
        try:
            recorded = record_failure(conn, key, fields["partner"], {**fields, "host": host,
                                                                    "error_type": error_type}, window)
        except Exception as exc:
            log.warning("alert folding failed (%s); sending the alert on its own", type(exc).__name__)
            return send(subject, lines, fields)
        sent: list[str] = []
        if recorded.first:
            note = (f"Partners failing the same way ({error_type} at {host}) in the next "
                    f"{_minutes(window)} come in one digest, not one alert each.")
            sent = send(subject, [*lines, note], {**fields, "group_key": key})
        else:
            log.warning("ALERT folded: %s fails like %s (%s); it will be named in the digest",
                        fields["partner"], recorded.first_partner, key)
        flush_digests(conn, send)
    return sent


def _minutes(window: timedelta) -> str:
    minutes = window.total_seconds() / 60
    return f"{minutes:g} minute{'s' if minutes != 1 else ''}"


def flush_digests(conn: Any, send: Callable[..., list[str]], who: str | None = None) -> int:
    """Send every digest that is due and not claimed by another process; how many went out. A
    digest no configured channel delivered is not settled: the next flush after its claim
    runs out sends it again."""
    from partner_harvest.store.alert_digest import claim_due, mark_sent, still_held

    sent = 0
    for claim in claim_due(conn, who or holder()):
        if not claim.members or not still_held(conn, claim):
            continue
        host, _, error_type = claim.group_key.partition("|")
        partners = [m["partner"] for m in claim.members]
        subject = (f"[partner harvest] {len(partners)} more partner(s) failed like {claim.first_partner}: "
                   f"{error_type} at {host}")
        lines = [f"Partners: {', '.join(partners)}",
                 f"Same cause as {claim.first_partner}'s alert (opened {claim.opened_at:%Y-%m-%d %H:%M}Z): "
                 f"{error_type} at {host}"]
        lines += [f"{m['partner']}: {m.get('dag_id')}.{m.get('task_id')} try {m.get('try_number')} "
                  f"run {m.get('run_id')}: {m.get('cause')} (log: {m.get('log_url')})" for m in claim.members]
        fields = {"kind": "digest", "group_key": claim.group_key, "first_partner": claim.first_partner,
                  "partners": partners, "failures": claim.members}
        if not send(subject, lines, fields) and _has_channels():
            log.error("digest %s: no alert channel delivered it; it stays due and goes out again once its "
                      "claim runs out (at least once)", claim.group_key)
            continue
        if mark_sent(conn, claim):
            sent += 1
        else:
            log.warning("digest %s: another process took the claim over while this one sent", claim.group_key)
    return sent


def _has_channels() -> bool:
    """Whether an alert channel is configured: without one, the logged ALERT line is the delivery."""
    from partner_harvest.airflow import notifiers

    return any(notifiers._connection(conn_id) is not None
               for conn_id in (notifiers.SMTP_CONN_ID, notifiers.WEBHOOK_CONN_ID, notifiers.APPRISE_CONN_ID))


def flush_task() -> int:
    """The ``partner_alert_digest`` DAG's task: the digests whose window ended with no failure since."""
    from partner_harvest.airflow.notifiers import send_alert

    with _aggregation() as conn:
        count = flush_digests(conn, send_alert)
    log.info("%d digest(s) sent", count)
    return count


def build_digest_dag() -> Any:
    """A small DAG that sends the due digests (one task, every five minutes, no catch-up)."""
    from datetime import datetime, timezone

    from airflow.sdk import DAG, task

    with DAG(DIGEST_DAG_ID, schedule=DIGEST_SCHEDULE, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
             catchup=False, max_active_runs=1, tags=["partner-harvest"],
             doc_md="Sends the failure digests whose fold window ended (docs/operator/alerts.md).") as dag:
        task(task_id="send_due_digests", retries=1)(flush_task)()
    return dag
