"""One alert for an outage shared by many partners, across worker processes.

Twelve partners on one endpoint host fail with the same error at once, each in its own
process (what twelve Airflow task processes' notifiers do): one alert goes out at once,
the rest fold into the group. When the window ends, four processes race to send the
digest: exactly one digest reaches the webhook and the SMTP sinks, naming the other eleven.
A partner on another host alerts on its own; the fenced claim is checked on its own.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from partner_harvest.airflow import alert_digest, notifiers
from partner_harvest.store import connect
from partner_harvest.store.alert_digest import claim_due, mark_sent, record_failure, still_held
from tests.support.smtp_sink import SmtpSink
from tests.support.webhook import WebhookSink

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

pytestmark = pytest.mark.slow
HOST = "shared-host.example.org"


def _fields(partner: str) -> dict:
    return {"kind": "failure", "partner": partner, "dag_id": f"harvest_{partner}", "task_id": "freeze_window",
            "try_number": 3, "run_id": "scheduled__night", "window": "not frozen yet",
            "cause": f"HTTPSConnectionPool(host='{HOST}'): connection refused", "log_url": None}


def _fail(db: str, partner: str, host: str, barrier: Barrier, results: Queue[Any]) -> None:
    """One task process's notifier: the alert of a failure of ``partner``."""
    barrier.wait()
    fields = _fields(partner)
    sent = alert_digest.alert_failure(fields, f"[partner harvest] {partner}: harvest_{partner}.freeze_window failed (try 3)",
                         [f"Partner: {partner}", f"Cause: {fields['cause']}"], host=host, error_type="ConnectionError",
                         send=notifiers.send_alert, connect=lambda: connect(db))
    results.put((partner, sent))


def _flush(db: str, barrier: Barrier, results: Queue[Any]) -> None:
    barrier.wait()
    with connect(db) as conn:
        results.put(alert_digest.flush_digests(conn, notifiers.send_alert))


def _guarded(target: Callable[..., None], *args: Any) -> None:
    import faulthandler
    import sys

    faulthandler.dump_traceback_later(100, exit=True, file=sys.stderr)
    try:
        target(*args)
    except BaseException as exc:  # the parent reports it (a child's traceback is otherwise lost)
        args[-1].put(("crashed", f"{type(exc).__name__}: {exc}"))
        raise


def _race(target: Callable[..., None], args_list: list[tuple[Any, ...]]) -> list[Any]:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(len(args_list)), ctx.Queue()
    procs = [ctx.Process(target=_guarded, args=(target, *args, barrier, results)) for args in args_list]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


@pytest.fixture
def sinks(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[WebhookSink, SmtpSink]]:
    webhook = WebhookSink()
    with SmtpSink() as smtp:
        monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
        monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_SMTP", json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": smtp.port,
            "extra": {"to": "ops@example.org", "from_email": "harvest@example.org", "disable_tls": True,
                      "disable_ssl": True}}))
        monkeypatch.setenv("HARVEST_ALERT_DIGEST_MINUTES", "10")
        # The forked workers inherit Airflow imported and its secrets backends loaded, as
        # task processes have them: importing Airflow twelve times over is not the test.
        from airflow.providers.smtp.hooks.smtp import SmtpHook  # noqa: F401

        assert notifiers._connection(notifiers.WEBHOOK_CONN_ID) is not None
        assert alert_digest.fold_window() == timedelta(minutes=10)
        yield webhook, smtp
    webhook.close()


def test_a_shared_outage_sends_one_alert_then_one_digest_naming_the_rest(conn: psycopg.Connection, db: str,
                                                                        sinks: tuple[WebhookSink, SmtpSink]) -> None:
    webhook, smtp = sinks
    partners = [f"p{i:02d}" for i in range(12)]
    sent = dict(_race(_fail, [(db, p, HOST) for p in partners]))
    alerted = [p for p, channels in sent.items() if channels]
    assert len(alerted) == 1 and sorted(sent[alerted[0]]) == ["email", "webhook"]
    assert [b["harvest"]["partner"] for b in webhook.bodies] == alerted
    assert "come in one digest" in webhook.bodies[0]["text"]

    _race(_fail, [(db, "elsewhere", "other-host.example.net")])  # another host: its own alert
    assert [b["harvest"]["partner"] for b in webhook.bodies] == [*alerted, "elsewhere"]
    assert _race(_flush, [(db,)] * 2) == [0, 0]  # the window has not ended: no digest yet

    conn.execute("UPDATE alert_groups SET fold_until = now()")  # the fold window ends
    conn.commit()
    assert sorted(_race(_flush, [(db,)] * 4)) == [0, 0, 0, 1]  # four processes race: one sends
    digests = [b["harvest"] for b in webhook.bodies if b["harvest"]["kind"] == "digest"]
    assert len(digests) == 1
    (digest,) = digests
    assert digest["first_partner"] == alerted[0]
    assert sorted(digest["partners"]) == sorted(set(partners) - set(alerted))
    assert digest["group_key"] == f"{HOST}|ConnectionError"
    mails = [m for m in smtp.messages if "more partner(s) failed like" in m.subject]
    assert len(mails) == 1 and "11 more partner(s)" in mails[0].subject
    assert all(p in mails[0].body for p in digest["partners"])
    assert _race(_flush, [(db,)]) == [0]  # sent once; the lone "elsewhere" group settles without a digest
    assert conn.execute("SELECT count(*) FROM alert_groups WHERE closed_at IS NULL").fetchone() == (0,)


def test_the_digest_claim_is_fenced(conn: psycopg.Connection) -> None:
    for partner in ("a", "b", "c"):
        record_failure(conn, "h|E", partner, {"partner": partner}, timedelta(minutes=5))
    again = record_failure(conn, "h|E", "a", {"partner": "a"}, timedelta(minutes=5))
    assert again.first  # the opening partner's own next failure alerts as before
    conn.execute("UPDATE alert_groups SET fold_until = now()")
    conn.commit()
    (first,) = claim_due(conn, "worker-1")
    assert [m["partner"] for m in first.members] == ["b", "c"]
    assert claim_due(conn, "worker-2") == []  # claimed: nobody else
    conn.execute("UPDATE alert_groups SET claim_until = now()")  # worker-1 stalls past its claim
    conn.commit()
    (second,) = claim_due(conn, "worker-2")
    assert second.epoch == first.epoch + 1
    assert not still_held(conn, first) and not mark_sent(conn, first)  # the old holder may not settle it
    assert still_held(conn, second) and mark_sent(conn, second)
    assert claim_due(conn, "worker-3") == []
