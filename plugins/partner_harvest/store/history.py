"""History of a partner's records: what a change replaced, kept for a while, and rollbacks.

Every version an apply replaces or removes goes to ``record_history`` in the apply's own
transaction (store/apply.py), with the change-feed numbers it was current between
(``change_seq`` .. ``superseded_seq``). Every apply, forget and rollback leaves a
``feed_marks`` row in commit order (store/feed.mark_applied): where the partner's feed stood
before and after it. So the partner's records "before run X" are the records as of X's
``change_seq_after`` (the SQL function ``records_at_change``), and "as of an instant" the
records after the last mark by then (``records_as_of``).

A rollback to before run X writes that state back in one transaction under the partner's
apply lock: each record changed since is restored (a change-feed upsert), each record that
did not exist is removed (a deletion, reason ``rollback``); the versions it replaces go to
the history too, so a rollback can itself be rolled back. It bumps the partner's epoch (a
run planned before can neither apply nor move a cursor, store/fences.py) and sets the
cursors back while that bump is held, as ``reset-cursor`` does.

History older than the partner's ``history_retention`` is dropped (:func:`prune`, at each
run's freeze); ``partner_history.pruned_through`` says how far back a state can be read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from partner_harvest.errors import HarvestError
from partner_harvest.store import feed
from partner_harvest.store.apply import HISTORY_COLUMNS, lock_partner_writes
from partner_harvest.store.db import one, scalar
from partner_harvest.store.fences import bump_epoch
from partner_harvest.store.partner_stats import update_partner_stats

log = logging.getLogger(__name__)
COMMAND = "rollback"


class RollbackRefused(HarvestError):
    """The rollback cannot be done (unknown run, history no longer kept, the partner is busy);
    nothing changed."""

    retryable = False


# A cursor's place before a run: (until, granularity), or None (unset: the next run harvests everything).
CursorPlace = tuple[datetime, str] | None


@dataclass(frozen=True)
class RollbackPlan:
    """What a rollback to before ``run_id`` would do (reads only)."""

    partner_id: str
    run_id: str
    mark: int
    change_seq: int  # the state restored: the partner's records as of this change-feed number
    undone_runs: list[str]
    restore: int  # records written back (an older version, or a purged record again)
    remove: int  # records that did not exist before the run
    cursors: dict[str, CursorPlace] = field(default_factory=dict)  # channel -> its place before the run

    def describe(self) -> list[str]:
        lines = [f"rollback of {self.partner_id} to before run {self.run_id}: {len(self.undone_runs)} run(s) undone "
                 f"({', '.join(self.undone_runs)})",
                 f"  records restored (older version or purged record back): {self.restore}",
                 f"  records removed (created by the undone runs): {self.remove}"]
        for channel, place in sorted(self.cursors.items()):
            lines.append(f"  cursor {channel}: back to {place[0].isoformat() if place else 'unset (a full harvest next)'}")
        return lines


@dataclass(frozen=True)
class RollbackResult:
    id: int
    plan: RollbackPlan
    run_id: str  # rollback/<id>: the run id of its writes
    change_seq_after: int
    change_seq_until: int
    cursors: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "partner_id": self.plan.partner_id, "to_before_run": self.plan.run_id,
                "undone_runs": self.plan.undone_runs, "restored": self.plan.restore, "removed": self.plan.remove,
                "change_seq_after": self.change_seq_after, "change_seq_until": self.change_seq_until,
                "cursors": self.cursors}


def prune(conn: psycopg.Connection, partner_id: str, retention: timedelta) -> int:
    """Drop the partner's history older than ``retention``; returns the versions dropped.

    The state at the last mark before the horizon stays readable (its mark and every version
    superseded after it are kept). Skipped, not waited for, while the partner's apply lock is
    held: the next run's freeze prunes."""
    with conn.transaction():
        if not scalar(conn.execute("SELECT pg_try_advisory_xact_lock(hashtext('apply:' || %s))", (partner_id,))):
            return 0
        horizon = conn.execute(
            "SELECT mark, high_water FROM feed_marks WHERE partner_id = %s AND marked_at <= now() - %s"
            " ORDER BY mark DESC LIMIT 1", (partner_id, retention),
        ).fetchone()
        if horizon is None:
            return 0
        mark, through = horizon
        conn.execute("DELETE FROM feed_marks WHERE partner_id = %s AND mark < %s", (partner_id, mark))
        dropped = conn.execute("DELETE FROM record_history WHERE partner_id = %s AND superseded_seq <= %s",
                               (partner_id, through)).rowcount
        conn.execute(
            "INSERT INTO partner_history (partner_id, pruned_through) VALUES (%s, %s) ON CONFLICT (partner_id)"
            " DO UPDATE SET pruned_through = GREATEST(partner_history.pruned_through, EXCLUDED.pruned_through),"
            " pruned_at = now()", (partner_id, through),
        )
    if dropped:
        log.info("%s: %d superseded versions older than %s dropped from record_history", partner_id, dropped, retention)
    return dropped


def _mark_of(conn: psycopg.Connection, partner_id: str, run_id: str) -> tuple[int, int]:
    row = conn.execute("SELECT mark, change_seq_after FROM feed_marks WHERE partner_id = %s AND run_id = %s"
                       " ORDER BY mark LIMIT 1", (partner_id, run_id)).fetchone()
    if row is None:
        applied = conn.execute("SELECT status FROM harvest_runs WHERE partner_id = %s AND run_id = %s LIMIT 1",
                               (partner_id, run_id)).fetchone()
        why = ("it never applied" if applied and applied[0] != "applied" else
               "it applied before the retained history (history_retention)" if applied else "no such run")
        raise RollbackRefused(partner_id, f"rollback to before run {run_id}", f"cannot roll back to before it: {why}")
    pruned = scalar(conn.execute("SELECT COALESCE(max(pruned_through), 0) FROM partner_history WHERE partner_id = %s",
                                 (partner_id,)))
    if row[1] < pruned:
        raise RollbackRefused(partner_id, f"rollback to before run {run_id}",
                              "the versions it replaced are no longer kept (history_retention); nothing changed")
    return int(row[0]), int(row[1])


_CURSORS_BEFORE = """
SELECT CASE WHEN h.channel LIKE 'changes%%' THEN 'changes' ELSE h.channel END AS cursor_channel,
       max(h.window_until), max(h.granularity)
FROM harvest_runs h
JOIN feed_marks m ON m.partner_id = h.partner_id AND m.run_id = h.run_id
WHERE h.partner_id = %(pid)s AND h.status = 'applied' AND h.mode = 'incremental' AND m.mark < %(mark)s
GROUP BY 1
"""
_CURSOR_CHANNELS = """
SELECT DISTINCT CASE WHEN channel LIKE 'changes%%' THEN 'changes' ELSE channel END FROM harvest_runs
WHERE partner_id = %(pid)s AND mode = 'incremental'
"""


def cursors_before(conn: psycopg.Connection, partner_id: str, mark: int) -> dict[str, CursorPlace]:
    """Each cursor's place before the run of ``mark``: the furthest incremental window applied
    before it (what the cursor moved to), None when none was (the cursor is deleted)."""
    params = {"pid": partner_id, "mark": mark}
    places: dict[str, CursorPlace] = {channel: None for (channel,) in conn.execute(_CURSOR_CHANNELS, params)}
    for channel, until, granularity in conn.execute(_CURSORS_BEFORE, params).fetchall():
        places[channel] = (until, granularity)
    return places


_COUNTS = """
WITH back AS (
    SELECT DISTINCT identifier FROM record_history
    WHERE partner_id = %(pid)s AND change_seq <= %(seq)s AND superseded_seq > %(seq)s
), now_held AS (
    SELECT identifier FROM records WHERE partner_id = %(pid)s AND change_seq > %(seq)s
)
SELECT (SELECT count(*) FROM back),
       (SELECT count(*) FROM now_held n WHERE NOT EXISTS (SELECT 1 FROM back b WHERE b.identifier = n.identifier))
"""


def plan_rollback(conn: psycopg.Connection, partner_id: str, run_id: str) -> RollbackPlan:
    """What rolling the partner back to before ``run_id`` would do (reads only)."""
    try:
        return plan_rollback_in(conn, partner_id, run_id)
    finally:
        conn.commit()


_BACK = """
CREATE TEMP TABLE rollback_back ON COMMIT DROP AS
SELECT DISTINCT ON (identifier) * FROM record_history
WHERE partner_id = %(pid)s AND change_seq <= %(seq)s AND superseded_seq > %(seq)s
ORDER BY identifier, superseded_seq
"""
_PLAN = """
CREATE TEMP TABLE rollback_plan ON COMMIT DROP AS
SELECT COALESCE(c.identifier, b.identifier) AS identifier, c.identifier IS NOT NULL AS held_now,
       b.identifier IS NOT NULL AS bring_back, nextval('change_seq') AS seq
FROM (SELECT identifier FROM records WHERE partner_id = %(pid)s AND change_seq > %(seq)s) c
FULL JOIN (SELECT identifier FROM rollback_back) b ON b.identifier = c.identifier
"""
_KEEP_REPLACED = f"""
INSERT INTO record_history ({HISTORY_COLUMNS})
SELECT r.partner_id, r.identifier, r.datestamp, r.metadata_prefix, r.metadata, r.set_specs, r.title, r.content_hash,
       r.warnings, r.first_harvested_at, r.harvested_at, r.run_id, r.observed_at, r.regressed_clock, r.change_seq,
       p.seq, %(run)s, 'rollback'
FROM records r JOIN rollback_plan p ON p.identifier = r.identifier AND p.held_now
WHERE r.partner_id = %(pid)s
"""
_REMOVED_IN_THE_FEED = """
INSERT INTO deletions (partner_id, identifier, upstream_datestamp, run_id, reason, change_seq)
SELECT %(pid)s, r.identifier, r.datestamp, %(run)s, 'rollback', p.seq
FROM records r JOIN rollback_plan p ON p.identifier = r.identifier AND p.held_now AND NOT p.bring_back
WHERE r.partner_id = %(pid)s
"""
_DROP_CURRENT = """
DELETE FROM records r USING rollback_plan p WHERE r.partner_id = %(pid)s AND r.identifier = p.identifier AND p.held_now
"""
_WRITE_BACK = """
INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, set_specs, title, content_hash,
                     warnings, first_harvested_at, harvested_at, run_id, observed_at, regressed_clock, change_seq)
SELECT %(pid)s, b.identifier, b.datestamp, b.metadata_prefix, b.metadata, b.set_specs, b.title, b.content_hash,
       b.warnings, b.first_harvested_at, now(), b.run_id, b.observed_at, b.regressed_clock, p.seq
FROM rollback_back b JOIN rollback_plan p USING (identifier)
"""
# A restored record is held again: the remembered purges of it go (as when a record lands).
_FORGET_TOMBSTONES = """
DELETE FROM tombstones t USING rollback_back b WHERE t.partner_id = %(pid)s AND t.identifier = b.identifier
"""


def rollback(conn: psycopg.Connection, partner_id: str, run_id: str, requested_by: str, via: str,
             set_cursors: Callable[[dict[str, CursorPlace]], dict[str, Any]],
             expected: RollbackPlan | None = None) -> RollbackResult:
    """Restore the partner's records to what they were before ``run_id`` applied, in one
    transaction: refused while a lease on the partner is live, fenced by an epoch bump,
    recorded in ``rollbacks``. ``set_cursors`` gets each cursor's place before the run and
    writes it (Airflow Variables; a plain run's dict) while the bump is held; it returns what
    it did, for the record. ``expected``: the plan a person confirmed; a partner that applied
    anything since refuses."""
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '5min'")
        lock_partner_writes(conn, partner_id)
        busy = conn.execute("SELECT holder, kind FROM partner_leases WHERE partner_id = %s AND expires_at > now()",
                            (partner_id,)).fetchall()
        if busy:
            raise RollbackRefused(partner_id, f"rollback to before run {run_id}",
                                  "a run holds the partner's lease now (" + ", ".join(f"{h} ({k})" for h, k in busy)
                                  + "): pause its DAGs, let it finish, then roll back; nothing changed")
        bump_epoch(conn, partner_id, COMMAND)
        plan = plan_rollback_in(conn, partner_id, run_id)
        if expected is not None and plan.undone_runs != expected.undone_runs:
            raise RollbackRefused(partner_id, f"rollback to before run {run_id}",
                                  f"the partner changed since the rollback was confirmed (now undoing "
                                  f"{', '.join(plan.undone_runs)}); nothing changed: ask again")
        rollback_id = scalar(conn.execute(
            "INSERT INTO rollbacks (partner_id, to_before_run, undone_runs, requested_by, via, restored, removed)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (partner_id, run_id, plan.undone_runs, requested_by, via, plan.restore, plan.remove)))
        own_run = f"rollback/{rollback_id}"
        params = {"pid": partner_id, "seq": plan.change_seq, "run": own_run}
        conn.execute(_BACK, params)
        conn.execute(_PLAN, params)
        conn.execute(_KEEP_REPLACED, params)
        conn.execute(_REMOVED_IN_THE_FEED, params)
        dropped = conn.execute(_DROP_CURRENT, params).rowcount
        written = conn.execute(_WRITE_BACK, params).rowcount
        conn.execute(_FORGET_TOMBSTONES, params)
        update_partner_stats(conn, partner_id, own_run, written - dropped)
        after, until = feed.mark_applied(conn, partner_id, own_run)
        cursors = set_cursors(plan.cursors)
        conn.execute("UPDATE rollbacks SET change_seq_after = %s, change_seq_until = %s, cursors = %s WHERE id = %s",
                     (after, until, Jsonb(cursors), rollback_id))
        conn.execute("DROP TABLE rollback_back")
        conn.execute("DROP TABLE rollback_plan")
    log.warning("%s: rolled back to before run %s by %s (%s): %d restored, %d removed; runs undone: %s",
                partner_id, run_id, requested_by, via, plan.restore, plan.remove, ", ".join(plan.undone_runs))
    return RollbackResult(int(rollback_id), plan, own_run, after, until, cursors)


def plan_rollback_in(conn: psycopg.Connection, partner_id: str, run_id: str) -> RollbackPlan:
    """:func:`plan_rollback` inside the caller's transaction (no commit)."""
    mark, seq = _mark_of(conn, partner_id, run_id)
    undone = [r for (r,) in conn.execute("SELECT run_id FROM feed_marks WHERE partner_id = %s AND mark >= %s"
                                         " ORDER BY mark", (partner_id, mark))]
    restore, remove = one(conn.execute(_COUNTS, {"pid": partner_id, "seq": seq}))
    return RollbackPlan(partner_id, run_id, mark, seq, undone, int(restore), int(remove),
                        cursors_before(conn, partner_id, mark))


def rollbacks(conn: psycopg.Connection, partner_id: str, limit: int = 10) -> list[dict[str, Any]]:
    """The partner's newest rollbacks (health page, status)."""
    cur = conn.execute(
        "SELECT id, to_before_run, undone_runs, requested_by, via, done_at, restored, removed, cursors"
        " FROM rollbacks WHERE partner_id = %s ORDER BY done_at DESC LIMIT %s", (partner_id, limit))
    names = [d.name for d in cur.description or ()]
    rows = [dict(zip(names, row)) for row in cur.fetchall()]
    conn.commit()
    return rows


def rollback_points(conn: psycopg.Connection, partner_id: str, limit: int = 15) -> list[dict[str, Any]]:
    """The partner's newest applied writes a rollback can go back before (newest first): run,
    when, how many changes (health page)."""
    pruned = scalar(conn.execute("SELECT COALESCE(max(pruned_through), 0) FROM partner_history WHERE partner_id = %s",
                                 (partner_id,)))
    rows = conn.execute(
        "SELECT run_id, marked_at, high_water - change_seq_after FROM feed_marks"
        " WHERE partner_id = %s AND change_seq_after >= %s ORDER BY mark DESC LIMIT %s",
        (partner_id, pruned, limit)).fetchall()
    conn.commit()
    return [{"run_id": run_id, "at": at, "changes": changes} for run_id, at, changes in rows]
