"""The approval gates' logic on real PostgreSQL, without Airflow (docs/operator/approvals.md):
the shrink a staged run would cause, a reject's cleanup, and the fence across the wait."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import gates
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.reconcile import apply_staged, reconcile
from partner_harvest.records import HarvestItem, Tombstone
from partner_harvest.run import run_partner
from partner_harvest.store import apply_run, ensure_schema, fences, leases
from partner_harvest.store import gates as store_gates
from partner_harvest.window import Window, WindowFacts
from tests.support.db import held
from tests.support.partners import oai_partner
from tests.support.records import T0, WINDOW, live_titles, rec, stage

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter

INCREMENTAL = Window("incremental", T0, T0 + timedelta(days=10), "day", True, WindowFacts(metadata_prefix="oai_dc"))
FULL = Window("full", None, T0 + timedelta(days=10), "day", False, WindowFacts(metadata_prefix="oai_dc"))


def seed(conn: psycopg.Connection, n: int = 20) -> None:
    ensure_schema(conn)
    stage(conn, "p", "seed", [rec(f"r{i:02d}", T0, f"title {i}") for i in range(n)])
    apply_run(conn, "p", "seed")


def test_shrink_counts_held_records_the_tombstones_purge_and_what_a_full_harvest_left_out(conn: psycopg.Connection) -> None:
    seed(conn)
    later = T0 + timedelta(days=1)
    # an incremental run: 6 tombstones of held records, one of a record never held, one
    # deletion superseded by a later re-add in the same run, and an edit
    items: list[HarvestItem] = [Tombstone(f"r{i:02d}", later) for i in range(6)]
    items += [Tombstone("never-held", later)]
    items += [Tombstone("r10", later), rec("r10", later + timedelta(hours=1), "back"), rec("r11", later, "edited")]
    stage(conn, "p", "nightly", items, window=INCREMENTAL)
    shrink = store_gates.measure_shrink(conn, "p", "nightly", whole_collection=False)
    assert (shrink.held, shrink.removals, shrink.absent) == (20, 6, 0)
    assert shrink.fraction == pytest.approx(0.30)
    assert [s["identifier"] for s in shrink.sample] == [f"r{i:02d}" for i in range(6)]
    assert shrink.sample[0]["title"] == "title 0"
    # a full harvest returning 12 of the 20 and deleting 2: 2 purged, 6 absent
    full = [rec(f"r{i:02d}", T0, f"title {i}") for i in range(8, 20)] + [Tombstone("r00", later), Tombstone("r01", later)]
    stage(conn, "p", "full", full, window=FULL)
    shrink = store_gates.measure_shrink(conn, "p", "full", whole_collection=True)
    assert (shrink.held, shrink.removals, shrink.absent) == (20, 2, 6)
    assert shrink.fraction == pytest.approx(0.40)
    assert {s["why"] for s in shrink.sample} == {"purged (tombstone)", "not returned by the full harvest (kept)"}


def test_the_gate_costs_no_query_when_nothing_can_shrink(conn: psycopg.Connection) -> None:
    partner = oai_partner("p")
    conn.close()  # a closed connection: any query would raise
    assert gates.harvest_shrink(conn, partner, "nightly", INCREMENTAL, tombstones=0) is None
    assert gates.covers_whole_collection(FULL) and not gates.covers_whole_collection(INCREMENTAL)
    assert gates.staged_tombstones([{"tombstones": 2}, None, {"tombstones": 3}]) == 5


def test_the_limit_is_the_partners_max_shrink_fraction(conn: psycopg.Connection) -> None:
    seed(conn)
    stage(conn, "p", "nightly", [Tombstone(f"r{i:02d}", T0 + timedelta(days=1)) for i in range(5)], window=INCREMENTAL)
    assert gates.harvest_shrink(conn, oai_partner("p"), "nightly", INCREMENTAL, 5) is None  # 25%: not over the default
    over = gates.harvest_shrink(conn, oai_partner("p", max_shrink_fraction=0.2), "nightly", INCREMENTAL, 5)
    assert over is not None and over.removals == 5


def test_reject_drops_the_staging_and_records_it_and_nothing_lands(conn: psycopg.Connection) -> None:
    seed(conn)
    before = live_titles(conn)
    high_water = conn.execute("SELECT high_water FROM partner_feed WHERE partner_id = 'p'").fetchone()
    stage(conn, "p", "nightly", [Tombstone(f"r{i:02d}", T0 + timedelta(days=1)) for i in range(10)], window=INCREMENTAL)
    shrink = store_gates.measure_shrink(conn, "p", "nightly", whole_collection=False)
    store_gates.open_request(conn, "p", "nightly", "harvest_p", "shrink", shrink, 0.25, 0)
    dropped = store_gates.abandon(conn, "p", "nightly", store_gates.REJECTED, "rejected at the approval gate by ada", "ada")
    assert dropped == 10
    assert conn.execute("SELECT count(*) FROM staging WHERE run_id = 'nightly'").fetchone() == (0,)
    assert conn.execute("SELECT status, error FROM harvest_runs WHERE run_id = 'nightly'").fetchone() == (
        "abandoned", "rejected at the approval gate by ada")
    request = store_gates.get_request(conn, "p", "nightly")
    assert request is not None and (request.state, request.decided_by, request.removals) == ("rejected", "ada", 10)
    assert live_titles(conn) == before
    assert conn.execute("SELECT count(*) FROM deletions").fetchone() == (0,)
    assert conn.execute("SELECT high_water FROM partner_feed WHERE partner_id = 'p'").fetchone() == high_water


def _approved_fence(conn: psycopg.Connection, run_id: str, epoch: int) -> fences.Fence:
    request = store_gates.get_request(conn, "p", run_id)
    assert request is not None
    with conn.transaction():
        token = leases.acquire(conn, "p", run_id, leases.HARVEST, timedelta(minutes=5))
    fence = fences.Fence("p", run_id, token, epoch)
    fence.applied_before = request.requested_at
    return fence


def test_a_run_applied_during_the_wait_makes_the_approved_apply_refuse(conn: psycopg.Connection) -> None:
    """The fence across the wait: another run's apply after the request changed a record the
    gated run would purge (it is back upstream), then the approval."""
    seed(conn)
    stage(conn, "p", "gated", [Tombstone(f"r{i:02d}", T0 + timedelta(days=1)) for i in range(10)], window=INCREMENTAL)
    shrink = store_gates.measure_shrink(conn, "p", "gated", whole_collection=False)
    store_gates.open_request(conn, "p", "gated", "harvest_p", "shrink", shrink, 0.25, 0)
    stage(conn, "p", "backfill", [rec("r05", T0 + timedelta(days=2), "newer")], window=WINDOW)
    apply_run(conn, "p", "backfill")  # during the wait: the state the request measured is gone
    store_gates.decide(conn, "p", "gated", store_gates.APPROVED, "ada")
    fences.bind(conn, _approved_fence(conn, "gated", 0))
    before = live_titles(conn)
    with pytest.raises(fences.NewerRunApplied, match="run backfill applied at .* after this run asked for approval"):
        apply_run(conn, "p", "gated")
    conn.rollback()
    assert live_titles(conn) == before and conn.execute("SELECT count(*) FROM deletions").fetchone() == (0,)


def test_an_operator_command_during_the_wait_makes_the_approved_apply_refuse(conn: psycopg.Connection) -> None:
    seed(conn)
    stage(conn, "p", "gated", [Tombstone(f"r{i:02d}", T0 + timedelta(days=1)) for i in range(10)], window=INCREMENTAL)
    shrink = store_gates.measure_shrink(conn, "p", "gated", whole_collection=False)
    store_gates.open_request(conn, "p", "gated", "harvest_p", "shrink", shrink, 0.25, 0)
    with conn.transaction():
        fences.bump_epoch(conn, "p", "reset-cursor")  # e.g. `partner-harvest reset-cursor` while it waits
    store_gates.decide(conn, "p", "gated", store_gates.APPROVED, "ada")
    fences.bind(conn, _approved_fence(conn, "gated", 0))
    with pytest.raises(fences.PartnerChanged, match="reset-cursor"):
        apply_run(conn, "p", "gated")
    conn.rollback()
    assert len(held(conn, "p")) == 20


def test_without_a_newer_run_the_approved_apply_applies_exactly_the_staged_run(conn: psycopg.Connection) -> None:
    seed(conn)
    stage(conn, "p", "gated", [Tombstone(f"r{i:02d}", T0 + timedelta(days=1)) for i in range(10)], window=INCREMENTAL)
    shrink = store_gates.measure_shrink(conn, "p", "gated", whole_collection=False)
    store_gates.open_request(conn, "p", "gated", "harvest_p", "shrink", shrink, 0.25, 0)
    store_gates.decide(conn, "p", "gated", store_gates.APPROVED, "ada")
    fences.bind(conn, _approved_fence(conn, "gated", 0))
    assert apply_run(conn, "p", "gated").purged == 10
    assert held(conn, "p") == {f"r{i:02d}" for i in range(10, 20)}


def test_a_gated_reconcile_stages_everything_and_applies_only_when_approved(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=200, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=61)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_partner(partner, build_adapter(partner, Endpoint(sim.base_url)), conn, "full")
        before = held(conn, "museum")
        gone = set(repo.delete(40))  # 20%: over the 5% purge limit
        added = set(repo.add(3))
        outcome = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec", gate=True)
        assert outcome.awaiting_approval and outcome.staged_removals == 40 and outcome.purged == 0
        assert held(conn, "museum") == before  # nothing applied while it waits
        assert conn.execute("SELECT status FROM harvest_runs WHERE run_id = 'rec'").fetchone() == ("harvested",)
        sample = store_gates.reconcile_sample(conn, "museum", "rec", "reconcile")
        assert len(sample) == 10 and {s["identifier"] for s in sample} <= gone
        applied = apply_staged(conn, "museum", "rec")
        assert applied["purged"] == 40 and applied["upserted"] == 3
        assert held(conn, "museum") == (before - gone) | added == repo.live_identifiers()


def test_a_harvest_applied_between_a_reconciles_settle_and_its_request_makes_the_approval_refuse(conn: psycopg.Connection) -> None:
    """The reconcile's lease ends with its task, before the gate opens the request: a harvest
    that applies in between changed what the sweep compared (here a record it would purge is
    back), so the approved apply's fence starts at the sweep, as a sliced reconcile's does."""
    repo = SimulatedRepository(records=100, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=62)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_partner(partner, build_adapter(partner, Endpoint(sim.base_url)), conn, "full")
        gone = sorted(repo.delete(20))
        outcome = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec", gate=True).as_dict()
    assert outcome["awaiting_approval"]
    back = rec(gone[0], T0 + timedelta(days=3650), "back upstream")
    stage(conn, "museum", "harvest-meanwhile", [back], window=WINDOW)
    apply_run(conn, "museum", "harvest-meanwhile")  # after the settle, before the gate's request
    shrink = gates.reconcile_shrink(conn, partner, "rec", outcome)
    request = store_gates.open_request(conn, "museum", "rec", "reconcile_museum", gates.PURGE, shrink, 0.05, 0)
    store_gates.decide(conn, "museum", "rec", store_gates.APPROVED, "ada")
    with conn.transaction():
        token = leases.acquire(conn, "museum", "rec", leases.RECONCILE, timedelta(minutes=5))
    fence = fences.Fence("museum", "rec", token, 0)
    fence.applied_before = gates.approval_since(request, outcome)
    assert fence.applied_before < request.requested_at
    before = held(conn, "museum")
    fences.bind(conn, fence)
    with pytest.raises(fences.NewerRunApplied, match="harvest-meanwhile"):
        apply_staged(conn, "museum", "rec")
    conn.rollback()
    fences.bind(conn, None)
    assert held(conn, "museum") == before


def test_a_quiet_night_and_a_night_of_other_edits_during_the_wait_leave_the_approval_valid(conn: psycopg.Connection) -> None:
    """Sunday's reconcile asks to purge 10 withdrawn records; Monday's nightly harvests run while
    it waits (a quiet one, then one that edits other records): the approval given after them
    still applies exactly the staged purge. Only a run that changed a record it would purge
    voids it; one that landed the records it would add (found missing) does not."""
    repo = SimulatedRepository(records=100, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=63)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()

        def adapter() -> Adapter:
            return build_adapter(partner, Endpoint(sim.base_url))

        cursors = run_partner(partner, adapter(), conn, "full").cursors
        gone = set(repo.delete(10))  # withdrawn: 10% against the 5% purge limit
        added = set(repo.add(2))  # new: the reconcile stages them as missing
        outcome = reconcile(adapter(), conn, partner, "rec", gate=True).as_dict()
        assert outcome["awaiting_approval"] and outcome["staged_removals"] == 10
        shrink = gates.reconcile_shrink(conn, partner, "rec", outcome)
        request = store_gates.open_request(conn, "museum", "rec", "reconcile_museum", gates.PURGE, shrink, 0.05, 0)
        repo.advance_clock(3600)
        night = run_partner(partner, adapter(), conn, "night-of-the-new", cursors)
        assert night.applied.upserted == 2 and added <= held(conn, "museum")
        repo.advance_clock(3600)
        quiet = run_partner(partner, adapter(), conn, "quiet-night", night.cursors)
        assert quiet.applied.fetched == 0 and quiet.applied.upserted == 0
        repo.advance_clock(3600)
        edited = set(repo.edit(5))
        busy = run_partner(partner, adapter(), conn, "busy-night", quiet.cursors)
        assert busy.applied.upserted == 5 and not edited & gone
    store_gates.decide(conn, "museum", "rec", store_gates.APPROVED, "curator")
    with conn.transaction():
        token = leases.acquire(conn, "museum", "rec", leases.RECONCILE, timedelta(minutes=5))
    fence = fences.Fence("museum", "rec", token, 0)
    fence.applied_before = gates.approval_since(request, outcome)
    fences.bind(conn, fence)
    applied = apply_staged(conn, "museum", "rec")
    fences.bind(conn, None)
    assert applied["purged"] == 10
    assert held(conn, "museum") == repo.live_identifiers()


def test_a_request_waiting_past_the_stale_run_limit_keeps_its_staging(conn: psycopg.Connection) -> None:
    """A run waiting for a person is not a stale run: the next night's freeze (which closes runs
    not applied within 7 days and drops their staging) leaves it for the answer, whatever
    approval_timeout says (``wait`` keeps a request open with no deadline)."""
    from partner_harvest.store.runs import abandon_stale_runs

    seed(conn)
    stage(conn, "p", "gated", [Tombstone(f"r{i:02d}", T0 + timedelta(days=1)) for i in range(10)], window=INCREMENTAL)
    shrink = store_gates.measure_shrink(conn, "p", "gated", whole_collection=False)
    store_gates.open_request(conn, "p", "gated", "harvest_p", "shrink", shrink, 0.25, 0)
    conn.execute("UPDATE harvest_runs SET started_at = now() - interval '8 days' WHERE run_id = 'gated'")
    conn.commit()
    assert abandon_stale_runs(conn, "p", timedelta(days=7)) == 0
    assert conn.execute("SELECT count(*) FROM staging WHERE run_id = 'gated'").fetchone() == (10,)
    store_gates.decide(conn, "p", "gated", store_gates.APPROVED, "ada")
    fences.bind(conn, _approved_fence(conn, "gated", 0))
    assert apply_run(conn, "p", "gated").purged == 10
