"""What ``metadata_prefix: auto`` chose is remembered, and asked again on schedule."""

from __future__ import annotations

from datetime import timedelta

import psycopg

from partner_harvest.store import prefix_choices


def test_a_choice_is_used_while_fresh_then_asked_again(conn: psycopg.Connection) -> None:
    assert prefix_choices.remembered(conn, "museum") is None
    prefix_choices.remember(conn, "museum", "lido")
    assert prefix_choices.remembered(conn, "museum") == "lido"
    assert prefix_choices.remembered(conn, "other") is None  # per partner
    with conn.transaction():  # the re-check interval passes
        conn.execute("UPDATE metadata_prefix_choices SET checked_at = now() - %s", (prefix_choices.RECHECK,))
    assert prefix_choices.remembered(conn, "museum") is None
    prefix_choices.remember(conn, "museum", "oai_dc")  # asked again: the new answer, checked now
    assert prefix_choices.remembered(conn, "museum", max_age=timedelta(minutes=1)) == "oai_dc"
    prefix_choices.forget(conn, "museum")  # a failed try
    assert prefix_choices.remembered(conn, "museum") is None
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # nothing left open
