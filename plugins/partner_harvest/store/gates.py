"""SQL of the approval gates: what a staged run would remove, the request, its outcome.

A run stopped at its gate (docs/operator/approvals.md) keeps its staging and its
``harvest_runs`` rows (status ``harvested``) while a person decides; ``approval_requests``
(migration 0022) holds what the request showed and what became of it. Rejecting drops the
run's staging and closes its channels as ``abandoned``: nothing reaches ``records``,
``deletions`` or the change feed, and no cursor moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from partner_harvest.store import attached, moves
from partner_harvest.store.db import one

SAMPLE_SIZE = 10
PENDING, APPROVED, APPLIED, REJECTED, ABANDONED, REFUSED = (
    "pending", "approved", "applied", "rejected", "abandoned", "refused")


@dataclass(frozen=True)
class Shrink:
    """How much a staged run would take from the partner's live set.

    ``removals``: held records whose newest staged version is a tombstone (the apply purges
    them). ``absent``: for a run that covers the whole collection (a full harvest), held
    records it did not return at all; the apply keeps them, but the partner's own live set
    shrank by them (a reconcile would purge them)."""

    held: int
    removals: int
    absent: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    movable: int = 0  # of those, records that come back under a new identifier with the same content (store/moves.py)

    @property
    def fraction(self) -> float:
        return (self.removals + self.absent) / self.held if self.held else 0.0


_HELD = "SELECT count(*) FROM {held} WHERE partner_id = %(pid)s"

# The run's newest staged version per identifier of the table, as the apply's batch picks it.
_NEWEST = """
SELECT DISTINCT ON (s.identifier) s.identifier, s.kind FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind IN ('R', 'T')
  AND s.entity IS NOT DISTINCT FROM %(entity)s
ORDER BY s.identifier, s.datestamp DESC, s.observed_at DESC, s.seq DESC
"""

_REMOVALS = f"""
WITH newest AS ({_NEWEST})
SELECT count(*) FROM newest n JOIN {{held}} r ON r.partner_id = %(pid)s AND r.identifier = n.identifier
WHERE n.kind = 'T'
"""

_ABSENT = """
SELECT count(*) FROM {held} r WHERE r.partner_id = %(pid)s
  AND NOT EXISTS (SELECT 1 FROM staging s WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s
                  AND s.identifier = r.identifier AND s.entity IS NOT DISTINCT FROM %(entity)s)
"""

_SAMPLE_REMOVALS = f"""
WITH newest AS ({_NEWEST})
SELECT r.identifier, {{title}} FROM newest n JOIN {{held}} r ON r.partner_id = %(pid)s AND r.identifier = n.identifier
WHERE n.kind = 'T' ORDER BY r.identifier LIMIT %(n)s
"""

_SAMPLE_ABSENT = """
SELECT r.identifier, {title} FROM {held} r WHERE r.partner_id = %(pid)s
  AND NOT EXISTS (SELECT 1 FROM staging s WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s
                  AND s.identifier = r.identifier AND s.entity IS NOT DISTINCT FROM %(entity)s)
ORDER BY r.identifier LIMIT %(n)s
"""

# The attached tables (items, holdings) the run staged tombstones for.
_STAGED_ENTITIES = """
SELECT DISTINCT entity FROM staging WHERE partner_id = %(pid)s AND run_id = %(run)s AND kind = 'T'
  AND entity IS NOT NULL ORDER BY entity
"""


def measure_shrink(conn: psycopg.Connection, partner_id: str, run_id: str, *, whole_collection: bool,
                   sample_size: int = SAMPLE_SIZE, entity: str | None = None) -> Shrink:
    """What applying the staged run would take away from the records (or from the attached
    table ``entity``: items, holdings) (reads only)."""
    params = {"pid": partner_id, "run": run_id, "n": sample_size, "entity": entity}
    parts = {"held": sql.Identifier("records") if entity is None else attached.table(entity),
             "title": sql.SQL("r.title" if entity is None else "NULL")}
    noun = "" if entity is None else f"{entity}: "

    def run(text: str) -> Any:
        return conn.execute(sql.SQL(text).format(**parts), params)

    held = int(one(run(_HELD))[0])
    removals = int(one(run(_REMOVALS))[0]) if held else 0
    absent = int(one(run(_ABSENT))[0]) if held and whole_collection else 0
    sample = [{"identifier": i, "title": t, "why": f"{noun}purged (tombstone)"}
              for i, t in run(_SAMPLE_REMOVALS).fetchall()] if removals else []
    if absent and len(sample) < sample_size:
        params["n"] = sample_size - len(sample)
        sample += [{"identifier": i, "title": t, "why": f"{noun}not returned by the full harvest (kept)"}
                   for i, t in run(_SAMPLE_ABSENT).fetchall()]
    movable = 0  # records coming back under new identifiers (store/moves.py); items are not moved
    if entity is None and (removals or absent):
        movable = moves.count_staged(conn, partner_id, run_id, whole_collection=whole_collection)
    if movable:
        sample = [{"identifier": old, "title": None, "why": f"moves to {new} (same content)"}
                  for old, new in moves.sample_staged(conn, partner_id, run_id, whole_collection=whole_collection,
                                                      limit=sample_size)] + sample[:max(0, sample_size - movable)]
    conn.commit()
    return Shrink(held, removals, absent, sample, movable)


def staged_entities(conn: psycopg.Connection, partner_id: str, run_id: str) -> list[str]:
    """The attached tables the staged run would purge from."""
    rows = conn.execute(_STAGED_ENTITIES, {"pid": partner_id, "run": run_id}).fetchall()
    conn.commit()
    return [row[0] for row in rows]


def reconcile_sample(conn: psycopg.Connection, partner_id: str, run_id: str, channel: str,
                     sample_size: int = SAMPLE_SIZE) -> list[dict[str, Any]]:
    """The reconcile's staged removals (its tombstones), a few with their titles."""
    rows = conn.execute(
        """
        SELECT s.identifier, r.title FROM staging s
        LEFT JOIN records r ON r.partner_id = s.partner_id AND r.identifier = s.identifier
        WHERE s.partner_id = %s AND s.run_id = %s AND s.channel = %s AND s.kind = 'T'
        ORDER BY s.identifier LIMIT %s
        """,
        (partner_id, run_id, channel, sample_size),
    ).fetchall()
    conn.commit()
    return [{"identifier": i, "title": t, "why": "absent upstream or listed as deleted (purged)"} for i, t in rows]


@dataclass(frozen=True)
class Request:
    partner_id: str
    run_id: str
    dag_id: str
    kind: str
    held: int
    removals: int
    absent: int
    limit_fraction: float
    sample: list[dict[str, Any]]
    epoch: int | None
    requested_at: datetime
    state: str
    decided_by: str | None = None
    decided_at: datetime | None = None
    note: str | None = None
    movable: int = 0
    move: bool = False


_COLUMNS = ("partner_id, run_id, dag_id, kind, held, removals, absent, limit_fraction, sample, epoch, "
            "requested_at, state, decided_by, decided_at, note, movable, move")


def open_request(conn: psycopg.Connection, partner_id: str, run_id: str, dag_id: str, kind: str, shrink: Shrink,
                 limit_fraction: float, epoch: int | None) -> Request:
    """Record the request (again, for a cleared gate: a new request time, pending again)."""
    with conn.transaction():
        row = one(conn.execute(
            f"""
            INSERT INTO approval_requests (partner_id, run_id, dag_id, kind, held, removals, absent,
                                           limit_fraction, sample, epoch, movable)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (partner_id, run_id) DO UPDATE SET
                kind = EXCLUDED.kind, held = EXCLUDED.held, removals = EXCLUDED.removals, absent = EXCLUDED.absent,
                limit_fraction = EXCLUDED.limit_fraction, sample = EXCLUDED.sample, epoch = EXCLUDED.epoch,
                movable = EXCLUDED.movable, move = false,
                requested_at = now(), state = 'pending', decided_by = NULL, decided_at = NULL, note = NULL
            RETURNING {_COLUMNS}
            """,
            (partner_id, run_id, dag_id, kind, shrink.held, shrink.removals, shrink.absent, limit_fraction,
             Jsonb(shrink.sample), epoch, shrink.movable),
        ))
    return Request(*row)


def get_request(conn: psycopg.Connection, partner_id: str, run_id: str) -> Request | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM approval_requests WHERE partner_id = %s AND run_id = %s",
                       (partner_id, run_id)).fetchone()
    conn.commit()
    return Request(*row) if row else None


def decide(conn: psycopg.Connection, partner_id: str, run_id: str, state: str, by: str | None = None,
           note: str | None = None, move: bool = False) -> None:
    """``move``: the person chose Move (an approval whose apply moves the matched records)."""
    with conn.transaction():
        conn.execute(
            "UPDATE approval_requests SET state = %s, decided_by = COALESCE(%s, decided_by),"
            " decided_at = COALESCE(decided_at, now()), note = COALESCE(%s, note), move = move OR %s"
            " WHERE partner_id = %s AND run_id = %s",
            (state, by, note, move, partner_id, run_id),
        )


def abandon(conn: psycopg.Connection, partner_id: str, run_id: str, state: str, reason: str,
            by: str | None = None) -> int:
    """Close a gated run without applying it, in one transaction: its staging is dropped,
    its channels become ``abandoned`` with the reason, the request records the outcome.
    Touches only this run's rows (no lease needed); returns the staged rows dropped."""
    with conn.transaction():
        dropped = conn.execute("DELETE FROM staging WHERE partner_id = %s AND run_id = %s",
                               (partner_id, run_id)).rowcount
        conn.execute(
            "UPDATE harvest_runs SET status = 'abandoned', error = %s"
            " WHERE partner_id = %s AND run_id = %s AND status <> 'applied'",
            (reason[:4000], partner_id, run_id),
        )
        conn.execute(
            "UPDATE approval_requests SET state = %s, decided_by = %s, decided_at = now(), note = %s"
            " WHERE partner_id = %s AND run_id = %s",
            (state, by, reason[:4000], partner_id, run_id),
        )
    return dropped


def pending(conn: psycopg.Connection, partner_id: str | None = None) -> list[Request]:
    """Requests still waiting for an answer (newest first)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM approval_requests WHERE state = 'pending'"
        " AND (%(pid)s::text IS NULL OR partner_id = %(pid)s) ORDER BY requested_at DESC",
        {"pid": partner_id},
    ).fetchall()
    conn.commit()
    return [Request(*row) for row in rows]


def pending_by_partner(conn: psycopg.Connection, partner_ids: list[str]) -> dict[str, Request]:
    """Each partner's newest request still waiting for an answer (the health page's
    ``awaiting approval``)."""
    rows = conn.execute(
        f"SELECT DISTINCT ON (partner_id) {_COLUMNS} FROM approval_requests"
        " WHERE state = 'pending' AND partner_id = ANY(%s) ORDER BY partner_id, requested_at DESC",
        (partner_ids,),
    ).fetchall()
    return {row[0]: Request(*row) for row in rows}


def approved_runs(conn: psycopg.Connection, runs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Of the (partner, run) pairs, those whose purges a person approved at the gate."""
    if not runs:
        return set()
    rows = conn.execute(
        "SELECT a.partner_id, a.run_id FROM approval_requests a"
        " JOIN unnest(%s::text[], %s::text[]) AS k(partner_id, run_id) USING (partner_id, run_id)"
        " WHERE a.state IN ('approved', 'applied')",
        ([p for p, _ in runs], [r for _, r in runs]),
    ).fetchall()
    return {(p, r) for p, r in rows}
