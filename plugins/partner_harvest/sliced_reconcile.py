"""A big partner's reconcile as slices: plan the sweep, sweep each slice on its own, settle.

A ListIdentifiers sweep of 2,000,000 headers is one token chain of hours; an expired token
or a failed task started it again from zero. Sliced (registry ``slicing.reconcile_slices``),
the sweep is cut into datestamp ranges (OAI-PMH, as a full harvest's slices: by counts, else
by what the first pages show) or bib id ranges (Sierra), each swept by a mapped task retried
on its own: a failure costs one slice, not the sweep. The settle step is the unsliced
reconcile's own (reconcile.settle): the mass-purge guard, the verification of vanished
candidates, the removals, the missing records and the one-transaction apply; over the purge
limit behind the DAG's approval gate, the staged result waits for a person as there.

The three steps hold the run's reconcile lease (one tenure while it lives; every write
fenced by it and by the epoch the plan was made at) and each checks, in its own write's
transaction, that no other run of the partner applied since the plan
(store/reconcile_slices.check_not_stale): a lease that lapsed between tasks and let a
harvest in makes the rest refuse, never compare the partner with changed records.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg

from partner_harvest.adapters import Adapter
from partner_harvest.reconcile import CHANNEL, ReconcileResult, reconcile_window, settle
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, begin_run, ensure_schema, fail_run, fences
from partner_harvest.store import reconcile as sql
from partner_harvest.store import reconcile_slices as store
from partner_harvest.store.runs import record_failed_try
from partner_harvest.window import Slice, Window, as_utc, format_instant, parse_instant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepPlan:
    """What the sweep's tasks share (XCom): the frozen window, when it was planned, the slices."""

    window: Window
    planned_at: datetime
    slices: int

    def to_dict(self) -> dict[str, Any]:
        # to the microsecond: cut to the second, it would precede a run applied earlier in that second
        return {"window": self.window.to_dict(), "planned_at": as_utc(self.planned_at).isoformat(),
                "pieces": [{"slice": i} for i in range(1, self.slices + 1)]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepPlan:
        return cls(Window.from_dict(data["window"]), parse_instant(data["planned_at"]), len(data["pieces"]))


def plan_sweep(adapter: Adapter, conn: psycopg.Connection, partner: Partner, run_id: str,
               epoch: int | None = None) -> SweepPlan:
    """Freeze the reconcile's window, open its audit row, and record the sweep's slices
    (one open-ended slice for a partner below the threshold)."""
    ensure_schema(conn)
    window = reconcile_window(adapter).with_facts(epoch=epoch)
    begin_run(conn, RunRef(partner.id, run_id, CHANNEL), window, window.protocol.metadata_prefix)
    settings = partner.slicing
    pieces = list(adapter.plan_sweep(window, settings.reconcile_slices, settings.threshold_records))
    if len(pieces) < 2:
        pieces = [Slice(until=window.until, open_end=True)]
    planned_at = store.write_plan(conn, partner.id, run_id, pieces)
    log.info("%s: reconcile sweep in %d slice(s): %s", partner.id, len(pieces), "; ".join(_describe(p) for p in pieces))
    return SweepPlan(window, planned_at, len(pieces))


def sweep_slice(adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, plan: SweepPlan,
                index: int) -> HarvestStats:
    """Sweep slice ``index`` from its own start into reconcile_ids (its earlier rows dropped)."""
    bounds = store.start(conn, partner_id, run_id, index, plan.planned_at)
    piece = bounds.model_copy(update={"channel": f"{CHANNEL}/{index:03d}"})
    sub = replace(plan.window, from_=bounds.from_, until=bounds.until, protocol=plan.window.protocol.with_(slice=piece))
    stats = HarvestStats()
    try:
        adapter.sweep_ids(sub, sql.IdSweepWriter(conn, partner_id, run_id, slice=index), stats)
    except BaseException as exc:  # a task timeout too (store.runs.record_failed_try)
        record_failed_try(conn, exc, lambda e: store.fail(conn, partner_id, run_id, index, " ".join(str(e).split())))
        raise
    store.finish(conn, partner_id, run_id, index)
    log.info("%s: reconcile sweep slice %d (%s): %d ids in %d pages", partner_id, index, _describe(bounds),
             stats.fetched, stats.pages)
    return stats


def apply_sweep(adapter: Adapter, conn: psycopg.Connection, partner: Partner, run_id: str, plan: SweepPlan, *,
                allow_mass_purge: bool = False, gate: bool = False) -> ReconcileResult:
    """Once every slice is swept: sweep again any slice whose rows a crash lost, then settle
    (guard, verify, removals, missing, apply) exactly as an unsliced reconcile; ``gate`` as
    there: over the purge limit it stages the result, drops the slice state and waits
    (``awaiting_approval``) for the DAG's approval gate instead of refusing."""
    rows = store.rows(conn, partner.id, run_id)
    waiting = [f"{r.slice} ({r.status})" for r in rows if r.status != "swept"]
    run = RunRef(partner.id, run_id, CHANNEL)
    if not rows or waiting:
        message = (f"the sweep is not complete: slice(s) {', '.join(waiting) or 'none planned'} of "
                   f"{len(rows)}; nothing is applied (clear the failed slice to sweep it again)")
        fail_run(conn, run, message)
        raise store.SweepIncomplete(partner.id, "reconcile apply", message)
    for index in store.lost(conn, partner.id, run_id):
        log.warning("%s: the ids of reconcile sweep slice %d were lost (the database restarted?); sweeping it again",
                    partner.id, index)
        sweep_slice(adapter, conn, partner.id, run_id, plan, index)
    with conn.transaction():
        fences.check(conn, f"reconcile apply of run {run_id}")
        store.check_not_stale(conn, partner.id, run_id, plan.planned_at, f"reconcile apply of run {run_id}")
    return settle(adapter, conn, partner, run, plan.window, allow_mass_purge=allow_mass_purge, gate=gate)


def _describe(bounds: Slice) -> str:
    if bounds.lo is not None or bounds.hi is not None:
        return f"ids {bounds.lo or 0}..{bounds.hi if bounds.hi is not None else ''}"
    start = format_instant(bounds.from_) if bounds.from_ else "the beginning"
    return f"{start}..{'(open)' if bounds.open_end else format_instant(bounds.until)}"
