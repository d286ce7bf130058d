"""What ``metadata_prefix: auto`` chose for a partner, remembered between runs (migration 0030).

A quiet night then costs Identify and one ListRecords, not a ListMetadataFormats as well;
the partner is asked again when the choice is older than :data:`RECHECK` (or by a full
harvest), so a repository that starts to offer LIDO is noticed within that time.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

RECHECK = timedelta(days=7)


def remembered(conn: psycopg.Connection, partner_id: str, max_age: timedelta = RECHECK) -> str | None:
    """The remembered choice when it was checked less than ``max_age`` ago, else None."""
    row = conn.execute(
        "SELECT metadata_prefix FROM metadata_prefix_choices WHERE partner_id = %s AND checked_at > now() - %s",
        (partner_id, max_age),
    ).fetchone()
    conn.commit()  # no transaction left open on a connection the run goes on using
    return str(row[0]) if row else None


def remember(conn: psycopg.Connection, partner_id: str, prefix: str) -> None:
    """Record that the partner was asked just now and what was chosen."""
    conn.commit()
    with conn.transaction():
        conn.execute(
            "INSERT INTO metadata_prefix_choices (partner_id, metadata_prefix, checked_at) VALUES (%s, %s, now()) "
            "ON CONFLICT (partner_id) DO UPDATE SET metadata_prefix = EXCLUDED.metadata_prefix, checked_at = now()",
            (partner_id, prefix),
        )


def forget(conn: psycopg.Connection, partner_id: str) -> None:
    """A failed try: the next run asks again (the partner may have stopped offering the prefix)."""
    conn.commit()
    with conn.transaction():
        conn.execute("DELETE FROM metadata_prefix_choices WHERE partner_id = %s", (partner_id,))
