"""SQL of a sliced reconcile's sweep: the slices' rows, their bounds and what they staged.

The plan writes every slice ``planned`` in one transaction (replacing an earlier plan of the
run and the run's swept ids), numbered biggest first; a lane takes the next one (:func:`claim`),
a slice marks itself ``sweeping`` (dropping only its own rows),
counts each page in the page's own transaction (store/reconcile.IdSweepWriter), then
``swept``. The apply refuses while a slice is not swept, and sweeps again any slice whose
rows are not what its row counted (reconcile_ids is UNLOGGED: a crash empties it). Every
write is fenced (store/fences.check) and checks that no other run of the partner applied
since the plan (:func:`check_not_stale`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from partner_harvest.errors import HarvestError
from partner_harvest.store import fences, lanes
from partner_harvest.window import Slice


class SweepStale(HarvestError):
    """Another run of the partner applied after this reconcile planned its sweep (its lease
    lapsed between tasks and a harvest took the partner): the slices swept before compare
    the partner with records that changed since. Not retried: the next reconcile sweeps anew."""

    retryable = False


class SweepIncomplete(HarvestError):
    """A slice of the sweep is not swept yet; the apply waits for every one."""

    retryable = False


@dataclass(frozen=True)
class SliceRow:
    slice: int
    bounds: Slice
    status: str
    swept: int


def write_plan(conn: psycopg.Connection, partner_id: str, run_id: str, pieces: list[Slice]) -> datetime:
    """Record the sweep's slices (numbered 1..n) in one fenced transaction, dropping an
    earlier plan of the run and every id it swept; returns the plan's instant."""
    key = (partner_id, run_id)
    with conn.transaction():
        fences.check(conn, f"reconcile sweep plan of run {run_id}")
        conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %s AND run_id = %s", key)
        conn.execute("DELETE FROM reconcile_slices WHERE partner_id = %s AND run_id = %s", key)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO reconcile_slices (partner_id, run_id, slice, window_from, window_until, open_end, id_lo,"
                " id_hi, estimate) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(partner_id, run_id, i + 1, p.from_, p.until, p.open_end, p.lo, p.hi, p.estimate)
                 for i, p in enumerate(pieces)],
            )
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def check_not_stale(conn: psycopg.Connection, partner_id: str, run_id: str, planned_at: datetime,
                    request: str) -> None:
    """Inside a write's transaction: raise SweepStale if another run of the partner applied
    since ``planned_at``. While this run holds the partner's reconcile lease no harvest can
    apply; a lease that lapsed between tasks and was taken is caught here (and by the fence)."""
    row = conn.execute(
        "SELECT run_id, applied_at FROM harvest_runs WHERE partner_id = %s AND run_id <> %s AND applied_at > %s"
        " ORDER BY applied_at LIMIT 1", (partner_id, run_id, planned_at),
    ).fetchone()
    if row is not None:
        raise SweepStale(partner_id, request,
                         f"run {row[0]} applied at {row[1]:%Y-%m-%d %H:%M:%S}Z, after this reconcile planned its "
                         f"sweep ({planned_at:%Y-%m-%d %H:%M:%S}Z): the slices swept so far compare the partner with "
                         "records that changed since; nothing of this reconcile is applied, the next one sweeps anew")


def claim(conn: psycopg.Connection, partner_id: str, run_id: str, lane: int) -> int | None:
    """The next slice lane ``lane`` sweeps (store/lanes.claim's rule); None when none is left."""
    index: int | None = lanes.claim(
        conn, "reconcile_slices", "slice", ("planned", "sweeping", "failed"),
        sql.SQL("partner_id = %(pid)s AND run_id = %(run)s"), {"pid": partner_id, "run": run_id, "lane": lane},
        f"reconcile sweep lane {lane} of run {run_id}")
    return index


def start(conn: psycopg.Connection, partner_id: str, run_id: str, index: int, planned_at: datetime) -> Slice:
    """Mark slice ``index`` sweeping again from its own start (its rows dropped); its bounds."""
    with conn.transaction():
        request = f"reconcile sweep slice {index} of run {run_id}"
        fences.check(conn, request)
        check_not_stale(conn, partner_id, run_id, planned_at, request)
        row = conn.execute(
            "UPDATE reconcile_slices SET status = 'sweeping', attempts = attempts + 1, pages = 0, swept = 0,"
            " error = NULL, progress_at = now(), swept_at = NULL WHERE partner_id = %s AND run_id = %s AND slice = %s"
            " RETURNING window_from, window_until, open_end, id_lo, id_hi, estimate",
            (partner_id, run_id, index),
        ).fetchone()
        if row is None:
            raise LookupError(f"{partner_id}: reconcile run {run_id} has no sweep slice {index}")
        conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %s AND run_id = %s AND slice = %s",
                     (partner_id, run_id, index))
    return _bounds(row)


def finish(conn: psycopg.Connection, partner_id: str, run_id: str, index: int) -> None:
    with conn.transaction():
        fences.check(conn, f"reconcile sweep slice {index} of run {run_id}")
        conn.execute("UPDATE reconcile_slices SET status = 'swept', swept_at = now()"
                     " WHERE partner_id = %s AND run_id = %s AND slice = %s", (partner_id, run_id, index))


def fail(conn: psycopg.Connection, partner_id: str, run_id: str, index: int, error: str) -> None:
    """Not fenced: it only says why this attempt stopped (a stale task may say it too)."""
    with conn.transaction():
        conn.execute("UPDATE reconcile_slices SET status = 'failed', error = %s"
                     " WHERE partner_id = %s AND run_id = %s AND slice = %s AND status = 'sweeping'",
                     (error[:2000], partner_id, run_id, index))


def rows(conn: psycopg.Connection, partner_id: str, run_id: str) -> list[SliceRow]:
    """Every slice with what reconcile_ids holds of it (status, the swept count)."""
    found = conn.execute(
        "SELECT slice, window_from, window_until, open_end, id_lo, id_hi, estimate, status, swept FROM reconcile_slices"
        " WHERE partner_id = %s AND run_id = %s ORDER BY slice", (partner_id, run_id),
    ).fetchall()
    conn.commit()
    return [SliceRow(r[0], _bounds(r[1:7]), r[7], r[8]) for r in found]


def lost(conn: psycopg.Connection, partner_id: str, run_id: str) -> list[int]:
    """Swept slices whose rows in reconcile_ids are not what they counted (a crash emptied it)."""
    found = conn.execute(
        """
        SELECT s.slice FROM reconcile_slices s
        LEFT JOIN (SELECT slice, count(*) AS n FROM reconcile_ids WHERE partner_id = %(pid)s AND run_id = %(run)s
                   GROUP BY slice) i USING (slice)
        WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.status = 'swept' AND COALESCE(i.n, 0) <> s.swept
        ORDER BY s.slice
        """, {"pid": partner_id, "run": run_id},
    ).fetchall()
    conn.commit()
    return [r[0] for r in found]


def _bounds(row: tuple[Any, ...]) -> Slice:
    from_, until, open_end, lo, hi, estimate = row
    return Slice(from_=from_, until=until, open_end=open_end, lo=lo, hi=hi, estimate=estimate)
