"""SQL of a sliced run: the slices' audit rows, their bounds and a slice's checkpoint (Sierra, IIIF).

A sliced run keeps its ``changes`` row as the parent (the frozen window; coverage queries
read it) and adds one row per slice, channel ``changes/001`` ... Planning writes them all
at once with status ``planned``: the apply refuses while any of them has not harvested
(I4). The parent is marked harvested with nothing fetched, so it never blocks the apply
and its staged count (0) always matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from partner_harvest.store import fences, lanes
from partner_harvest.store.db import one, scalar
from partner_harvest.store.runs import RunRef
from partner_harvest.window import Slice, Window

PARENT = "changes"
SLICE_PREFIX = "changes/"


def slice_channel(index: int) -> str:
    """``changes/001``: sorts in slice order, and stays a distinct channel of the run."""
    return f"{SLICE_PREFIX}{index:03d}"


def is_slice(channel: str) -> bool:
    return channel.startswith(SLICE_PREFIX)


def write_plan(
    conn: psycopg.Connection, partner_id: str, run_id: str, window: Window,
    metadata_prefix: str | None, slices: list[Slice],
) -> None:
    """Record the run's plan in one transaction, replacing any earlier plan of the run.

    No slices: the earlier plan's slice rows and staging go (the parent channel harvests
    the window as before). Slices: the parent row says "harvested, nothing fetched" and
    every slice row is ``planned``.
    """
    key = {"pid": partner_id, "run": run_id, "prefix": SLICE_PREFIX + "%"}
    with conn.transaction():
        fences.check(conn, f"slice plan of run {run_id}")
        conn.execute("DELETE FROM harvest_runs WHERE partner_id = %(pid)s AND run_id = %(run)s"
                     " AND channel LIKE %(prefix)s", key)
        conn.execute("DELETE FROM staging WHERE partner_id = %(pid)s AND run_id = %(run)s"
                     " AND channel LIKE %(prefix)s", key)
        conn.execute("DELETE FROM run_batch WHERE partner_id = %(pid)s AND run_id = %(run)s", key)
        conn.execute("UPDATE harvest_runs SET merged_attempt = NULL, merged_rows = NULL"
                     " WHERE partner_id = %(pid)s AND run_id = %(run)s", key)
        if not slices:
            return
        conn.execute("DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s",
                     (partner_id, run_id, PARENT))
        conn.execute(
            """
            INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_from, window_until, granularity,
                                      metadata_prefix, status, attempts, partner_clock, harvested_at, error)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'harvested', 1, %s, now(), NULL)
            ON CONFLICT (partner_id, run_id, channel) DO UPDATE SET
                mode = EXCLUDED.mode, window_from = EXCLUDED.window_from, window_until = EXCLUDED.window_until,
                granularity = EXCLUDED.granularity, metadata_prefix = EXCLUDED.metadata_prefix,
                partner_clock = EXCLUDED.partner_clock, status = 'harvested', attempts = harvest_runs.attempts + 1,
                error = NULL, pages = 0, fetched = 0, upserted = 0, unchanged = 0, purged = 0, quarantined = 0,
                complete_list_size = NULL, list_size_mismatch = false, token_restarts = 0,
                check_kind = NULL, check_expected = NULL, check_found = NULL, check_ok = NULL, check_detail = NULL,
                cleaned_pages = 0, harvested_at = now(), applied_at = NULL
            """,
            (partner_id, run_id, PARENT, window.mode, window.from_, window.until, window.granularity,
             metadata_prefix, window.partner_clock),
        )
        with conn.cursor() as cur:
            cur.executemany(
                """
                INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_from, window_until, granularity,
                                          metadata_prefix, status, attempts, partner_clock, slice_lo, slice_hi,
                                          slice_set, expected, slice_pages, slice_page_items, harvested_at)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'planned', 0, %s, %s, %s, %s, %s, %s, %s, NULL)
                """,
                [(partner_id, run_id, s.channel, window.mode, s.from_, s.until, window.granularity, metadata_prefix,
                  window.partner_clock, s.lo, s.hi, s.set_spec, s.estimate, list(s.pages) or None,
                  list(s.page_items) or None) for s in slices],
            )


def read_bounds(conn: psycopg.Connection, run: RunRef) -> Slice:
    """A slice's bounds as planned (a reharvest after lost staging reads them here), with an
    IIIF slice's pages."""
    row = conn.execute(
        "SELECT window_from, window_until, slice_lo, slice_hi, slice_set, slice_pages, slice_page_items"
        " FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel = %s", run.key(),
    ).fetchone()
    conn.commit()
    if row is None:
        raise LookupError(f"{run.partner_id}: run {run.run_id} has no slice {run.channel} in harvest_runs")
    return Slice(channel=run.channel, from_=row[0], until=row[1], lo=row[2], hi=row[3], set_spec=row[4],
                       pages=tuple(row[5] or ()), page_items=tuple(row[6] or ()))


@dataclass(frozen=True)
class Resumable:
    """Where a failed Sierra or IIIF slice stands: its checkpoint and what it staged before it."""

    checkpoint: int
    pages: int
    fetched: int
    records: int
    tombstones: int
    rejected: int
    last_seq: int


def resumable(conn: psycopg.Connection, run: RunRef) -> Resumable | None:
    """The slice's checkpoint when resuming from it is safe, else None (start over).

    Safe only when the slice was interrupted (harvesting, waiting or failed, never a finished one
    cleared by hand) and staging still holds exactly what the row counted: the checkpoint
    and the count are written in each page's own transaction, so a crash that emptied
    staging (it is UNLOGGED) shows here as a difference.
    """
    row = conn.execute(
        "SELECT status, checkpoint, pages, fetched FROM harvest_runs"
        " WHERE partner_id = %s AND run_id = %s AND channel = %s", run.key(),
    ).fetchone()
    if row is None or row[0] not in ("harvesting", "waiting", "failed") or row[1] is None:
        conn.commit()
        return None
    counts = one(conn.execute(
        """
        SELECT count(*), count(*) FILTER (WHERE kind = 'R'), count(*) FILTER (WHERE kind = 'T'),
               count(*) FILTER (WHERE kind = 'Q'), COALESCE(max(seq), 0)
        FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s
        """, run.key(),
    ))
    conn.commit()
    if counts[0] != row[3]:
        return None
    return Resumable(row[1], row[2], row[3], counts[1], counts[2], counts[3], counts[4])


def reopen(conn: psycopg.Connection, run: RunRef) -> int:
    """Mark a slice harvesting again from its checkpoint, keeping its staging and counts;
    returns the new attempt number (the fence of store/runs.check_attempt)."""
    with conn.transaction():
        fences.check(conn, f"resumption of {run.channel} of run {run.run_id}")
        return scalar(conn.execute(
            """
            UPDATE harvest_runs SET status = 'harvesting', attempts = attempts + 1, resumed = resumed + 1,
                error = NULL, harvested_at = NULL, applied_at = NULL, progress_at = now()
            WHERE partner_id = %s AND run_id = %s AND channel = %s
            RETURNING attempts
            """, run.key(),
        ))


def slice_rows(conn: psycopg.Connection, partner_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's channels with their progress (operators, tests)."""
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT channel, status, window_from, window_until, slice_lo, slice_hi, slice_set, pages, fetched, expected,
                   checkpoint, resumed, attempts, lane, merged_attempt, started_at, harvesting_since, progress_at, harvested_at,
                   slice_pages IS NOT NULL AS slice_paged
            FROM harvest_runs WHERE partner_id = %s AND run_id = %s ORDER BY channel
            """, (partner_id, run_id),
        )
        names = [d.name for d in cur.description or ()]
        rows = [dict(zip(names, row)) for row in cur.fetchall()]
    conn.commit()
    return rows


def staged_identifiers(conn: psycopg.Connection, run: RunRef) -> set[str]:
    """The identifiers a slice staged so far: a resumed IIIF slice has decided them already
    (its newer pages came first), so older activities for them must not count again."""
    rows = conn.execute("SELECT DISTINCT identifier FROM staging WHERE partner_id = %s AND run_id = %s"
                        " AND channel = %s", run.key()).fetchall()
    conn.commit()
    return {row[0] for row in rows}


def claim(conn: psycopg.Connection, partner_id: str, run_id: str, lane: int) -> str | None:
    """The channel of the next slice lane ``lane`` harvests (store/lanes.claim's rule); None
    when none is left."""
    return lanes.claim(
        conn, "harvest_runs", "channel", ("planned", "harvesting", "waiting", "failed"),
        sql.SQL("partner_id = %(pid)s AND run_id = %(run)s AND channel LIKE %(prefix)s"),
        {"pid": partner_id, "run": run_id, "prefix": SLICE_PREFIX + "%", "lane": lane}, f"lane {lane} of run {run_id}")
