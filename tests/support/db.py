"""What the aggregation database holds, read the way the tests compare it with a partner."""

from __future__ import annotations

import psycopg

from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from partner_harvest.store.db import one


def held(where: psycopg.Connection | str, partner_id: str = "museum") -> set[str]:
    """The partner's live identifiers; ``where`` is a connection (its transaction is ended,
    so the next read sees later commits) or a conninfo."""
    if isinstance(where, str):
        with connect(where) as conn:
            ensure_schema(conn)  # a DAG test's database may not have run a task yet
            return live_identifiers(conn, partner_id)
    ids = live_identifiers(where, partner_id)
    where.commit()
    return ids


def audit_row(conn: psycopg.Connection, partner_id: str, run_id: str, channel: str = "changes") -> dict:
    """A run channel's ``harvest_runs`` row as a dict."""
    cur = conn.execute("SELECT * FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel = %s",
                       (partner_id, run_id, channel))
    names = [d.name for d in cur.description or ()]
    row = dict(zip(names, one(cur)))
    conn.commit()
    return row


def check_row(conn: psycopg.Connection, run_id: str = "run-1", partner_id: str = "library",
              channel: str = "changes") -> tuple:
    """The second witness a run channel recorded (I12): kind, expected, found, ok, detail."""
    row = one(conn.execute(
        "SELECT check_kind, check_expected, check_found, check_ok, check_detail FROM harvest_runs"
        " WHERE partner_id = %s AND run_id = %s AND channel = %s", (partner_id, run_id, channel)))
    conn.commit()
    return row


def outcomes(conn: psycopg.Connection, run_id: str) -> tuple[int, int, int, int, int]:
    """What a run did to what it fetched (I6): fetched, upserted, unchanged, purged, quarantined."""
    fetched, upserted, unchanged, purged, quarantined = one(conn.execute(
        "SELECT fetched, upserted, unchanged, purged, quarantined FROM harvest_runs WHERE run_id = %s",
        (run_id,)))
    conn.commit()
    return fetched, upserted, unchanged, purged, quarantined
