"""A big partner's reconcile as slices: plan the sweep, sweep each slice on its own, settle.

A ListIdentifiers sweep of 2,000,000 headers is one token chain of hours; an expired token
or a failed task started it again from zero. Sliced (registry ``slicing.reconcile_slices``),
the sweep is cut into datestamp ranges (OAI-PMH, as a full harvest's slices: by counts, else
by what the first pages show) or bib id ranges (Sierra). One mapped task per lane (the
partner's pool slots, at most ``reconcile_slices``) sweeps slice after slice, the biggest
left first (store/reconcile_slices.claim); a failure costs one slice, not the sweep, and the
lane's retry resumes at it. With several lanes a big partner's sweep is cut finer and
neighbours joined into slices of falling size (pipeline.graded, as a sliced harvest), so the
lanes end together, even without counts. The settle step is the unsliced
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
from partner_harvest.pipeline import MIN_PIECE_RECORDS, PIECES_PER_LANE, graded
from partner_harvest.reconcile import CHANNEL, ReconcileResult, reconcile_window, settle
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, begin_run, ensure_schema, fail_run, fences
from partner_harvest.store import reconcile as sql
from partner_harvest.store import reconcile_slices as store
from partner_harvest.store.content import held_count
from partner_harvest.store.runs import record_failed_try
from partner_harvest.window import Slice, Window, as_utc, format_instant, parse_instant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepPlan:
    """What the sweep's tasks share (XCom): the frozen window, when it was planned, the slices
    and the lanes that sweep them (one piece each: what the mapped task maps over)."""

    window: Window
    planned_at: datetime
    slices: int
    lanes: int = 1

    def to_dict(self) -> dict[str, Any]:
        # to the microsecond: cut to the second, it would precede a run applied earlier in that second
        return {"window": self.window.to_dict(), "planned_at": as_utc(self.planned_at).isoformat(),
                "slices": self.slices,
                "pieces": [{"lane": n} for n in range(1, self.lanes + 1)]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepPlan:
        pieces = data["pieces"]  # a plan written before lanes: one piece per slice
        return cls(Window.from_dict(data["window"]), parse_instant(data["planned_at"]),
                   int(data.get("slices", len(pieces))), len(pieces))


def sweep_lanes(partner: Partner) -> int:
    """How many slices of the sweep run at once: the partner's pool (its concurrent requests),
    at most ``reconcile_slices``."""
    return max(1, min(partner.slicing.reconcile_slices, partner.pool_slots))


def plan_sweep(adapter: Adapter, conn: psycopg.Connection, partner: Partner, run_id: str,
               epoch: int | None = None) -> SweepPlan:
    """Freeze the reconcile's window, open its audit row, and record the sweep's slices
    (one open-ended slice for a partner below the threshold), numbered biggest first.

    With more than one lane and a partner big enough (pieces of at least
    ``MIN_PIECE_RECORDS`` of what it holds), the adapter cuts up to ``PIECES_PER_LANE`` times
    finer and neighbouring pieces are joined into slices of falling size, as a sliced
    harvest's (pipeline.graded): the lanes start on the big ones and end on small ones."""
    ensure_schema(conn)
    window = reconcile_window(adapter).with_facts(epoch=epoch)
    begin_run(conn, RunRef(partner.id, run_id, CHANNEL), window, window.protocol.metadata_prefix)
    settings = partner.slicing
    lanes = sweep_lanes(partner)
    finer = 1
    if lanes > 1:
        finer = max(1, min(PIECES_PER_LANE, held_count(conn, partner.id) // (settings.reconcile_slices * MIN_PIECE_RECORDS)))
    pieces = list(adapter.plan_sweep(window, min(settings.reconcile_slices * finer, 256), settings.threshold_records))
    if len(pieces) < 2:
        pieces = [Slice(until=window.until, open_end=True)]
    elif finer > 1:
        pieces = graded(pieces, lanes)
    elif all(p.estimate is not None for p in pieces):
        pieces.sort(key=lambda p: -(p.estimate or 0))  # the biggest first: lanes take them in this order
    planned_at = store.write_plan(conn, partner.id, run_id, pieces)
    lanes = min(lanes, len(pieces))
    log.info("%s: reconcile sweep in %d slice(s), %d lane(s): %s", partner.id, len(pieces), lanes,
             "; ".join(_describe(p) for p in pieces))
    return SweepPlan(window, planned_at, len(pieces), lanes)


def sweep_lane(adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, plan: SweepPlan,
               lane: int) -> list[tuple[int, HarvestStats]]:
    """One lane of the sweep: slice after slice (store/reconcile_slices.claim: its own
    unfinished one first, then the biggest nobody took), each as :func:`sweep_slice`, until
    none is left; a lane that finishes early takes what would have kept another waiting."""
    done: list[tuple[int, HarvestStats]] = []
    while (index := store.claim(conn, partner_id, run_id, lane)) is not None:
        done.append((index, sweep_slice(adapter, conn, partner_id, run_id, plan, index)))
    log.info("%s: reconcile sweep lane %d swept %s", partner_id, lane,
             ", ".join(f"slice {index}" for index, _ in done) or "no slice (none left)")
    return done


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
