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
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache

import psycopg
from croniter import croniter
from psycopg import sql

from partner_harvest import partner_state, quality
from partner_harvest.gates import request_path, subject
from partner_harvest.partner_state import (  # noqa: F401  (the states, re-exported for the page and tests)
    BEHIND,
    FAILING,
    INVALID,
    NEVER_RUN,
    OK,
    QUIET,
    RETRYING,
    RUNNING,
    WARNING,
)
from partner_harvest.protocols import channels_for
from partner_harvest.registry import Partner, RegistryError
from partner_harvest.store import attached, events, gates
from partner_harvest.store.db import scalar
from partner_harvest.store.quality import RunFigures

# Partner states, worst first (partner_state.TABLE): what the health page sorts and colours by.
STATES = partner_state.NAMES
NEW, HEALTHY = NEVER_RUN, OK  # the names before the state table
# A partner clock this far from ours is shown (the demo simulators' clock stands still).
CLOCK_SHOWN_AFTER = timedelta(minutes=5)


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
    waiting_tasks: tuple[str, ...] = ()  # task ids up_for_retry / up_for_reschedule (between tries)
    retried_tasks: tuple[str, ...] = ()  # task ids on a later try, not finished (its retry under way)

    @property
    def run_id(self) -> str:
        return f"{self.dag_id}/{self.dag_run_id}"


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
    cause: str | None = None  # why the state (failing, retrying: the task's error; never run: a skip's reason)
    note: str | None = None  # what the newest run said without failing (a skip, an empty backfill)
    clock_offset: timedelta | None = None  # ours minus the partner's clock, as the cursor's run saw it
    partner_clock: datetime | None = None  # the partner's clock then
    last_harvest: RunInfo | None = None  # the newest applied incremental or full run ("last night")
    approval: gates.Request | None = None  # a run waiting at its approval gate for a person

    @property
    def state_slug(self) -> str:
        return partner_state.slug(self.state)

    @property
    def short_cause(self) -> str | None:
        """The cause's first line (the short cause, the task and the attempt); the rest is the full text."""
        return self.cause.splitlines()[0] if self.cause else None

    @property
    def approval_path(self) -> str | None:
        """The waiting request in Airflow's Required Actions, from the UI's root."""
        return request_path(self.approval) if self.approval is not None else None


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
      ORDER BY h.started_at DESC, h.run_id DESC LIMIT 1)
    UNION ALL
    (SELECT 'success', h.run_id FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.status = 'applied' AND h.channel = 'changes'
      ORDER BY h.started_at DESC, h.run_id DESC LIMIT 1)
    UNION ALL
    (SELECT 'harvest', h.run_id FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.status = 'applied' AND h.channel = 'changes' AND h.mode <> 'window'
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
         WHEN bool_or(h.status = 'waiting') THEN 'waiting'
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
    c.window_until, c.started_at, c.partner_clock,
    (SELECT h.applied_at FROM harvest_runs h
      WHERE h.partner_id = p.partner_id AND h.status = 'applied' AND h.fetched > 0
      ORDER BY h.started_at DESC, h.run_id DESC, h.channel DESC LIMIT 1),
    (SELECT min(h.started_at) FROM harvest_runs h WHERE h.partner_id = p.partner_id)
FROM p LEFT JOIN partner_stats s ON s.partner_id = p.partner_id
LEFT JOIN LATERAL (  -- the cursor: the newest applied incremental window, and the clock it was frozen at
    SELECT h.window_until, h.started_at, h.partner_clock FROM harvest_runs h
    WHERE h.partner_id = p.partner_id AND h.channel = 'changes' AND h.status = 'applied' AND h.mode = 'incremental'
    ORDER BY h.window_until DESC, h.started_at DESC, h.run_id DESC LIMIT 1
) c ON true
"""


def _run(row: Sequence) -> RunInfo:
    (run_id, status, started, ended, fetched, upserted, unchanged, purged, quarantined, error,
     announced, checks, until, held) = row
    return RunInfo(run_id, status, started, ended, fetched, upserted, unchanged, purged, quarantined,
                   error, announced, tuple(checks or ()), until, held)


@dataclass(frozen=True)
class _Facts:
    """What a partner's state is decided from (its audit rows and counters), however read."""

    held: int
    quarantined: int
    cursor: datetime | None
    cursor_started: datetime | None
    clock: datetime | None
    last_fetch_at: datetime | None
    first_run_at: datetime | None
    last: RunInfo | None  # the newest harvest run
    success: RunInfo | None  # the newest applied one
    harvest: RunInfo | None = None  # the newest applied incremental or full one (shown only)
    reconcile: RunInfo | None = None  # shown only
    pending: gates.Request | None = None  # the newest approval request waiting for a person
    success_approved: bool = False  # a person approved the purges of ``success`` at its gate


def partner_health(
    conn: psycopg.Connection, partners: Iterable[Partner], now: datetime,
    scheduler_runs: Mapping[str, SchedulerRun] | None = None,
    registry_errors: Iterable[RegistryError] = (),
) -> list[PartnerHealth]:
    """The health of every partner given (the registry's), worst state first.

    ``now`` is the reference clock (aware UTC): cursor lag and quiet periods are measured
    against it. Partners without any run are listed too (``never run``), and so is every
    invalid registry entry (``invalid``). ``scheduler_runs`` (partner id -> its newest
    harvest DAG run from Airflow's database, optional) tells a run between tries from a run
    going on; without it ``run_events`` (the tasks' callbacks) tell what they can. The
    state itself is ``partner_state.decide``: the page and the CLI share it. Reads only:
    the transaction is committed before returning, so a caller's connection is left idle.
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
    newest_events = events.newest(conn, [(p.id, p.dag_id) for p in partners])
    facts = {pid: _Facts(held, quarantined, cursor, cursor_started, clock, last_fetch_at, first_run_at,
                         last=runs.get((pid, "last")), success=runs.get((pid, "success")),
                         harvest=runs.get((pid, "harvest")), reconcile=runs.get((pid, "reconcile")))
             for pid, (held, quarantined, cursor, cursor_started, clock, last_fetch_at, first_run_at)
             in per_partner.items()}
    facts = _with_approvals(conn, ids, facts)
    conn.commit()
    return _rows(partners, facts, newest_events, scheduler_runs or {}, now, registry_errors)


def _with_approvals(conn: psycopg.Connection, ids: list[str], facts: dict[str, _Facts]) -> dict[str, _Facts]:
    """The facts with each partner's waiting approval request, and whether a person approved
    the purges of its newest successful run (no purge spike alert for those)."""
    pending = gates.pending_by_partner(conn, ids)
    approved = gates.approved_runs(conn, [(pid, f.success.run_id) for pid, f in facts.items() if f.success])
    return {pid: replace(f, pending=pending.get(pid),
                         success_approved=f.success is not None and (pid, f.success.run_id) in approved)
            for pid, f in ({**{pid: _NO_FACTS for pid in pending}, **facts}).items()}


# The index's read: one row per partner (partner_health_facts, kept by a trigger on
# harvest_runs: migration 0035) and its counters; nothing of harvest_runs itself.
_INDEX_FACTS = """
SELECT COALESCE(f.partner_id, s.partner_id), COALESCE(s.records_held, 0), COALESCE(s.quarantined_now, 0),
    f.cursor_until, f.cursor_started_at, f.cursor_clock, f.last_fetch_at, f.first_run_at,
    f.last_run_id, f.last_status, f.last_started_at, f.last_error,
    f.success_run_id, f.success_started_at, f.success_fetched, f.success_purged, f.success_quarantined,
    f.success_announced, f.success_failed_checks
FROM partner_health_facts f FULL JOIN partner_stats s ON s.partner_id = f.partner_id
"""
_NO_FACTS = _Facts(0, 0, None, None, None, None, None, None, None)


def index_health(
    conn: psycopg.Connection, partners: Iterable[Partner], now: datetime,
    scheduler_runs: Mapping[str, SchedulerRun] | None = None,
    registry_errors: Iterable[RegistryError] = (),
) -> list[PartnerHealth]:
    """Every partner's state, lag and sort keys for the health index, from one small row each.

    The same decision as :func:`partner_health` over the same facts, read from
    ``partner_health_facts`` instead of harvest_runs: 10,000 partners cost one scan of
    10,000 rows. The rows carry what the index filters and sorts by (state, cause, cursor
    lag, counters, the newest run's start), not what a page shows (the runs' counts, the
    last reconcile): show :func:`partner_health` of the partners on the page.
    """
    partners = list(partners)
    facts: dict[str, _Facts] = {}
    for (pid, held, quarantined, cursor, cursor_started, clock, last_fetch_at, first_run_at,
         last_id, last_status, last_started, last_error, success_id, success_started, fetched, purged,
         quarantined_run, announced, failed_checks) in conn.execute(_INDEX_FACTS):
        last = None if last_id is None else RunInfo(last_id, last_status, last_started, None, 0, 0, 0, 0, 0,
                                                    last_error)
        success = None if success_id is None else RunInfo(
            success_id, "applied", success_started, None, fetched, 0, 0, purged, quarantined_run, None, announced,
            tuple(failed_checks or ()))
        facts[pid] = _Facts(held, quarantined, cursor, cursor_started, clock, last_fetch_at, first_run_at,
                            last=last, success=success)
    newest_events = events.newest(conn, [(p.id, p.dag_id) for p in partners])
    facts = _with_approvals(conn, [p.id for p in partners], facts)
    conn.commit()
    return _rows(partners, facts, newest_events, scheduler_runs or {}, now, registry_errors, ordered=False)


def _rows(partners: list[Partner], facts: Mapping[str, _Facts], newest_events: Mapping[str, events.RunEvent],
          scheduler_runs: Mapping[str, SchedulerRun], now: datetime,
          registry_errors: Iterable[RegistryError], ordered: bool = True) -> list[PartnerHealth]:
    limits: dict[tuple[str, timedelta, timedelta], timedelta] = {}  # thousands of partners, a few schedules
    result = []
    for partner in partners:
        key = (partner.schedule, partner.run_deadline, partner.lag)
        limit = limits.get(key)
        if limit is None:
            limit = limits[key] = behind_after(partner, now)
        result.append(_health(partner, facts.get(partner.id, _NO_FACTS), newest_events.get(partner.id),
                              scheduler_runs.get(partner.id), now, limit))
    for error in registry_errors:
        result.append(PartnerHealth(
            partner_id=error.partner or "?", protocol="?", state=INVALID, last_run=None, last_success=None,
            last_reconcile=None, cursor=None, cursor_lag=None, behind_after=timedelta(0), records_held=0,
            quarantined_now=0, cause=str(error),
        ))
    if ordered:  # the index sorts as the operator asked (health_index.select_page)
        result.sort(key=lambda h: (STATES.index(h.state), h.partner_id))
    return result


def _health(partner: Partner, facts: _Facts, event: events.RunEvent | None, scheduled: SchedulerRun | None,
            now: datetime, limit: timedelta) -> PartnerHealth:
    """One partner's row: its state (partner_state.decide) and what the page shows of it;
    ``limit``: its ``behind_after``."""
    success = facts.success
    newest = newest_run(facts.last, event, scheduled, now)
    offset = facts.cursor_started - facts.clock if facts.cursor_started and facts.clock else None
    # How far the cursor trails the partner's clock now: ours minus the partner's offset.
    lag = now - (offset or timedelta(0)) - facts.cursor if facts.cursor else None
    alerts = _alerts(partner, success, facts.held, facts.last_fetch_at, facts.first_run_at, now,
                     facts.success_approved)
    quiet = success is not None and quality.is_quiet(partner, facts.last_fetch_at, facts.first_run_at, now)
    approval = _still_waiting(facts.pending, newest)
    state = partner_state.decide(
        invalid=False, newest_run=newest.status if newest else None, ever_applied=success is not None,
        behind=lag is not None and lag > limit, quiet=quiet, alerts=bool(alerts),
        awaiting_approval=approval is not None,
    )
    cause = newest.cause if newest and newest.status in (
        partner_state.RUN_FAILED, partner_state.RUN_RETRYING, partner_state.RUN_SKIPPED) else None
    if state == partner_state.AWAITING_APPROVAL and approval is not None:
        cause = f"asked {approval.requested_at:%Y-%m-%d %H:%M}Z in Required Actions: {subject(approval)}"
    return PartnerHealth(
        partner_id=partner.id, protocol=partner.protocol, state=state,
        last_run=newest.info if newest else None, last_success=success,
        last_reconcile=facts.reconcile, cursor=facts.cursor, cursor_lag=lag, behind_after=limit,
        records_held=facts.held, quarantined_now=facts.quarantined, alerts=tuple(alerts), cause=cause,
        note=newest.note if newest else None,
        clock_offset=offset if offset is not None and abs(offset) > CLOCK_SHOWN_AFTER else None,
        partner_clock=facts.clock, last_harvest=facts.harvest, approval=approval,
    )


def _still_waiting(request: gates.Request | None, newest: NewestRun | None) -> gates.Request | None:
    """The pending request, unless it belongs to the newest harvest run and that run has ended
    without its answer (failed, skipped or applied: the gate was failed or marked by hand)."""
    if request is None:
        return None
    ended = (partner_state.RUN_FAILED, partner_state.RUN_APPLIED, partner_state.RUN_SKIPPED)
    if newest is not None and newest.info.run_id == request.run_id and newest.status in ended:
        return None
    return request


@dataclass(frozen=True)
class NewestRun:
    """The partner's newest harvest run as the state table sees it."""

    status: str  # partner_state.RUN_*
    info: RunInfo  # what the page's "Last run" cell shows (its error: the cause)
    cause: str | None = None
    note: str | None = None


_AUDIT_STATUS = {"applied": partner_state.RUN_APPLIED, "failed": partner_state.RUN_FAILED,
                 "abandoned": partner_state.RUN_FAILED, "waiting": partner_state.RUN_RETRYING,
                 "running": partner_state.RUN_RUNNING}
_EVENT_STATUS = {events.FAILED: partner_state.RUN_FAILED, events.RETRY: partner_state.RUN_RETRYING,
                 events.SKIPPED: partner_state.RUN_SKIPPED, events.EMPTY: partner_state.RUN_SKIPPED}
_NOTHING_RECORDED = "the DAG run failed before it recorded anything: see its task logs"


def newest_run(audit: RunInfo | None, event: events.RunEvent | None, scheduled: SchedulerRun | None,
               now: datetime) -> NewestRun | None:
    """Which run is the partner's newest, and what it is doing, from three witnesses.

    ``audit``: its newest ``harvest_runs`` run; ``event``: its newest ``run_events`` row (a
    failed try, a skip: also of runs that never wrote ``harvest_runs``); ``scheduled``: its
    newest DAG run in Airflow's database (when the caller can read it), which alone tells a
    run between tries from a try going on, and knows a queued run.
    """
    candidates = [(a.started_at, a.run_id) for a in (audit,) if a is not None]
    candidates += [(e.at, e.run_id) for e in (event,) if e is not None]
    candidates += [(s.started_at or s.ended_at or now, s.run_id) for s in (scheduled,) if s is not None]
    if not candidates:
        return None
    run_id = max(candidates)[1]
    a = audit if audit is not None and audit.run_id == run_id else None
    e = event if event is not None and event.run_id == run_id else None
    s = scheduled if scheduled is not None and scheduled.run_id == run_id else None

    if s is not None and s.state == "failed":
        status = partner_state.RUN_FAILED
    elif s is not None and s.state in ("running", "queued"):
        # Between tries, and while the next try of a task whose try failed runs: one wait, one cause.
        retried = e is not None and e.kind == events.RETRY and e.task_id in s.retried_tasks
        status = partner_state.RUN_RETRYING if s.waiting_tasks or retried else partner_state.RUN_RUNNING
    elif a is not None:
        status = _AUDIT_STATUS.get(a.status, partner_state.RUN_RUNNING)
        if status != partner_state.RUN_APPLIED and e is not None and e.kind == events.FAILED:
            status = partner_state.RUN_FAILED  # its last try failed; the audit row stayed 'harvesting'
        elif a.status == "abandoned" and e is not None and e.kind == events.SKIPPED:
            status = partner_state.RUN_SKIPPED  # closed as a wait for the partner (run.wait), saying why
        elif status == partner_state.RUN_RUNNING and e is not None and e.kind == events.RETRY and s is None:
            status = partner_state.RUN_RETRYING  # without the scheduler: its newest word is a failed try
    elif e is not None:
        status = _EVENT_STATUS[e.kind]
    else:  # the scheduler says success, and nothing was harvested or said
        status = partner_state.RUN_SKIPPED

    said = e.message if e is not None else None
    cause = None
    if status == partner_state.RUN_FAILED:
        cause = (said if e.kind in (events.FAILED, events.RETRY) else None) if e else None
        cause = cause or (a.error if a is not None and a.error else _NOTHING_RECORDED)
    elif status == partner_state.RUN_RETRYING:
        cause = said if e is not None and e.kind == events.RETRY else (
            f"{', '.join(s.waiting_tasks)} waiting for its next try" if s is not None and s.waiting_tasks
            else "waiting for the time the partner named (or for another run's lease)")
    elif status == partner_state.RUN_SKIPPED:
        cause = said or "the run succeeded without harvesting (its tasks were skipped)"
    note = said if e is not None and e.kind in (events.SKIPPED, events.EMPTY) else None

    if a is not None:
        info = a
    else:
        started = (s.started_at if s is not None else None) or (e.at if e is not None else now)
        ended = (s.ended_at if s is not None else None) or (e.at if e is not None and status in (
            partner_state.RUN_FAILED, partner_state.RUN_SKIPPED) else None)
        info = RunInfo(run_id, "running", started, ended, 0, 0, 0, 0, 0, None)
    shown = {partner_state.RUN_FAILED: "failed", partner_state.RUN_RETRYING: "retrying",
             partner_state.RUN_SKIPPED: "skipped", partner_state.RUN_RUNNING: "running"}.get(status, info.status)
    if a is None or status in (partner_state.RUN_FAILED, partner_state.RUN_RETRYING, partner_state.RUN_SKIPPED):
        info = replace(info, status=shown, error=cause if cause is not None else info.error)
    return NewestRun(status, info, cause, note)


def _alerts(partner: Partner, success: RunInfo | None, held: int, last_fetch_at: datetime | None,
            first_run_at: datetime | None, now: datetime, purge_approved: bool = False) -> list[str]:
    """The data-quality findings (quality.findings) of the newest successful run."""
    if success is None:
        return []
    figures = RunFigures(
        fetched=success.fetched, purged=success.purged, quarantined=success.quarantined, held=held,
        last_fetch_at=last_fetch_at, first_run_at=first_run_at, announced=success.announced,
        failed_checks=success.failed_checks, purge_approved=purge_approved,
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


@dataclass(frozen=True)
class ChannelRow:
    """One channel of a partner (``changes``, or an extra channel: protocols.channels_for): its
    cursor (the newest applied incremental window's until), its newest applied run's counts,
    and for a channel filling an attached table (items, holdings) how many rows it holds."""

    channel: str
    table: str
    held: int | None
    cursor: datetime | None
    last_applied: datetime | None
    fetched: int | None
    upserted: int | None
    purged: int | None


_CHANNEL_NEWEST = """
SELECT DISTINCT ON (channel) channel, applied_at, fetched, upserted, purged FROM harvest_runs
WHERE partner_id = %(pid)s AND status = 'applied' AND channel = ANY(%(channels)s)
ORDER BY channel, applied_at DESC
"""
_CHANNEL_CURSORS = """
SELECT DISTINCT ON (channel) channel, window_until FROM harvest_runs
WHERE partner_id = %(pid)s AND status = 'applied' AND mode = 'incremental' AND channel = ANY(%(channels)s)
ORDER BY channel, started_at DESC, window_until DESC
"""


def channel_rows(conn: psycopg.Connection, partner: Partner) -> list[ChannelRow]:
    """The partner's channels, each with its own cursor, newest counts and (items, holdings) rows held."""
    channels = [("changes", None), *((c.name, c.entity) for c in channels_for(partner))]
    params = {"pid": partner.id, "channels": [name for name, _ in channels]}
    newest = {row[0]: row[1:] for row in conn.execute(_CHANNEL_NEWEST, params).fetchall()}
    cursors: dict[str, datetime] = {row[0]: row[1] for row in conn.execute(_CHANNEL_CURSORS, params).fetchall()}
    held: dict[str, int] = {}
    for name, entity in channels:
        if entity is not None and name == entity:  # the change channel of an attached table
            held[name] = int(scalar(conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE partner_id = %s").format(attached.table(entity)),
                (partner.id,))))
    records = conn.execute("SELECT records_held FROM partner_stats WHERE partner_id = %s", (partner.id,)).fetchone()
    conn.commit()
    held["changes"] = int(records[0]) if records else 0
    rows = []
    for name, entity in channels:
        applied_at, fetched, upserted, purged = newest.get(name, (None, None, None, None))
        rows.append(ChannelRow(name, entity or "records", held.get(name), cursors.get(name), applied_at,
                               fetched, upserted, purged))
    return rows
