"""Operator actions on the aggregation that are not part of a harvest run."""

from __future__ import annotations

import psycopg
from psycopg import sql

from partner_harvest.store.apply import lock_partner_writes
from partner_harvest.store.attached import ENTITIES
from partner_harvest.store.feed import mark_applied
from partner_harvest.store.fences import bump_epoch

# What `forget` removes. `deletions` stays: it is the change feed's history, and forget
# adds to it (a consumer behind may not have read the older deletions yet).
_PARTNER_TABLES = (
    "records", "quarantine", "harvest_runs", "staging", "partner_leases", "reconcile_ids", "tombstones",
    "partner_stats", "run_events", *ENTITIES, "attached_tombstones", "attachment_events", "delivery_files",
)
FORGET_RUN = "forget"  # run_id of the deletions and the feed's high water that forget writes
FEED_DELETIONS = "deletions written to the change feed"

_FORGET_IN_THE_FEED = """
INSERT INTO deletions (partner_id, identifier, upstream_datestamp, run_id, reason, change_seq)
SELECT partner_id, identifier, datestamp, %(run)s, 'forgotten', nextval('change_seq')
FROM records WHERE partner_id = %(pid)s ORDER BY identifier
"""
# Its items and holdings too (attached_deletions, the feed's item-level deletions).
_FORGET_ATTACHED = """
INSERT INTO attached_deletions (partner_id, entity, identifier, bib_ids, upstream_datestamp, reason, run_id, change_seq)
SELECT partner_id, %(entity)s, identifier, bib_ids, datestamp, 'forgotten', %(run)s, nextval('change_seq')
FROM {} WHERE partner_id = %(pid)s ORDER BY identifier
"""


def forget_partner(conn: psycopg.Connection, partner_id: str) -> dict[str, int]:
    """Remove everything held for one partner (before a clean re-harvest); returns counts.

    Every record removed is first written to the change feed as a deletion (reason
    ``forgotten``) and the partner's high water raised, in the same transaction under
    the partner's apply lock: a downstream consumer drops what the aggregation dropped,
    and a reload afterwards arrives as upserts after those deletions.

    The partner's epoch is bumped in the same transaction (store/fences.py): a run planned
    before, waiting for a retry or a pool slot, can neither apply into the emptied partner
    nor move its cursor after it. The epoch and the lease tokens are kept.
    """
    removed: dict[str, int] = {}
    with conn.transaction():
        lock_partner_writes(conn, partner_id)
        bump_epoch(conn, partner_id, "forget")
        written = conn.execute(_FORGET_IN_THE_FEED, {"pid": partner_id, "run": FORGET_RUN}).rowcount
        for entity in ENTITIES:
            written += conn.execute(sql.SQL(_FORGET_ATTACHED).format(sql.Identifier(entity)),
                                    {"pid": partner_id, "run": FORGET_RUN, "entity": entity}).rowcount
        if written:
            mark_applied(conn, partner_id, FORGET_RUN)
        for table in _PARTNER_TABLES:
            statement = sql.SQL("DELETE FROM {} WHERE partner_id = %s").format(sql.Identifier(table))
            removed[table] = conn.execute(statement, (partner_id,)).rowcount
    removed[FEED_DELETIONS] = written
    return removed


_UNFINISHED = """
SELECT run_id, string_agg(channel || ' ' || status, ', ' ORDER BY channel), min(started_at)
FROM harvest_runs WHERE partner_id = %s AND status <> 'applied' AND status <> 'abandoned'
GROUP BY run_id ORDER BY min(started_at)
"""


def unfinished_runs(conn: psycopg.Connection, partner_id: str) -> list[tuple[str, str]]:
    """Runs of the partner that started and did not apply: (run, its channels' states)."""
    return [(run, channels) for run, channels, _ in conn.execute(_UNFINISHED, (partner_id,)).fetchall()]


def run_summary(conn: psycopg.Connection, partner_id: str | None = None, limit: int = 20) -> list[dict]:
    """The newest ``harvest_runs`` rows, for the demo and for operators."""
    cur = conn.execute(
        """
        SELECT partner_id, run_id, channel, mode, window_from, window_until, status, pages,
               fetched, upserted, unchanged, purged, quarantined, complete_list_size,
               list_size_mismatch, token_restarts, error, started_at, applied_at
        FROM harvest_runs
        WHERE %(pid)s::text IS NULL OR partner_id = %(pid)s
        ORDER BY started_at DESC, channel DESC LIMIT %(limit)s
        """,
        {"pid": partner_id, "limit": limit},
    )
    names = [d.name for d in cur.description or ()]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def live_identifiers(conn: psycopg.Connection, partner_id: str) -> set[str]:
    """Every identifier the aggregation holds for the partner (streamed, for checks)."""
    with conn.cursor(name="live_ids") as cur:
        cur.itersize = 20000
        cur.execute("SELECT identifier FROM records WHERE partner_id = %s", (partner_id,))
        return {row[0] for row in cur}
