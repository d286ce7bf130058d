"""What an operator needs to know about every partner, read from the aggregation database.

Used by the Airflow health page (``partner_harvest.airflow.health``) and the CLI's
``status`` command: plain psycopg, no Airflow. Every figure comes from tables the
harvest already keeps (``harvest_runs``, and ``partner_stats``: the counters the apply
keeps in step); nothing counts ``records`` or ``quarantine``, so a view costs the same
with 10 million records as with ten.

A *run* here is all channels of one ``harvest_runs.run_id`` (``<dag_id>/<airflow run_id>``):
the ``changes`` channel names harvest runs, the ``reconcile`` channel reconcile runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache

import psycopg
from croniter import croniter

from partner_harvest import quality
from partner_harvest.registry import Partner
from partner_harvest.store.quality import RunFigures

# Partner states, worst first: what the health page sorts and colours by.
FAILING, BEHIND, WARNING, NEW, HEALTHY = "failing", "behind", "warning", "new", "healthy"
STATES = (FAILING, BEHIND, WARNING, NEW, HEALTHY)


@dataclass(frozen=True)
class RunInfo:
    """One run, all channels summed; ``status`` is the worst channel's."""

    run_id: str
    status: str  # applied | running | failed | abandoned
    started_at: datetime
    ended_at: datetime | None
    fetched: int
    upserted: int
    unchanged: int
    purged: int
    quarantined: int
    error: str | None
    announced: int | None = None  # completeListSize when it disagreed with what came
    failed_checks: tuple[str, ...] = ()
    window_until: datetime | None = None
    records_held: int | None = None  # after the apply (NULL for runs before migration 0006)

    @property
    def dag_id(self) -> str | None:
        """The Airflow DAG of the run (run ids are ``<dag_id>/<airflow run_id>``)."""
        return self.run_id.split("/", 1)[0] if "/" in self.run_id else None

    @property
    def dag_run_id(self) -> str | None:
        return self.run_id.split("/", 1)[1] if "/" in self.run_id else None

    @property
    def duration(self) -> timedelta | None:
        return self.ended_at - self.started_at if self.ended_at else None


@dataclass(frozen=True)
class SchedulerRun:
    """The newest harvest DAG run as the scheduler knows it (Airflow's database or REST API).

    A run that fails before it reaches the partner's data (the endpoint is down, the
    Connection is missing) leaves no ``harvest_runs`` row: only the scheduler knows it failed.
    """

    dag_id: str
    dag_run_id: str
    state: str  # Airflow's DagRun state: queued | running | success | failed
    started_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True)
class PartnerHealth:
    """One row of the health page / ``partner-harvest status``."""

    partner_id: str
    protocol: str
    state: str  # one of STATES
    last_run: RunInfo | None
    last_success: RunInfo | None
    last_reconcile: RunInfo | None
    cursor: datetime | None  # until of the newest applied incremental window
    cursor_lag: timedelta | None  # now - cursor
    behind_after: timedelta  # a cursor trailing more than this is "behind"
    records_held: int
    quarantined_now: int  # rows of quarantine_current (as of the last apply)
    alerts: tuple[str, ...] = field(default_factory=tuple)


def behind_after(partner: Partner, now: datetime) -> timedelta:
    """How far the cursor may trail ``now`` before the partner counts as behind.

    One schedule interval (the next run has not come yet), plus the run deadline (it may
    take that long), plus the partner's lag (the window stops that short of its clock).
    """
    hour = now.replace(minute=0, second=0, microsecond=0)
    return _schedule_interval(partner.schedule, hour) + partner.run_deadline + partner.lag


@lru_cache(maxsize=1024)
def _schedule_interval(schedule: str, hour: datetime) -> timedelta:
    """The gap between the schedule's next two runs after ``hour`` (croniter is slow: 500
    partners share a handful of schedules)."""
    try:
        it = croniter(schedule, hour)
        first = it.get_next(datetime)
        return it.get_next(datetime) - first
    except (ValueError, KeyError):
        return timedelta(days=1)


_PICKS = """
WITH p AS (SELECT unnest(%(ids)s::text[]) AS partner_id)
SELECT p.partner_id, k.kind, k.run_id FROM p
CROSS JOIN LATERAL (
    (SELECT 'last' AS kind, h.run_id FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.channel = 'changes'
      ORDER BY h.started_at DESC LIMIT 1)
    UNION ALL
    (SELECT 'success', h.run_id FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.status = 'applied' AND h.channel = 'changes'
      ORDER BY h.started_at DESC LIMIT 1)
    UNION ALL
    (SELECT 'reconcile', h.run_id FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.channel = 'reconcile'
      ORDER BY h.started_at DESC LIMIT 1)
) k
"""

# Channels of one run folded into one line; the worst status wins.
_RUN_COLUMNS = """
    h.run_id,
    CASE WHEN bool_or(h.status = 'failed') THEN 'failed'
         WHEN bool_or(h.status = 'abandoned') THEN 'abandoned'
         WHEN bool_and(h.status = 'applied') THEN 'applied'
         ELSE 'running' END,
    min(h.started_at),
    CASE WHEN bool_and(h.status = 'applied') THEN max(h.applied_at)
         WHEN bool_or(h.status IN ('failed', 'abandoned')) THEN max(COALESCE(h.applied_at, h.harvested_at, h.started_at))
    END,
    sum(h.fetched)::bigint, sum(h.upserted)::bigint, sum(h.unchanged)::bigint, sum(h.purged)::bigint,
    sum(h.quarantined)::bigint,
    string_agg(h.channel || ': ' || h.error, '; ' ORDER BY h.channel) FILTER (WHERE h.error IS NOT NULL),
    max(h.complete_list_size) FILTER (WHERE h.list_size_mismatch),
    array_remove(array_agg(CASE WHEN h.check_ok = false THEN
        h.check_kind || ' on the ' || h.channel || ' channel: the witness says '
        || COALESCE(h.check_expected::text, 'nothing') || ', the run holds '
        || COALESCE(h.check_found::text, 'unknown')
        || COALESCE(' (' || NULLIF(h.check_detail, '') || ')', '') END ORDER BY h.channel), NULL),
    max(h.window_until) FILTER (WHERE h.channel = 'changes'),
    max(h.records_held)
"""

# LATERAL: each run read through the primary key, never a scan of the whole audit.
_RUNS = f"""
SELECT k.partner_id, k.kind, r.*
FROM unnest(%(pids)s::text[], %(kinds)s::text[], %(runs)s::text[]) AS k(partner_id, kind, run_id)
CROSS JOIN LATERAL (
    SELECT {_RUN_COLUMNS} FROM harvest_runs h
    WHERE h.partner_id = k.partner_id AND h.run_id = k.run_id GROUP BY h.run_id
) r
"""

_PER_PARTNER = """
WITH p AS (SELECT unnest(%(ids)s::text[]) AS partner_id)
SELECT p.partner_id,
    COALESCE(s.records_held, 0), COALESCE(s.quarantined_now, 0),
    (SELECT max(h.window_until) FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.channel = 'changes' AND h.status = 'applied'
        AND h.mode = 'incremental'),
    (SELECT h.applied_at FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.status = 'applied' AND h.fetched > 0
      ORDER BY h.started_at DESC LIMIT 1),
    (SELECT min(h.started_at) FROM harvest_runs h WHERE h.partner_id = p.partner_id)
FROM p LEFT JOIN partner_stats s ON s.partner_id = p.partner_id
"""


def _run(row: Sequence) -> RunInfo:
    (run_id, status, started, ended, fetched, upserted, unchanged, purged, quarantined, error,
     announced, checks, until, held) = row
    return RunInfo(run_id, status, started, ended, fetched, upserted, unchanged, purged, quarantined,
                   error, announced, tuple(checks or ()), until, held)


def partner_health(
    conn: psycopg.Connection, partners: Iterable[Partner], now: datetime,
    scheduler_runs: Mapping[str, SchedulerRun] | None = None,
) -> list[PartnerHealth]:
    """The health of every partner given (the registry's), worst state first.

    ``now`` is the reference clock (aware UTC): cursor lag and quiet periods are measured
    against it. Partners without any run are listed too (state ``new``). ``scheduler_runs``
    (partner id -> its newest harvest DAG run, optional) adds the failed runs that never
    wrote an audit row. Reads only: the transaction is committed before returning, so a
    caller's connection is left idle.
    """
    partners = list(partners)
    ids = [p.id for p in partners]
    picks = conn.execute(_PICKS, {"ids": ids}).fetchall()
    runs: dict[tuple[str, str], RunInfo] = {}
    if picks:
        pids, kinds, run_ids = (list(col) for col in zip(*picks))
        for pid, kind, *row in conn.execute(_RUNS, {"pids": pids, "kinds": kinds, "runs": run_ids}):
            runs[(pid, kind)] = _run(row)
    per_partner = {row[0]: row[1:] for row in conn.execute(_PER_PARTNER, {"ids": ids})}
    conn.commit()

    result = []
    for partner in partners:
        held, quarantined, cursor, last_fetch_at, first_run_at = per_partner[partner.id]
        last, success = runs.get((partner.id, "last")), runs.get((partner.id, "success"))
        last = _newer_failure((scheduler_runs or {}).get(partner.id), last, now)
        lag = now - cursor if cursor else None
        limit = behind_after(partner, now)
        alerts = _alerts(partner, success, held, last_fetch_at, first_run_at, now)
        if last is None:
            state = NEW
        elif last.status in ("failed", "abandoned"):
            state = FAILING
        elif lag is not None and lag > limit:
            state = BEHIND
        elif alerts:
            state = WARNING
        else:
            state = HEALTHY
        result.append(PartnerHealth(
            partner_id=partner.id, protocol=partner.protocol, state=state, last_run=last,
            last_success=success, last_reconcile=runs.get((partner.id, "reconcile")), cursor=cursor,
            cursor_lag=lag, behind_after=limit, records_held=held,
            quarantined_now=quarantined, alerts=tuple(alerts),
        ))
    result.sort(key=lambda h: (STATES.index(h.state), h.partner_id))
    return result


def _newer_failure(scheduled: SchedulerRun | None, last: RunInfo | None, now: datetime) -> RunInfo | None:
    """The scheduler's failed run when the audit knows nothing of it (or only older runs)."""
    if scheduled is None or scheduled.state != "failed":
        return last
    run_id = f"{scheduled.dag_id}/{scheduled.dag_run_id}"
    started = scheduled.started_at or scheduled.ended_at or now
    if last is not None and (last.run_id == run_id or last.started_at >= started):
        return last
    return RunInfo(run_id, "failed", started, scheduled.ended_at, 0, 0, 0, 0, 0,
                   "the DAG run failed before it recorded anything in harvest_runs: see its task logs")


def _alerts(partner: Partner, success: RunInfo | None, held: int, last_fetch_at: datetime | None,
            first_run_at: datetime | None, now: datetime) -> list[str]:
    """The data-quality findings (quality.findings) of the newest successful run."""
    if success is None:
        return []
    figures = RunFigures(
        fetched=success.fetched, purged=success.purged, quarantined=success.quarantined, held=held,
        last_fetch_at=last_fetch_at, first_run_at=first_run_at, announced=success.announced,
        failed_checks=success.failed_checks,
    )
    return quality.findings(partner, figures, now)


@dataclass(frozen=True)
class QuarantineEntry:
    identifier: str
    reason: str
    run_id: str
    quarantined_at: datetime


def recent_runs(conn: psycopg.Connection, partner_id: str, limit: int = 90) -> list[RunInfo]:
    """The partner's newest ``limit`` harvest runs (not reconciles), oldest first: the chart's data."""
    rows = conn.execute(
        f"""
        WITH newest AS (
            SELECT run_id FROM harvest_runs
            WHERE partner_id = %(pid)s AND channel = 'changes'
            ORDER BY started_at DESC LIMIT %(limit)s
        )
        SELECT {_RUN_COLUMNS}
        FROM harvest_runs h JOIN newest n ON h.run_id = n.run_id
        WHERE h.partner_id = %(pid)s
        GROUP BY h.run_id ORDER BY min(h.started_at)
        """,
        {"pid": partner_id, "limit": limit},
    ).fetchall()
    conn.commit()
    return [_run(row) for row in rows]


def quarantine_today(
    conn: psycopg.Connection, partner_id: str, now: datetime, limit: int = 50,
) -> tuple[list[tuple[str, int]], list[QuarantineEntry]]:
    """Since midnight UTC of ``now``: (reason, count) most frequent first, and the newest entries."""
    since = now.replace(hour=0, minute=0, second=0, microsecond=0)
    params = {"pid": partner_id, "since": since, "limit": limit}
    reasons = conn.execute(
        """
        SELECT reason, count(*) FROM quarantine WHERE partner_id = %(pid)s AND quarantined_at >= %(since)s
        GROUP BY reason ORDER BY count(*) DESC, reason LIMIT %(limit)s
        """,
        params,
    ).fetchall()
    entries = conn.execute(
        """
        SELECT identifier, reason, run_id, quarantined_at FROM quarantine
        WHERE partner_id = %(pid)s AND quarantined_at >= %(since)s
        ORDER BY quarantined_at DESC, id DESC LIMIT %(limit)s
        """,
        params,
    ).fetchall()
    conn.commit()
    return [(r, n) for r, n in reasons], [QuarantineEntry(*row) for row in entries]


def warnings_today(conn: psycopg.Connection, partner_id: str, now: datetime) -> list[tuple[str, int]]:
    """Since midnight UTC of ``now``: (check name, records that landed with its warning) from the
    runs applied since, most frequent first (formats/checks.py; docs/operator/validation.md)."""
    since = now.replace(hour=0, minute=0, second=0, microsecond=0)
    rows = conn.execute(
        """
        SELECT w.key, sum(w.value::bigint) FROM harvest_runs h, jsonb_each_text(h.warnings) AS w
        WHERE h.partner_id = %(pid)s AND h.applied_at >= %(since)s
        GROUP BY w.key ORDER BY sum(w.value::bigint) DESC, w.key
        """,
        {"pid": partner_id, "since": since},
    ).fetchall()
    conn.commit()
    return [(check, int(n)) for check, n in rows]
