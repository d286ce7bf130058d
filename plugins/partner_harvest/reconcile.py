"""The full reconcile: the partner's whole id set against the aggregation, no Airflow.

It is the only way to see deletions of a partner that never announces them (OAI-PMH
``deletedRecord`` ``no`` or ``transient``) and a safety net for every other partner.
A mass-purge guard refuses to apply when a sweep would remove more than a fraction of
the partner's records: a partner outage that lists nothing must never empty it.

Nothing the partner still holds is purged: an adapter that can (``verify_vanished``)
asks the partner about every vanished candidate, within a budget, before it becomes a
tombstone. Many missing records (over ``bulk_missing_threshold``) come back through one
ListRecords stream instead of one request each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg

from partner_harvest import content_check
from partner_harvest.adapters import Adapter
from partner_harvest.errors import HarvestError
from partner_harvest.protocols import channels_for
from partner_harvest.records import HarvestStats, Tombstone
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, StagingWriter, apply_run, begin_run, ensure_schema, fail_run, finish_harvest
from partner_harvest.store import reconcile as sql
from partner_harvest.store.db import scalar
from partner_harvest.store.runs import record_failed_try
from partner_harvest.window import Window, WindowFacts, as_utc

log = logging.getLogger(__name__)

CHANNEL = "reconcile"


class MassPurgeRefused(HarvestError):
    """The sweep would remove too much; nothing was applied. Never retried."""

    retryable = False


@dataclass(frozen=True)
class ReconcileResult:
    plan: sql.ReconcilePlan
    fetched_missing: int
    purged: int
    upserted: int
    # Answers about vanished candidates: gone (idDoesNotExist), deleted (deleted header),
    # live (the sweep missed it: kept and refreshed), unverified (over budget: kept).
    verified: dict[str, int] = field(default_factory=dict)
    bulk_fetch: bool = False  # missing records came through one list stream
    # Over the purge limit with a gate: staged (status harvested), not applied; a person decides.
    awaiting_approval: bool = False
    staged_removals: int = 0
    # When the sweep began (the database's clock): an approved apply refuses if another run of
    # the partner applied since (gates.approval_since), the lease having ended with the task.
    planned_at: datetime | None = None
    # The content check (content_check.py): sampled, silent changes, requests, a refresh due
    content: dict[str, Any] = field(default_factory=dict)
    # Each attached table it also settled (items, holdings): what it held, the removals staged.
    attached: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {**self.plan.as_dict(), "fetched_missing": self.fetched_missing, "purged": self.purged,
               "upserted": self.upserted, "verified": dict(self.verified), "bulk_fetch": self.bulk_fetch,
               "awaiting_approval": self.awaiting_approval, "staged_removals": self.staged_removals,
               "content": dict(self.content),
               "attached": {entity: dict(figures) for entity, figures in self.attached.items()}}
        if self.planned_at is not None:  # to the microsecond, as a sliced plan's (sliced_reconcile.SweepPlan)
            out["planned_at"] = as_utc(self.planned_at).isoformat()
        return out


def reconcile(
    adapter: Adapter,
    conn: psycopg.Connection,
    partner: Partner,
    run_id: str,
    *,
    allow_mass_purge: bool = False,
    gate: bool = False,
) -> ReconcileResult:
    """Sweep, plan, guard, fetch what is missing, and apply it all in one transaction.

    ``gate``: a reconcile over the purge limit is staged whole and left unapplied
    (``awaiting_approval``) for a person to approve (the DAG's approval gate, which applies
    it with :func:`apply_staged`) instead of refused; scripts keep ``allow_mass_purge``."""
    ensure_schema(conn)
    window = reconcile_window(adapter)
    planned_at = scalar(conn.execute("SELECT clock_timestamp()"))
    run = RunRef(partner.id, run_id, CHANNEL)
    begin_run(conn, run, window, window.protocol.metadata_prefix)
    sweep = sql.IdSweepWriter(conn, partner.id, run_id)
    sweep.reset()
    stats = HarvestStats()
    try:
        adapter.sweep_ids(window, sweep, stats)
    except BaseException as exc:  # a task timeout too (store.runs.record_failed_try)
        def record(failure: BaseException) -> None:
            fail_run(conn, run, " ".join(str(failure).split()))
            sql.clear(conn, partner.id, run_id)

        record_failed_try(conn, exc, record)
        raise
    outcome = settle(adapter, conn, partner, run, window, allow_mass_purge=allow_mass_purge, gate=gate)
    return replace(outcome, planned_at=planned_at)


def reconcile_window(adapter: Adapter) -> Window:
    """The reconcile's frozen facts: the partner's clock now, the whole history."""
    clock = adapter.clock()
    return Window("reconcile", None, clock.now, clock.granularity, False, WindowFacts.model_validate(clock.protocol))


def settle(adapter: Adapter, conn: psycopg.Connection, partner: Partner, run: RunRef, window: Window, *,
           allow_mass_purge: bool = False, gate: bool = False) -> ReconcileResult:
    """After the sweep (whole, or every slice of it): plan, guard, verify, stage the removals,
    fetch what is missing, and apply it all in one transaction; the swept ids go either way."""
    stats = HarvestStats()
    sweep = sql.IdSweepWriter(conn, partner.id, run.run_id)  # verification answers: slice 0
    try:
        plan = sql.plan(conn, partner.id, run.run_id)
        log.info("%s: reconcile plan: %s", partner.id, plan.as_dict())
        held_back = _guard(conn, run, partner, plan, allow_mass_purge, gate)
        writer = StagingWriter(conn, run)
        verified = _verify_vanished(adapter, conn, partner, run, window, sweep, writer, allow_mass_purge)
        removals = sql.stage_removals(conn, run, first_seq=writer.seq)
        writer.seq += removals
        fetched, bulk = _fetch_missing(adapter, conn, partner, run, window, writer)
        found = content_check.check(adapter, conn, partner, run, window, writer).as_dict()
        stats.fetched = writer.seq  # everything staged: the apply's four outcomes add up to it
        finish_harvest(conn, run, stats)
        attached: dict[str, dict[str, int]] = {}
        for entity in attached_entities(partner):  # items, holdings: swept and settled the same way
            local, entity_removals, entity_held_back = _settle_attached(adapter, conn, partner, run, window, entity,
                                                                        allow_mass_purge, gate)
            attached[entity] = {"local": local, "staged_removals": entity_removals}
            held_back = held_back or entity_held_back
        if held_back:
            log.warning("%s: reconcile staged %d removals (%s) and waits for approval before its apply", partner.id,
                        removals, attached or "no items or holdings")
            return ReconcileResult(plan, fetched, 0, 0, verified, bulk, awaiting_approval=True,
                                   staged_removals=removals, content=found, attached=attached)
        result = apply_run(conn, partner.id, run.run_id)
    except BaseException as exc:  # a task timeout too (store.runs.record_failed_try)
        if isinstance(exc, MassPurgeRefused):
            conn.rollback()
        else:
            record_failed_try(conn, exc, lambda e: fail_run(conn, run, " ".join(str(e).split())))
        raise
    finally:
        sql.clear(conn, partner.id, run.run_id)
    outcome = ReconcileResult(plan, fetched, result.purged, result.upserted, verified, bulk, content=found,
                              attached=attached)
    log.info("%s: reconcile applied: %s", partner.id, outcome.as_dict())
    return outcome


def attached_entities(partner: Partner) -> list[str]:
    """The attached tables (items, holdings) the partner's channels fill (protocols.Channel.entity)."""
    return sorted({channel.entity for channel in channels_for(partner) if channel.entity})


def _settle_attached(adapter: Adapter, conn: psycopg.Connection, partner: Partner, run: RunRef, window: Window,
                     entity: str, allow_mass_purge: bool, gate: bool) -> tuple[int, int, bool]:
    """One attached table: its ids swept (the adapter walks id ranges: ``window.protocol.entity``
    names the table), planned against what is held, guarded by the same mass-purge limit,
    its removals staged and its missing rows fetched, on a channel of its own
    (``reconcile/<table>``) of the same run, applied in the same transaction. Returns what
    it held, the removals staged and whether the guard holds the apply back for a person."""
    own = RunRef(partner.id, run.run_id, f"{CHANNEL}/{entity}")
    key = sql.sweep_key(run.run_id, entity)
    sub = window.with_facts(entity=entity)
    begin_run(conn, own, sub, None)
    sweep = sql.IdSweepWriter(conn, partner.id, key)
    sweep.reset()
    adapter.sweep_ids(sub, sweep, HarvestStats())
    plan = sql.plan(conn, partner.id, key, entity)
    log.info("%s: reconcile plan of %s: %s", partner.id, entity, plan.as_dict())
    held_back = _guard(conn, own, partner, plan, allow_mass_purge, gate, entity)
    writer = StagingWriter(conn, own)
    removals = sql.stage_removals(conn, own, 0, entity, key)
    writer.seq = removals
    for identifiers in sql.missing_identifiers(conn, partner.id, key, adapter.fetch_chunk, entity, own):
        writer.write_page(adapter.fetch_records(sub, identifiers))
    stats = HarvestStats()
    stats.fetched = writer.seq
    finish_harvest(conn, own, stats)
    return plan.local, removals, held_back


def _verify_vanished(
    adapter: Adapter, conn: psycopg.Connection, partner: Partner, run: RunRef, window: Window,
    sweep: sql.IdSweepWriter, writer: StagingWriter, unbounded: bool = False,
) -> dict[str, int]:
    """Confirm each vanished candidate with the partner before it may become a tombstone.

    A live answer is staged (the apply refreshes or keeps it) and recorded as listed; a
    deleted answer is recorded with its deletion datestamp; idDoesNotExist leaves the
    candidate vanished. Candidates beyond ``verify_limit`` are kept for the next reconcile,
    unless the operator allowed a mass purge: then every candidate is verified (a long
    run, once, instead of a refusal every week until the budget has worked through them).
    """
    counts = {"gone": 0, "deleted": 0, "live": 0, "unverified": 0}
    budget = adapter.verify_limit
    if budget is None:  # the protocol's sweep is authoritative (Adapter.verify_limit)
        return counts
    if not unbounded:
        counts["unverified"] = sql.keep_unverified(conn, partner.id, run.run_id, budget)
    if counts["unverified"]:
        log.warning(
            "%s: %d vanished records beyond the verification budget of %d are kept; the next "
            "reconcile verifies them", partner.id, counts["unverified"], budget,
        )
    for chunk in sql.vanished_identifiers(conn, partner.id, run.run_id, adapter.fetch_chunk):
        answers = adapter.verify_vanished(window, chunk)
        listed: list[tuple[str, Any, bool]] = []
        live: list[Any] = []
        for identifier, item in answers:
            if item is None:
                counts["gone"] += 1
            elif isinstance(item, Tombstone):
                counts["deleted"] += 1
                listed.append((identifier, item.datestamp, True))
            else:  # a Record, or a Rejected one: either way the partner still holds it
                counts["live"] += 1
                listed.append((identifier, getattr(item, "datestamp", None), False))
                live.append(item)
        sweep.write_page(listed)
        writer.write_page(live)
    if any(counts.values()):
        log.info("%s: vanished candidates verified: %s", partner.id, counts)
    return counts


def _fetch_missing(
    adapter: Adapter, conn: psycopg.Connection, partner: Partner, run: RunRef, window: Window,
    writer: StagingWriter,
) -> tuple[int, bool]:
    """Stage the live records the aggregation lacks; returns (how many, whether in bulk).

    Past the adapter's ``bulk_missing_threshold`` one list stream over the missing
    records' datestamp range (the whole list if one has no datestamp) replaces a request
    per record; what it did not return (edited past the clock since) goes by id.
    """
    start = writer.seq
    bulk = False
    threshold = adapter.bulk_missing_threshold
    if threshold is not None:
        missing, oldest, undated = sql.missing_span(conn, partner.id, run.run_id)
        if missing > threshold:
            bulk = True
            since = None if undated or oldest is None else oldest
            span = Window("reconcile", since, window.until, window.granularity, False, window.protocol)
            log.info("%s: %d records missing; fetching them with one list stream: %s",
                     partner.id, missing, span.describe())
            sink = sql.MissingOnlySink(conn, writer, partner.id)
            adapter.harvest(span, sink, HarvestStats())
            log.info("%s: reconcile list stream staged %d missing records", partner.id, sink.staged)
    for identifiers in sql.missing_identifiers(conn, partner.id, run.run_id, adapter.fetch_chunk):
        writer.write_page(adapter.fetch_records(window, identifiers))
        log.info("%s: reconcile fetched %d missing records so far", partner.id, writer.seq - start)
    return writer.seq - start, bulk


def apply_staged(conn: psycopg.Connection, partner_id: str, run_id: str) -> dict[str, int]:
    """Apply a reconcile a person approved: exactly what it staged (the fence of the
    connection refuses when the partner changed during the wait, store/fences.py)."""
    ensure_schema(conn)
    try:
        result = apply_run(conn, partner_id, run_id)
    except BaseException as exc:  # a task timeout too (store.runs.record_failed_try)
        record_failed_try(conn, exc, lambda e: fail_run(conn, RunRef(partner_id, run_id, CHANNEL),
                                                      " ".join(f"apply failed: {e}".split())))
        raise
    log.info("%s: approved reconcile applied: %s", partner_id, result.as_dict())
    return result.as_dict()


def purge_refusal(partner: Partner, plan: sql.ReconcilePlan, what: str = "records") -> str | None:
    """Why the plan would purge more than ``max_purge_fraction`` of the partner's records (or
    of its ``what``: items, holdings) (the message an operator reads), or None when it stays
    within. The one place that decides it: the guard below, and anything that asks a human
    first, call this."""
    limit = partner.max_purge_fraction * plan.local
    if plan.local == 0 or plan.removals <= limit:
        return None
    share = plan.removals / plan.local
    return (
        f"reconcile would remove {plan.removals} of {plan.local} {what} ({share:.1%}; "
        f"{plan.vanished} absent upstream, {plan.deleted_upstream} listed as deleted), over the "
        f"{partner.max_purge_fraction:.0%} mass-purge limit; nothing was applied. If the partner "
        f"really removed them, trigger {partner.reconcile_dag_id} with the Param allow_mass_purge=true"
    )


def _guard(conn: psycopg.Connection, run: RunRef, partner: Partner, plan: sql.ReconcilePlan, allowed: bool,
           gate: bool = False, what: str = "records") -> bool:
    """True when the plan is over the limit and a gate will ask a person; raises without a gate."""
    message = purge_refusal(partner, plan, what)
    if message is None:
        return False
    if allowed:
        log.warning("%s: %s — applying anyway: allow_mass_purge was set", partner.id, message.split("; nothing")[0])
        return False
    if gate:
        log.warning("%s: %s — staging it for a person's approval at the gate", partner.id, message.split("; nothing")[0])
        return True
    fail_run(conn, run, message)
    raise MassPurgeRefused(partner.id, "reconcile", message)
