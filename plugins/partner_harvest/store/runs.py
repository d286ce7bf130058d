"""The ``harvest_runs`` audit: one row per run and channel, updated as the run goes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

from partner_harvest.errors import HarvestError
from partner_harvest.records import HarvestStats
from partner_harvest.store import events, fences
from partner_harvest.store.db import scalar
from partner_harvest.window import Window

log = logging.getLogger(__name__)


def record_failed_try(conn: psycopg.Connection, exc: BaseException, record: Callable[[BaseException], None]) -> None:
    """Rolls back a failed try's work and writes its failure (``record(exc)``).

    Called for every BaseException: Airflow's task timeout is not an Exception, and a try it
    ends that stayed 'harvesting' would look alive to the failure callback (which then keeps
    the run's lease to its TTL) and to the health page. Such a failure may have cut a query
    short, so what recording it raises is logged, never put in place of the try's own error.
    """
    try:
        conn.rollback()
        record(exc)
    except Exception as record_error:
        if isinstance(exc, Exception):
            raise
        log.warning("could not record the failed try (%s: %s): %s", type(exc).__name__, exc, record_error)


@dataclass(frozen=True)
class RunRef:
    """Names one channel of one run of one partner (the staging and audit key)."""

    partner_id: str
    run_id: str
    channel: str = "changes"

    def key(self) -> tuple[str, str, str]:
        return (self.partner_id, self.run_id, self.channel)


class AttemptSuperseded(HarvestError):
    """A newer try of this channel began: this one (an orphan whose worker died, still
    running) must stop writing, or it would mix its pages into the new try's staging."""

    retryable = False


def begin_run(conn: psycopg.Connection, run: RunRef, window: Window, metadata_prefix: str | None,
              keep_staging: bool = False) -> int:
    """Open (or reopen, on a retry) the audit row and clear this channel's staging.

    ``keep_staging``: an adapter that resumes (a Sierra export) keeps what an unfinished
    try of the same window staged; a harvested, applied or re-frozen channel starts clean.
    Returns the channel's attempt number: the fence every later write of this try checks
    (``check_attempt``), so a try superseded by a newer one can no longer write.
    """
    with conn.transaction():
        fences.check(conn, f"start of {run.channel} of run {run.run_id}")
        previous = conn.execute(
            "SELECT window_until, mode, status FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel = %s",
            run.key(),
        ).fetchone()
        keep = (keep_staging and previous is not None and previous[0] == window.until
                and previous[1] == window.mode and previous[2] in ("harvesting", "waiting", "failed"))
        attempt = scalar(conn.execute(
            """
            INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_from, window_until,
                                      granularity, metadata_prefix, status, attempts, partner_clock,
                                      clock_regressed, refresh, harvesting_since, progress_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'harvesting', 1, %s, %s, %s, now(), now())
            ON CONFLICT (partner_id, run_id, channel) DO UPDATE SET
                mode = EXCLUDED.mode, window_from = EXCLUDED.window_from,
                window_until = EXCLUDED.window_until, granularity = EXCLUDED.granularity,
                partner_clock = EXCLUDED.partner_clock, clock_regressed = EXCLUDED.clock_regressed,
                refresh = EXCLUDED.refresh, metadata_prefix = EXCLUDED.metadata_prefix, status = 'harvesting',
                attempts = harvest_runs.attempts + 1, error = NULL, pages = 0, fetched = 0,
                upserted = 0, unchanged = 0, purged = 0, quarantined = 0,
                complete_list_size = NULL, list_size_mismatch = false, token_restarts = 0,
                check_kind = NULL, check_expected = NULL, check_found = NULL, check_ok = NULL, check_detail = NULL,
                cleaned_pages = 0, harvested_at = NULL, applied_at = NULL, max_datestamp = NULL,
                checkpoint = NULL, progress_at = now(), harvesting_since = now()
            RETURNING attempts
            """,
            (*run.key(), window.mode, window.from_, window.until, window.granularity, metadata_prefix,
             window.partner_clock, window.protocol.clock_regressed, window.protocol.refresh),
        ))
        if not keep:
            conn.execute(
                "DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s", run.key()
            )
            conn.execute("UPDATE harvest_runs SET staged_bytes = 0"
                         " WHERE partner_id = %s AND run_id = %s AND channel = %s", run.key())
    return attempt


def check_attempt(conn: psycopg.Connection, run: RunRef, attempt: int | None) -> None:
    """Inside a write's transaction: raise AttemptSuperseded unless ``attempt`` is still the
    channel's current try. The row lock it takes (FOR SHARE) makes a newer try's begin wait
    for this write to commit, and this write see a begin that committed first."""
    if attempt is None:
        return
    row = conn.execute(
        "SELECT attempts FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel = %s FOR SHARE",
        run.key(),
    ).fetchone()
    if row is None or row[0] != attempt:
        raise AttemptSuperseded(
            run.partner_id, f"{run.channel} of run {run.run_id}",
            f"try {attempt} was superseded by try {row[0] if row else '?'} (a retry started while this "
            "process was still running, e.g. after its worker was lost); it stops without writing",
        )


def record_progress(conn: psycopg.Connection, run: RunRef, pages: int, fetched: int,
                    checkpoint: int | None = None, expected: int | None = None) -> None:
    """Pages and items staged so far (inside the page's own transaction, so the row never
    counts a page staging lost); ``checkpoint`` is where a Sierra slice would resume;
    ``expected`` what the partner announces (completeListSize) for the time left."""
    conn.execute(
        """
        UPDATE harvest_runs SET pages = %s, fetched = %s, progress_at = now(),
            checkpoint = COALESCE(%s, checkpoint), expected = COALESCE(%s, expected)
        WHERE partner_id = %s AND run_id = %s AND channel = %s AND status = 'harvesting'
        """,
        (pages, fetched, checkpoint, expected, *run.key()),
    )


def finish_harvest(conn: psycopg.Connection, run: RunRef, stats: HarvestStats, attempt: int | None = None) -> None:
    """Record what the listing delivered; flags a completeListSize mismatch."""
    mismatch = stats.complete_list_size is not None and stats.complete_list_size != stats.fetched
    with conn.transaction():
        check_attempt(conn, run, attempt)
        fences.check(conn, f"end of {run.channel} of run {run.run_id}")
        conn.execute(
            """
            UPDATE harvest_runs SET status = 'harvested', pages = %s, fetched = %s,
                complete_list_size = %s, list_size_mismatch = %s, token_restarts = %s,
                cleaned_pages = %s, harvested_at = now()
            WHERE partner_id = %s AND run_id = %s AND channel = %s
            """,
            (
                stats.pages, stats.fetched, stats.complete_list_size, mismatch, stats.restarts,
                stats.cleaned_pages, *run.key(),
            ),
        )


def fail_run(conn: psycopg.Connection, run: RunRef, error: str, attempt: int | None = None,
             status: str = "failed") -> None:
    """Mark the channel failed with a one-line cause; live tables are untouched.

    ``status="waiting"``: the partner asked us to come back later and the task was
    rescheduled; what it staged is kept and the run is not failing.
    With ``attempt``, only while that try is the current one: a superseded try's failure
    never marks the newer try's row failed."""
    with conn.transaction():
        conn.execute(
            "UPDATE harvest_runs SET status = %s, error = %s"
            " WHERE partner_id = %s AND run_id = %s AND channel = %s AND (%s::int IS NULL OR attempts = %s::int)",
            (status, error[:4000], *run.key(), attempt, attempt),
        )


def close_waiting(conn: psycopg.Connection, partner_id: str, dag_id: str, run_id: str, task_id: str,
                  try_number: int | None, reason: str) -> int:
    """Close a run that waits for the partner (``run.wait``), in one transaction: its staging
    dropped, its channels that no task is still harvesting ``abandoned`` with the reason (a
    slice still running keeps its row; the next freeze closes the run whole), and a
    ``skipped`` event saying why (the health page shows the run skipped, not failing).
    Touches only this run's rows (no lease needed); returns the staged rows dropped."""
    with conn.transaction():
        dropped = conn.execute("DELETE FROM staging WHERE partner_id = %s AND run_id = %s",
                               (partner_id, run_id)).rowcount
        conn.execute(
            "UPDATE harvest_runs SET status = 'abandoned', error = %s WHERE partner_id = %s AND run_id = %s"
            " AND status NOT IN ('applied', 'planned', 'harvesting', 'waiting')",
            (f"waiting: {reason}"[:4000], partner_id, run_id),
        )
        events.record(conn, partner_id, dag_id, run_id, task_id, try_number, events.SKIPPED, reason)
    return dropped


def fail_apply(conn: psycopg.Connection, partner_id: str, run_id: str, error: str) -> None:
    """Mark every channel of a run failed after its apply rolled back."""
    with conn.transaction():
        conn.execute(
            "UPDATE harvest_runs SET status = 'failed', error = %s WHERE partner_id = %s AND run_id = %s",
            (f"apply failed: {error}"[:4000], partner_id, run_id),
        )


def record_check(
    conn: psycopg.Connection, run: RunRef, kind: str, expected: int | None, found: int | None,
    ok: bool, detail: str = "", attempt: int | None = None,
) -> None:
    """Record a completeness check (I12) on the channel's audit row; alerts read it.

    With ``attempt``, only while that try is the current one: an orphaned try's check
    never replaces the verdict of the retry that superseded it."""
    with conn.transaction():
        conn.execute(
            """
            UPDATE harvest_runs SET check_kind = %s, check_expected = %s, check_found = %s,
                check_ok = %s, check_detail = %s
            WHERE partner_id = %s AND run_id = %s AND channel = %s AND (%s::int IS NULL OR attempts = %s::int)
            """,
            (kind, expected, found, ok, detail[:4000], *run.key(), attempt, attempt),
        )


def last_applied_until(conn: psycopg.Connection, partner_id: str, channel: str = "changes") -> datetime | None:
    """How far the partner's timeline is covered by what this database applied, if at all.

    The newest applied cursor-moving window's until, or the partner's clock when that was
    behind it (a clock reset or a failover: changes stamped with that clock lie before our
    cursor). The cursor Variable lives in Airflow's database and the data here: after a
    restore of this database from a backup, the Variable is ahead of what it holds too.
    """
    row = conn.execute(
        """
        SELECT LEAST(window_until, COALESCE(partner_clock, window_until)) FROM harvest_runs
        WHERE partner_id = %s AND channel = %s AND status = 'applied' AND mode = 'incremental'
        ORDER BY started_at DESC, window_until DESC LIMIT 1
        """,
        (partner_id, channel),
    ).fetchone()
    conn.commit()
    return row[0] if row else None


def clock_high_water(conn: psycopg.Connection, partner_id: str) -> datetime | None:
    """How far the partner's clock has been seen: the highest clock an applied run read, or a
    later stamp among the records one applied (a version issued before the clock went back,
    even when the run that read it already had a clock set back)."""
    row = conn.execute(
        "SELECT GREATEST(max(partner_clock), max(max_datestamp)) FROM harvest_runs"
        " WHERE partner_id = %s AND status = 'applied'", (partner_id,)
    ).fetchone()
    conn.commit()
    return row[0] if row else None


def abandon_stale_runs(conn: psycopg.Connection, partner_id: str, older_than: timedelta) -> int:
    """Close runs that never applied within ``older_than``, and the slices that ran on after
    their run was closed as a wait (``close_waiting``), and drop their staging; a run whose
    approval request is open (pending, or approved with its apply under way) waits for its
    answer however long that takes (docs/operator/approvals.md)."""
    with conn.transaction():
        abandoned = conn.execute(
            """
            UPDATE harvest_runs SET status = 'abandoned', error = COALESCE(error || ' — ', '') || CASE
                WHEN started_at < now() - %s THEN 'abandoned: not applied within ' || %s::text
                ELSE 'abandoned: its run was closed as a wait' END
            WHERE partner_id = %s AND status IN ('planned', 'harvesting', 'waiting', 'harvested', 'failed')
              AND (started_at < now() - %s OR EXISTS (  -- a run closed as a wait: a slice that ran on after it
                  SELECT 1 FROM harvest_runs c WHERE c.partner_id = harvest_runs.partner_id
                  AND c.run_id = harvest_runs.run_id AND c.status = 'abandoned'))
              AND NOT EXISTS (SELECT 1 FROM approval_requests a WHERE a.partner_id = harvest_runs.partner_id
                              AND a.run_id = harvest_runs.run_id AND a.state IN ('pending', 'approved'))
            """,
            (older_than, str(older_than), partner_id, older_than),
        ).rowcount
        conn.execute(
            """
            DELETE FROM staging s WHERE s.partner_id = %(pid)s AND NOT EXISTS (
                SELECT 1 FROM harvest_runs h
                WHERE h.partner_id = %(pid)s AND h.run_id = s.run_id AND h.status <> 'abandoned')
            """,
            {"pid": partner_id},
        )
        conn.execute(  # and the batches of sliced runs (store/run_batch.py) nothing applies any more
            """
            DELETE FROM run_batch b WHERE b.partner_id = %(pid)s AND NOT EXISTS (
                SELECT 1 FROM harvest_runs h
                WHERE h.partner_id = %(pid)s AND h.run_id = b.run_id AND h.status NOT IN ('abandoned', 'applied'))
            """,
            {"pid": partner_id},
        )
    return abandoned


def channels_still_harvesting(conn: psycopg.Connection, partner_id: str, run_id: str) -> list[str]:
    """The run's channels another task may still be working on (a slice planned or running)."""
    rows = conn.execute(
        "SELECT channel FROM harvest_runs WHERE partner_id = %s AND run_id = %s"
        " AND status IN ('planned', 'harvesting', 'waiting') ORDER BY channel", (partner_id, run_id),
    ).fetchall()
    return [channel for (channel,) in rows]
