"""The change feed: a monotonic change sequence per partner that downstream reads.

Contract (docs/consumers.md): every row the apply
writes to ``records`` and every ``deletions`` row carries ``change_seq``, a value of the
sequence ``change_seq`` taken inside the apply transaction while it holds the partner's
advisory lock. ``partner_feed.high_water`` is written in the same transaction. So for one
partner: every change with ``change_seq <= high_water`` is committed and visible to
whoever sees that ``high_water``, and later changes get greater values. A reader reads
"partner P, ``after < change_seq <= high_water``" and moves ``after`` to that high
water; it never misses nor repeats a change, whatever commits while it reads.

Why not "max change_seq seen": sequence values are taken at statement time but become
visible at commit, so a transaction of ANOTHER partner (or a writer outside the lock) may
commit a smaller value after a reader already saw a greater one.

A record changed twice keeps only its newest ``change_seq`` (a current-state feed): a
reader gets its newest version once. Deletions keep a row each, so a reader that applies
changes in ``change_seq`` order ends at the current state even when a record was
deleted and then re-added (deletion first, then the record).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from partner_harvest.errors import HarvestError
from partner_harvest.store import attached
from partner_harvest.store.db import one


class FeedPositionLost(HarvestError):
    """The consumer's position moved under us: another export of it ran at the same time."""


def mark_applied(conn: psycopg.Connection, partner_id: str, run_id: str) -> tuple[int, int]:
    """In the apply transaction, after the writes: raise the partner's high water.

    Returns ``(after, until)``: the run's changes are exactly the partner's rows with
    ``after < change_seq <= until`` (empty when ``after == until``); they are recorded on
    the run's ``harvest_runs`` rows too. Must run under the partner's apply lock.
    """
    row = one(conn.execute(
        """
        SELECT (SELECT high_water FROM partner_feed WHERE partner_id = %(pid)s FOR UPDATE),
               GREATEST((SELECT max(change_seq) FROM records WHERE partner_id = %(pid)s),
                        (SELECT max(change_seq) FROM deletions WHERE partner_id = %(pid)s),
                        (SELECT max(change_seq) FROM moves WHERE partner_id = %(pid)s),
                        """ + attached.high_water_sql() + """)
        """,
        {"pid": partner_id},
    ))
    after = row[0] or 0
    until = max(after, row[1] or 0)
    conn.execute(
        """
        INSERT INTO partner_feed (partner_id, high_water, run_id) VALUES (%(pid)s, %(until)s, %(run)s)
        ON CONFLICT (partner_id) DO UPDATE SET high_water = EXCLUDED.high_water,
            run_id = EXCLUDED.run_id, updated_at = now()
        WHERE partner_feed.high_water < EXCLUDED.high_water
        """,
        {"pid": partner_id, "until": until, "run": run_id},
    )
    conn.execute(
        "UPDATE harvest_runs SET change_seq_after = %s, change_seq_until = %s WHERE partner_id = %s AND run_id = %s",
        (after, until, partner_id, run_id),
    )
    # Where the partner stood before and after this write, in commit order: an "as of" read
    # and a rollback read the state at a mark (store/history.py).
    conn.execute(
        "INSERT INTO feed_marks (partner_id, run_id, change_seq_after, high_water) VALUES (%s, %s, %s, %s)",
        (partner_id, run_id, after, until),
    )
    return after, until


def high_water(conn: psycopg.Connection, partner_id: str) -> int:
    """Every change of the partner up to this value is committed (0: none yet)."""
    row = conn.execute("SELECT high_water FROM partner_feed WHERE partner_id = %s", (partner_id,)).fetchone()
    return row[0] if row else 0


@dataclass(frozen=True)
class RunChanges:
    """What an applied run did, for its Asset event: window, counts and change range."""

    partner_id: str
    run_id: str
    mode: str | None
    window_from: datetime | None
    window_until: datetime | None
    change_seq_after: int
    change_seq_until: int
    counts: dict[str, int]
    channels: dict[str, dict[str, int]] | None = None  # the same counts per channel (Sierra: items, holdings...)

    def as_extra(self) -> dict[str, Any]:
        """JSON-safe, for an Asset event's ``extra``."""
        return {
            "partner_id": self.partner_id,
            "run_id": self.run_id,
            "mode": self.mode,
            "window_from": self.window_from.isoformat() if self.window_from else None,
            "window_until": self.window_until.isoformat() if self.window_until else None,
            "counts": self.counts,
            "change_seq_after": self.change_seq_after,
            "change_seq_until": self.change_seq_until,
            "changed": self.change_seq_until > self.change_seq_after,
            "channels": dict(self.channels or {}),
        }


def run_changes(conn: psycopg.Connection, partner_id: str, run_id: str) -> RunChanges:
    """The applied run's window (its ``changes`` channel, else any), counts and change range."""
    rows = conn.execute(
        """
        SELECT channel, mode, window_from, window_until, change_seq_after, change_seq_until,
               fetched, upserted, unchanged, purged, quarantined
        FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND status = 'applied'
        ORDER BY channel <> 'changes', channel
        """,
        (partner_id, run_id),
    ).fetchall()
    if not rows:
        raise HarvestError(partner_id, f"change range of run {run_id}", "the run has no applied channel")
    first = rows[0]
    names = ("fetched", "upserted", "unchanged", "purged", "quarantined")
    counts = {name: sum(row[6 + i] for row in rows) for i, name in enumerate(names)}
    channels = {row[0]: {name: row[6 + i] for i, name in enumerate(names)} for row in rows}
    return RunChanges(partner_id, run_id, first[1], first[2], first[3], first[4] or 0, first[5] or 0, counts,
                      channels)


# A moved record's row carries its move's change_seq until its next change: one event, op
# "moved", with the record's current version. A move superseded since (the record changed
# again, or went) is still an event of its own (no version: its newer change follows).
_CHANGES = """
SELECT r.change_seq, CASE WHEN m.old_identifier IS NULL THEN 'upsert' ELSE 'moved' END AS op, r.identifier,
       r.datestamp, r.metadata_prefix, r.metadata, r.set_specs, r.title,
       r.content_hash, r.run_id, r.harvested_at AS changed_at, NULL AS reason, m.old_identifier AS moved_from
FROM records r
LEFT JOIN moves m ON m.partner_id = r.partner_id AND m.change_seq = r.change_seq AND m.new_identifier = r.identifier
WHERE r.partner_id = %(pid)s AND r.change_seq > %(after)s AND r.change_seq <= %(until)s
UNION ALL
SELECT change_seq, 'delete', identifier, upstream_datestamp, NULL, NULL, NULL, NULL,
       NULL, run_id, deleted_at, reason, NULL
FROM deletions WHERE partner_id = %(pid)s AND change_seq > %(after)s AND change_seq <= %(until)s
UNION ALL
SELECT m.change_seq, 'moved', m.new_identifier, NULL, NULL, NULL, NULL, NULL,
       m.content_hash, m.run_id, m.moved_at, NULL, m.old_identifier
FROM moves m
WHERE m.partner_id = %(pid)s AND m.change_seq > %(after)s AND m.change_seq <= %(until)s
  AND NOT EXISTS (SELECT 1 FROM records r WHERE r.partner_id = m.partner_id AND r.identifier = m.new_identifier
                  AND r.change_seq = m.change_seq)
UNION ALL
SELECT change_seq, 'attachments', identifier, NULL, NULL, NULL, NULL, NULL, NULL, run_id, changed_at, NULL, NULL
FROM attachment_events WHERE partner_id = %(pid)s AND change_seq > %(after)s AND change_seq <= %(until)s
""" + "".join(f"""UNION ALL
SELECT change_seq, 'attached_upsert', identifier, datestamp, '{entity}', content::text, bib_ids, NULL, content_hash,
       run_id, harvested_at, NULL, NULL
FROM {entity} WHERE partner_id = %(pid)s AND change_seq > %(after)s AND change_seq <= %(until)s
""" for entity in attached.ENTITIES) + """UNION ALL
SELECT change_seq, 'attached_delete', identifier, upstream_datestamp, entity, NULL, bib_ids, NULL, NULL, run_id,
       deleted_at, reason, NULL
FROM attached_deletions WHERE partner_id = %(pid)s AND change_seq > %(after)s AND change_seq <= %(until)s
ORDER BY change_seq
"""


def changes(conn: psycopg.Connection, partner_id: str, after: int, until: int) -> Iterator[dict[str, Any]]:
    """The partner's changes with ``after < change_seq <= until``, in ``change_seq`` order: its
    records (``upsert``, ``delete``), the records whose items or holdings changed
    (``attachments``), and those items and holdings (``attached_upsert``, ``attached_delete``,
    their table in ``metadata_prefix``, their records in ``set_specs``; feed.line names them).

    ``until`` must not exceed a high water read earlier (``high_water``); then every
    change in the range is committed. A change superseded since (record edited again,
    or deleted) is no longer in the range: its newer change is, above ``until``.
    Streams through a server-side cursor in one snapshot.
    """
    with conn.transaction(), conn.cursor(name="feed_changes", row_factory=dict_row) as cur:
        cur.itersize = 2000
        cur.execute(_CHANGES, {"pid": partner_id, "after": after, "until": until})
        yield from cur


@dataclass(frozen=True)
class ExportRange:
    """A consumer's next range of one partner: ``after < change_seq <= until``."""

    consumer: str
    partner_id: str
    after: int
    until: int
    resumed: bool  # True: an earlier export of this very range did not finish


def begin_export(conn: psycopg.Connection, consumer: str, partner_id: str) -> ExportRange | None:
    """Fix the consumer's next range (committed), or None when it is up to date.

    A range once fixed stays fixed until ``finish_export``: after a crash the rerun
    exports the same range again (and can overwrite the same output), never a wider one
    that would repeat changes already handed out.
    """
    _require_idle(conn)
    with conn.transaction():
        conn.execute(
            "INSERT INTO feed_positions (consumer, partner_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (consumer, partner_id),
        )
        position, pending = one(conn.execute(
            "SELECT position, pending_until FROM feed_positions WHERE consumer = %s AND partner_id = %s FOR UPDATE",
            (consumer, partner_id),
        ))
        if pending is not None:
            return ExportRange(consumer, partner_id, position, pending, resumed=True)
        until = high_water(conn, partner_id)
        if until <= position:
            return None
        conn.execute(
            "UPDATE feed_positions SET pending_until = %s, updated_at = now() WHERE consumer = %s AND partner_id = %s",
            (until, consumer, partner_id),
        )
    return ExportRange(consumer, partner_id, position, until, resumed=False)


def finish_export(conn: psycopg.Connection, span: ExportRange) -> None:
    """Move the consumer's position to the end of the range it has durably handed out."""
    _require_idle(conn)
    with conn.transaction():
        moved = conn.execute(
            """
            UPDATE feed_positions SET position = pending_until, pending_until = NULL, updated_at = now()
            WHERE consumer = %s AND partner_id = %s AND position = %s AND pending_until = %s
            """,
            (span.consumer, span.partner_id, span.after, span.until),
        ).rowcount
    if moved != 1:
        raise FeedPositionLost(
            span.partner_id, f"feed export of consumer {span.consumer}",
            f"its position is no longer ({span.after}, {span.until}] pending: another export of this consumer ran at "
            "the same time; nothing was moved",
        )


def position(conn: psycopg.Connection, consumer: str, partner_id: str) -> int:
    row = conn.execute(
        "SELECT position FROM feed_positions WHERE consumer = %s AND partner_id = %s", (consumer, partner_id)
    ).fetchone()
    return row[0] if row else 0


def _require_idle(conn: psycopg.Connection) -> None:
    """Positions must commit: inside a caller's transaction they would be a mere savepoint."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("feed positions need a connection outside any transaction (commit or roll back first)")
