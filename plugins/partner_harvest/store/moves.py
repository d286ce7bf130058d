"""Moves: records a run would purge that come back under new identifiers with the same content.

A partner that changes its OAI base or its identifier scheme looks, to a harvest, like a
mass purge plus a mass insert. The pairs are matched on ``content_hash``: a held record the
run would remove (its newest staged version is a tombstone, or, for a run that covers the
whole collection, the run did not return it) and a record the run adds (staged live, not
held) with the same hash; several of one hash pair up by identifier order, and what does not
pair stays an ordinary purge or addition. The approval gate counts the pairs
(``approval_requests.movable``) and offers Move; a person's Move makes the apply rewrite each
pair's record under its new identifier, in the apply's one transaction (store/apply.py):
the record keeps its first-harvested time and its history, the old version goes to
``record_history`` (ended_by ``moved``), and ``moves`` holds the change-feed event (op
``moved``).
"""

from __future__ import annotations

import psycopg

from partner_harvest.store.db import scalar

# {newest}: the run's newest staged version per identifier, with kind and content_hash (the
# apply's batch, or the same DISTINCT ON over staging for the gate).
_PAIRS = """
WITH newest AS ({newest}),
gone AS (
    SELECT r.identifier, r.content_hash FROM records r JOIN newest n ON n.identifier = r.identifier AND n.kind = 'T'
    WHERE r.partner_id = %(pid)s
    UNION ALL
    SELECT r.identifier, r.content_hash FROM records r
    WHERE r.partner_id = %(pid)s AND %(whole)s
      AND NOT EXISTS (SELECT 1 FROM newest n WHERE n.identifier = r.identifier)
), added AS (
    SELECT n.identifier, n.content_hash FROM newest n
    WHERE n.kind = 'R' AND NOT EXISTS (SELECT 1 FROM records r WHERE r.partner_id = %(pid)s AND r.identifier = n.identifier)
), g AS (
    SELECT identifier, content_hash, row_number() OVER (PARTITION BY content_hash ORDER BY identifier) AS k FROM gone
), a AS (
    SELECT identifier, content_hash, row_number() OVER (PARTITION BY content_hash ORDER BY identifier) AS k FROM added
)
SELECT g.identifier AS old_identifier, a.identifier AS new_identifier, g.content_hash
FROM g JOIN a USING (content_hash, k)
"""

STAGED_NEWEST = """
SELECT DISTINCT ON (s.identifier) s.identifier, s.kind, s.content_hash FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind IN ('R', 'T') AND s.entity IS NULL
ORDER BY s.identifier, s.datestamp DESC, s.observed_at DESC, s.seq DESC
"""
BATCH_NEWEST = "SELECT identifier, kind, content_hash FROM apply_batch"

# A run covers the whole collection when a changes channel of it has no lower bound and is
# not a requested window (gates.covers_whole_collection, read back from the audit).
_WHOLE = """
SELECT COALESCE(bool_or(window_from IS NULL AND mode <> 'window'), false) FROM harvest_runs
WHERE partner_id = %(pid)s AND run_id = %(run)s AND channel LIKE 'changes%%'
"""

_MOVE = """
WITH moved AS (
UPDATE records r SET
    identifier = p.new_identifier, datestamp = b.datestamp, metadata_prefix = b.metadata_prefix,
    metadata = b.metadata, set_specs = b.set_specs, title = b.title, content_hash = b.content_hash,
    warnings = b.warnings, harvested_at = now(), run_id = %(run)s, observed_at = b.observed_at,
    regressed_clock = b.regressed_clock, change_seq = p.seq
FROM move_pairs p, apply_batch b, records o
WHERE r.partner_id = %(pid)s AND r.identifier = p.old_identifier AND b.identifier = p.new_identifier
  AND o.partner_id = r.partner_id AND o.identifier = r.identifier
RETURNING p.old_identifier, p.new_identifier, p.content_hash AS pair_hash, p.seq, b.channel, {old}
), kept AS (
INSERT INTO record_history ({history})
SELECT %(pid)s, old_identifier, {version}, seq, %(run)s, 'moved' FROM moved
), logged AS (
INSERT INTO moves (partner_id, old_identifier, new_identifier, content_hash, run_id, change_seq)
SELECT %(pid)s, old_identifier, new_identifier, pair_hash, %(run)s, seq FROM moved
), cleared AS (
DELETE FROM tombstones t USING moved m WHERE t.partner_id = %(pid)s AND t.identifier = m.new_identifier
)
SELECT channel, count(*) FROM moved GROUP BY channel
"""


def count_staged(conn: psycopg.Connection, partner_id: str, run_id: str, *, whole_collection: bool) -> int:
    """The pairs a Move of the staged run would move (reads only; the gate's figure)."""
    query = f"SELECT count(*) FROM ({_PAIRS.format(newest=STAGED_NEWEST)}) pairs"
    return int(scalar(conn.execute(query, {"pid": partner_id, "run": run_id, "whole": whole_collection})))


def sample_staged(conn: psycopg.Connection, partner_id: str, run_id: str, *, whole_collection: bool,
                  limit: int) -> list[tuple[str, str]]:
    """A few of those pairs, (old, new) by old identifier, for the request."""
    query = f"SELECT old_identifier, new_identifier FROM ({_PAIRS.format(newest=STAGED_NEWEST)}) pairs " \
            "ORDER BY old_identifier LIMIT %(n)s"
    rows = conn.execute(query, {"pid": partner_id, "run": run_id, "whole": whole_collection, "n": limit}).fetchall()
    return [(old, new) for old, new in rows]


def move_chosen(conn: psycopg.Connection, partner_id: str, run_id: str) -> bool:
    """A person answered the run's approval request with Move."""
    row = conn.execute(
        "SELECT move FROM approval_requests WHERE partner_id = %s AND run_id = %s AND state IN ('approved', 'applied')",
        (partner_id, run_id),
    ).fetchone()
    return bool(row and row[0])


def apply_moves(conn: psycopg.Connection, partner_id: str, run_id: str, old_version: str, history: str,
                version: str) -> dict[str, int]:
    """Inside the apply, after its batch is built and before it merges: move each pair's record
    to its new identifier with the batch's version of it (the merge then finds it unchanged);
    returns the moves per channel."""
    params = {"pid": partner_id, "run": run_id}
    whole = bool(scalar(conn.execute(_WHOLE, params)))
    conn.execute(f"CREATE TEMP TABLE move_pairs ON COMMIT DROP AS SELECT *, nextval('change_seq') AS seq "
                 f"FROM ({_PAIRS.format(newest=BATCH_NEWEST)}) pairs ORDER BY old_identifier",
                 {**params, "whole": whole})
    moved: dict[str, int] = dict(conn.execute(_MOVE.format(old=old_version, history=history, version=version), params).fetchall())
    conn.execute("DROP TABLE move_pairs")
    return moved
