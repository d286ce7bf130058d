"""A sliced run's batch, merged slice by slice while the run still harvests.

The apply merges a run from one batch: per identifier the newest version the run staged,
ordered as ``(datestamp, observed_at, seq)`` (store/apply.py). Built in the apply, that is a
sort of the run's whole staging inside its transaction (4.5 of 17.5 s for a 200,000-record
first load on a loaded machine, another 2 s for its index and statistics). A sliced run's
slices finish one after another, so each harvested slice merges itself into ``run_batch``
as it ends (:func:`merge`, its own transaction): the newest of its versions against what
the slices before it merged. The apply then reads the batch as it stands, merging only the
channels not merged yet (:func:`prepare`); readers of the live tables see nothing of it
before the apply commits (I4 unchanged).

Staging stays the source: the batch is derived from it and never replaces it. It is used
only while it is whole, by two counts written in the merges' own transactions: every
channel's merged try (``merged_attempt``) is its current one (a channel harvested again
after its merge makes the batch stale), and the batch holds the rows its merges counted
(``merged_rows`` on the parent row: UNLOGGED, a crash empties it). Otherwise the apply
drops it and merges every channel again from staging.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psycopg
from psycopg import sql

from partner_harvest.store import fences
from partner_harvest.store.db import scalar
from partner_harvest.store.runs import RunRef
from partner_harvest.store.slices import SLICE_PREFIX

log = logging.getLogger(__name__)

PARENT = "changes"  # the row that counts the batch (store/slices.PARENT)

# One channel's newest version per identifier, against what the batch holds: a row replaces
# the held one when it sorts before it in the apply's order (datestamp DESC NULLS FIRST,
# observed_at DESC, seq DESC). RETURNING tells inserted rows (xmax 0) from replacements.
_MERGE = """
INSERT INTO run_batch AS b (partner_id, run_id, identifier, kind, datestamp, observed_at, seq, metadata_prefix,
                            metadata, set_specs, title, content_hash, channel, warnings, reason, regressed_clock)
SELECT DISTINCT ON (s.identifier) s.partner_id, s.run_id, s.identifier, s.kind, s.datestamp, s.observed_at, s.seq,
       s.metadata_prefix, s.metadata, s.set_specs, s.title, s.content_hash, s.channel, s.warnings, s.reason,
       %(regressed)s::timestamptz
FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.channel = %(channel)s AND s.kind IN ('R', 'T')
  AND s.entity IS NULL
ORDER BY s.identifier, s.datestamp DESC, s.observed_at DESC, s.seq DESC
ON CONFLICT (partner_id, run_id, identifier) DO UPDATE SET
    kind = EXCLUDED.kind, datestamp = EXCLUDED.datestamp, observed_at = EXCLUDED.observed_at, seq = EXCLUDED.seq,
    metadata_prefix = EXCLUDED.metadata_prefix, metadata = EXCLUDED.metadata, set_specs = EXCLUDED.set_specs,
    title = EXCLUDED.title, content_hash = EXCLUDED.content_hash, channel = EXCLUDED.channel,
    warnings = EXCLUDED.warnings, reason = EXCLUDED.reason, regressed_clock = EXCLUDED.regressed_clock
WHERE (COALESCE(EXCLUDED.datestamp, 'infinity'), EXCLUDED.observed_at, EXCLUDED.seq)
    > (COALESCE(b.datestamp, 'infinity'), b.observed_at, b.seq)
RETURNING (xmax = 0)
"""

# What the apply reads as its batch (store/apply._BATCH's columns), the run's rows of run_batch.
_VIEW = """
CREATE TEMP VIEW apply_batch AS
SELECT kind, identifier, datestamp, observed_at, metadata_prefix, metadata, set_specs, title, content_hash,
       channel, warnings, reason, regressed_clock
FROM run_batch WHERE partner_id = {pid} AND run_id = {run}
"""

_SORT_MEMORY = "96MB"  # as the apply's own sort of the batch (store/apply._SORT_MEMORY)


def _lock(conn: psycopg.Connection, partner_id: str, run_id: str) -> None:
    """One merge of the run at a time (slices ending together; the apply's own merges)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('run_batch:' || %s || '/' || %s))", (partner_id, run_id))


def merge(conn: psycopg.Connection, run: RunRef) -> int:
    """Merge one harvested channel's staging into the run's batch, in its own fenced
    transaction (a savepoint inside the apply's); returns the rows it added or replaced.
    A channel merged before under an earlier try makes the batch stale: it is dropped
    first, and the channels merged into it are merged again by the apply."""
    with conn.transaction():
        fences.check(conn, f"merge of {run.channel} of run {run.run_id}")
        _lock(conn, run.partner_id, run.run_id)
        row = conn.execute(
            "SELECT status, attempts, merged_attempt, clock_regressed, partner_clock FROM harvest_runs"
            " WHERE partner_id = %s AND run_id = %s AND channel = %s", run.key()).fetchone()
        if row is None or row[0] not in ("harvested", "applied") or row[2] == row[1]:
            return 0
        if row[2] is not None:
            log.info("%s: %s of run %s was harvested again after its merge: the run's batch is built again",
                     run.partner_id, run.channel, run.run_id)
            _drop(conn, run.partner_id, run.run_id)
        params = {"pid": run.partner_id, "run": run.run_id, "channel": run.channel,
                  "regressed": row[4] if row[3] else None}
        prior = scalar(conn.execute("SELECT current_setting('work_mem')"))
        conn.execute("SELECT set_config('work_mem', %s, true)", (_SORT_MEMORY,))
        outcome = [inserted for (inserted,) in conn.execute(_MERGE, params).fetchall()]
        conn.execute("SELECT set_config('work_mem', %s, true)", (prior,))
        conn.execute("UPDATE harvest_runs SET merged_attempt = attempts WHERE partner_id = %s AND run_id = %s"
                     " AND channel = %s", run.key())
        conn.execute("UPDATE harvest_runs SET merged_rows = COALESCE(merged_rows, 0) + %s"
                     " WHERE partner_id = %s AND run_id = %s AND channel = %s",
                     (sum(outcome), run.partner_id, run.run_id, PARENT))
    return len(outcome)


def analyze(conn: psycopg.Connection, partner_id: str, run_id: str) -> bool:
    """The batch's statistics for the apply's joins (its rows per run, its kinds), when more
    than half of its rows changed since the last ANALYZE and a slice of the run still
    harvests: a lane that ran out of slices asks while the others harvest, so the statistics
    are fresh enough when the last lane ends; the last lane leaves it to the apply, which asks
    once more when it joins against held rows (:func:`prepare`). Outside any transaction of a
    merge, so other runs' merges do not wait on it."""
    harvesting = scalar(conn.execute(
        "SELECT EXISTS (SELECT 1 FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel LIKE %s"
        " AND status NOT IN ('harvested', 'applied'))", (partner_id, run_id, SLICE_PREFIX + "%")))
    if not harvesting:
        conn.commit()
        return False
    changed, live = conn.execute(
        "SELECT COALESCE(n_mod_since_analyze, 0), COALESCE(n_live_tup, 0) FROM pg_stat_user_tables"
        " WHERE relid = 'run_batch'::regclass").fetchone() or (0, 0)
    conn.commit()
    if changed <= live // 2:
        return False
    conn.execute("ANALYZE run_batch (partner_id, run_id, kind, identifier)")
    conn.commit()
    return True


def prepare(conn: psycopg.Connection, partner_id: str, run_id: str, channels: Iterable[str], joins: bool = True) -> bool:
    """Inside the apply's transaction: when some channel of the run merged itself, merge
    the others and make the batch the apply's ``apply_batch`` (a view); False when none did
    (the apply sorts staging itself, as ever). A stale or emptied batch is built again.
    ``joins`` False: the apply joins the batch against no held row (a first load), so its
    statistics are not refreshed."""
    rows = conn.execute(
        "SELECT channel, attempts, merged_attempt, merged_rows FROM harvest_runs"
        " WHERE partner_id = %s AND run_id = %s", (partner_id, run_id)).fetchall()
    merged = {channel: (attempts, done) for channel, attempts, done, _ in rows if done is not None}
    if not merged:
        return False
    _lock(conn, partner_id, run_id)
    counted = next((n for channel, _, _, n in rows if channel == PARENT), None) or 0
    held = scalar(conn.execute("SELECT count(*) FROM run_batch WHERE partner_id = %s AND run_id = %s",
                               (partner_id, run_id)))
    stale = [channel for channel, (attempts, done) in merged.items() if attempts != done]
    if held != counted or stale:
        log.warning("%s: the batch of run %s is %s; merging every channel again from staging", partner_id, run_id,
                    f"stale ({', '.join(sorted(stale))} harvested again)" if stale
                    else f"incomplete ({held} rows, its merges counted {counted}: the database lost it)")
        _drop(conn, partner_id, run_id)
        merged = {}
    here = sum(merge(conn, RunRef(partner_id, run_id, channel)) for channel in sorted(set(channels) - set(merged)))
    changed, live = conn.execute(
        "SELECT COALESCE(n_mod_since_analyze, 0), COALESCE(n_live_tup, 0) FROM pg_stat_user_tables"
        " WHERE relid = 'run_batch'::regclass").fetchone() or (0, 0)
    if joins and (changed > live // 2 or 2 * here > held):  # stale statistics (the last lane), or most merged now
        conn.execute("ANALYZE run_batch (partner_id, run_id, kind, identifier)")
    conn.execute(sql.SQL(_VIEW).format(pid=sql.Literal(partner_id), run=sql.Literal(run_id)))
    return True


def discard(conn: psycopg.Connection, partner_id: str, run_id: str) -> None:
    """The run's batch, once applied (or abandoned): nothing reads it any more."""
    with conn.transaction():
        conn.execute("DELETE FROM run_batch WHERE partner_id = %s AND run_id = %s", (partner_id, run_id))


def _drop(conn: psycopg.Connection, partner_id: str, run_id: str) -> None:
    conn.execute("DELETE FROM run_batch WHERE partner_id = %s AND run_id = %s", (partner_id, run_id))
    conn.execute("UPDATE harvest_runs SET merged_attempt = NULL, merged_rows = NULL"
                 " WHERE partner_id = %s AND run_id = %s", (partner_id, run_id))
