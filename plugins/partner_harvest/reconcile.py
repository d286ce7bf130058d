"""The full reconcile: the partner's whole id set against the aggregation, no Airflow.

It is the only way to see deletions of a partner that never announces them (OAI-PMH
``deletedRecord`` ``no`` or ``transient``) and a safety net for every other partner.
A mass-purge guard refuses to apply when a sweep would remove more than a fraction of
the partner's records: a partner outage that lists nothing must never empty it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from partner_harvest.errors import HarvestError
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, StagingWriter, apply_run, begin_run, ensure_schema, fail_run, finish_harvest
from partner_harvest.store import reconcile as sql
from partner_harvest.window import Window

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

    def as_dict(self) -> dict[str, Any]:
        return {**self.plan.as_dict(), "fetched_missing": self.fetched_missing, "purged": self.purged,
                "upserted": self.upserted}


def reconcile(
    adapter: Any,
    conn: psycopg.Connection,
    partner: Partner,
    run_id: str,
    *,
    allow_mass_purge: bool = False,
) -> ReconcileResult:
    """Sweep, plan, guard, fetch what is missing, and apply it all in one transaction."""
    ensure_schema(conn)
    clock = adapter.clock()
    window = Window("reconcile", None, clock.now, clock.granularity, False, dict(clock.protocol))
    run = RunRef(partner.id, run_id, CHANNEL)
    begin_run(conn, run, window, window.protocol.get("metadata_prefix"))
    sweep = sql.IdSweepWriter(conn, partner.id, run_id)
    sweep.reset()
    stats = HarvestStats()
    try:
        adapter.sweep_ids(window, sweep, stats)
        plan = sql.plan(conn, partner.id, run_id)
        log.info("%s: reconcile plan: %s", partner.id, plan.as_dict())
        _guard(conn, run, partner, plan, allow_mass_purge)
        writer = StagingWriter(conn, run)
        removals = sql.stage_removals(conn, run, window.until, first_seq=0)
        writer.seq = removals
        fetched = 0
        for identifiers in sql.missing_identifiers(conn, partner.id, run_id, adapter.fetch_chunk):
            items = adapter.fetch_records(window, identifiers)
            writer.write_page(items)
            fetched += len(items)
            log.info("%s: reconcile fetched %d missing records so far", partner.id, fetched)
        stats.fetched = removals + fetched
        finish_harvest(conn, run, stats)
        result = apply_run(conn, partner.id, run_id)
    except Exception as exc:
        conn.rollback()
        if not isinstance(exc, MassPurgeRefused):
            fail_run(conn, run, " ".join(str(exc).split()))
        raise
    finally:
        sql.clear(conn, partner.id, run_id)
    outcome = ReconcileResult(plan, fetched, result.purged, result.upserted)
    log.info("%s: reconcile applied: %s", partner.id, outcome.as_dict())
    return outcome


def _guard(conn: psycopg.Connection, run: RunRef, partner: Partner, plan: sql.ReconcilePlan, allowed: bool) -> None:
    limit = partner.max_purge_fraction * plan.local
    if plan.local == 0 or plan.removals <= limit:
        return
    share = plan.removals / plan.local
    message = (
        f"reconcile would remove {plan.removals} of {plan.local} records ({share:.1%}; "
        f"{plan.vanished} absent upstream, {plan.deleted_upstream} listed as deleted), over the "
        f"{partner.max_purge_fraction:.0%} mass-purge limit; nothing was applied. If the partner "
        f"really removed them, trigger {partner.reconcile_dag_id} with the Param allow_mass_purge=true"
    )
    if allowed:
        log.warning("%s: %s — applying anyway: allow_mass_purge was set", partner.id, message.split("; nothing")[0])
        return
    fail_run(conn, run, message)
    raise MassPurgeRefused(partner.id, "reconcile", message)
