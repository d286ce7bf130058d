"""A big partner's reconcile as slices, without Airflow: the OAI-PMH and
Sierra simulators on loopback, real PostgreSQL. The harness plays the DAG: plan_sweep, one
sweep_ids per slice or per lane (in any order, one failing and retried alone), apply_reconcile; the
fenced tests bind a real lease's fence to the connection, as the tasks do."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest import gates
from partner_harvest import sliced_reconcile as sliced
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.errors import BadResumptionToken
from partner_harvest.reconcile import MassPurgeRefused, apply_staged, purge_refusal
from partner_harvest.registry import Partner
from partner_harvest.store import apply_run, fences, leases
from partner_harvest.store import gates as store_gates
from partner_harvest.store.fences import PartnerChanged
from partner_harvest.store.reconcile_slices import SweepIncomplete, SweepStale, rows
from tests.support.db import held
from tests.support.harness import run_once
from tests.support.partners import oai_partner, sierra_partner
from tests.support.records import T0, rec, stage

SLICED = {"threshold_records": 300, "target_records": 150, "reconcile_slices": 4}
RUN = "reconcile_museum/manual__1"


def harvested(sim: OaiSimulator, conn: psycopg.Connection, partner: Partner) -> None:
    run_once(sim, conn, partner, run_id="first")


def changed_upstream(repo: SimulatedRepository) -> tuple[set[str], set[str]]:
    """Records vanished without a tombstone, and new ones the nightly run has not seen."""
    return set(repo.delete(30)), set(repo.add(9))


@pytest.fixture
def museum() -> Iterator[tuple[OaiSimulator, SimulatedRepository]]:
    repo = SimulatedRepository(records=800, page_size=100, seed=41, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        yield sim, repo


def test_a_sliced_reconcile_sweeps_datestamp_ranges_and_converges_exactly(conn: psycopg.Connection,
                                                                          museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = museum
    partner = oai_partner(slicing=SLICED)
    harvested(sim, conn, partner)
    vanished, added = changed_upstream(repo)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    sim.clear_requests()
    plan = sliced.plan_sweep(make(), conn, partner, RUN)
    assert plan.slices == 4
    for index in (3, 1, 4, 2):  # any order
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, index)
    result = sliced.apply_sweep(make(), conn, partner, RUN, plan)
    assert result.plan.vanished == 30 and result.purged == 30 and result.fetched_missing == 9
    assert held(conn, partner.id) == repo.live_identifiers()
    sweeps = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "resumptionToken" not in r]
    last = [r for r in sweeps if "from" in r and "until" not in r]
    assert len(last) == 1  # the last slice is open-ended: records edited meanwhile land in it
    assert conn.execute("SELECT count(*) FROM reconcile_ids").fetchone() == (0,)


def test_a_failed_slice_is_retried_alone_and_converges_exactly(conn: psycopg.Connection,
                                                               museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """One slice fails mid-way (its token expires after its first page was staged, and the
    partner allows no restart); its retry sweeps only its own range again, from its own
    start, the others keep theirs, and the apply is exact."""
    sim, repo = museum
    partner = oai_partner(slicing=SLICED, max_token_restarts=0)
    harvested(sim, conn, partner)
    changed_upstream(repo)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    plan = sliced.plan_sweep(make(), conn, partner, RUN)
    for index in (1, 3, 4):
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, index)
    sim.expire_tokens_after(1)  # the slice's chain breaks after its first page
    with pytest.raises(BadResumptionToken):
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 2)
    assert conn.execute("SELECT pages, swept > 0 FROM reconcile_slices WHERE slice = 2").fetchone() == (1, True)
    with pytest.raises(SweepIncomplete, match="slice.*2 \\(failed\\)"):
        sliced.apply_sweep(make(), conn, partner, RUN, plan)
    sim.clear_requests()
    sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 2)
    assert {r.slice: r.status for r in rows(conn, partner.id, RUN)} == dict.fromkeys((1, 2, 3, 4), "swept")
    attempts: dict[int, int] = dict(conn.execute("SELECT slice, attempts FROM reconcile_slices WHERE run_id = %s", (RUN,)).fetchall())
    assert attempts == {1: 1, 2: 2, 3: 1, 4: 1}  # the refused apply marked nothing; slice 2 alone again
    firsts = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "resumptionToken" not in r]
    assert len(firsts) == 1  # the retry listed its own range only
    sliced.apply_sweep(make(), conn, partner, RUN, plan)
    assert held(conn, partner.id) == repo.live_identifiers()


def test_lanes_take_the_biggest_slice_left_and_a_failed_lane_resumes_at_its_own(
        conn: psycopg.Connection, museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """Two lanes (the partner's pool of 2): the slices numbered biggest first, each lane takes
    the next nobody took; a lane that fails mid-slice keeps that slice: the other lane sweeps
    every other one, never it, and the failed lane's retry resumes at it alone; exact apply."""
    sim, repo = museum
    partner = oai_partner(slicing=SLICED, pool_slots=2, max_token_restarts=0)
    harvested(sim, conn, partner)
    changed_upstream(repo)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    plan = sliced.plan_sweep(make(), conn, partner, RUN)
    assert (plan.slices, plan.lanes) == (4, 2)  # 800 records: too few to cut finer
    assert sliced.SweepPlan.from_dict(plan.to_dict()) == plan
    assert [piece["lane"] for piece in plan.to_dict()["pieces"]] == [1, 2]
    estimates = [r.bounds.estimate or 0 for r in rows(conn, partner.id, RUN)]
    assert estimates == sorted(estimates, reverse=True) and estimates[0] > estimates[-1]
    sim.expire_tokens_after(1)  # lane 1's first slice breaks after its first page
    with pytest.raises(BadResumptionToken):
        sliced.sweep_lane(make(), conn, partner.id, RUN, plan, 1)
    assert [index for index, _ in sliced.sweep_lane(make(), conn, partner.id, RUN, plan, 2)] == [2, 3, 4]
    with pytest.raises(SweepIncomplete, match="slice.*1 \\(failed\\)"):
        sliced.apply_sweep(make(), conn, partner, RUN, plan)
    assert [index for index, _ in sliced.sweep_lane(make(), conn, partner.id, RUN, plan, 1)] == [1]
    assert sliced.sweep_lane(make(), conn, partner.id, RUN, plan, 2) == []  # nothing left
    found = conn.execute("SELECT slice, lane, attempts FROM reconcile_slices WHERE run_id = %s ORDER BY slice",
                         (RUN,)).fetchall()
    assert found == [(1, 1, 2), (2, 2, 1), (3, 2, 1), (4, 2, 1)]
    sliced.apply_sweep(make(), conn, partner, RUN, plan)
    assert held(conn, partner.id) == repo.live_identifiers()


def test_with_several_lanes_a_big_partner_is_cut_finer_into_slices_of_falling_size(
        conn: psycopg.Connection, museum: tuple[OaiSimulator, SimulatedRepository],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Big enough (pieces of at least MIN_PIECE_RECORDS; lowered here for 800 records), the
    sweep of 2 lanes is cut up to 8 times finer and joined into slices of falling size that
    cover the whole list, the last one open-ended; the lanes converge exactly."""
    sim, repo = museum
    monkeypatch.setattr(sliced, "MIN_PIECE_RECORDS", 10)
    partner = oai_partner(slicing={**SLICED, "reconcile_slices": 2}, pool_slots=2)
    harvested(sim, conn, partner)
    vanished, added = changed_upstream(repo)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    plan = sliced.plan_sweep(make(), conn, partner, RUN)
    found = rows(conn, partner.id, RUN)
    assert plan.lanes == 2 and plan.slices == len(found) > 4
    estimates = [r.bounds.estimate or 0 for r in found]
    assert estimates == sorted(estimates, reverse=True) and estimates[0] > 2 * estimates[-1]
    assert [r.bounds.open_end for r in found].count(True) == 1
    for lane in (2, 1):
        sliced.sweep_lane(make(), conn, partner.id, RUN, plan, lane)
    result = sliced.apply_sweep(make(), conn, partner, RUN, plan)
    assert (result.purged, result.fetched_missing) == (len(vanished), len(added))
    assert held(conn, partner.id) == repo.live_identifiers()


@pytest.mark.slow
def test_a_slice_whose_ids_the_database_lost_is_swept_again_by_the_apply(conn: psycopg.Connection,
                                                                         museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = museum
    partner = oai_partner(slicing=SLICED)
    harvested(sim, conn, partner)
    changed_upstream(repo)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    plan = sliced.plan_sweep(make(), conn, partner, RUN)
    for index in range(1, 5):
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, index)
    conn.execute("DELETE FROM reconcile_ids WHERE run_id = %s AND slice = 3", (RUN,))  # as a crash empties it
    conn.commit()
    result = sliced.apply_sweep(make(), conn, partner, RUN, plan)
    assert result.purged == 30  # not the ~200 records of slice 3: the guard would refuse, or purge them
    assert held(conn, partner.id) == repo.live_identifiers()


def _fenced(conn: psycopg.Connection, partner_id: str, holder: str = RUN, epoch: int | None = None) -> fences.Fence:
    token = leases.acquire(conn, partner_id, holder, leases.RECONCILE, timedelta(minutes=5))
    fence = fences.Fence(partner_id, holder, token, epoch if epoch is not None else fences.current_epoch(conn, partner_id))
    conn.commit()
    fences.bind(conn, fence)
    return fence


def test_a_slice_refuses_after_an_operator_command_changed_the_partner(conn: psycopg.Connection,
                                                                       museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = museum
    partner = oai_partner(slicing=SLICED)
    harvested(sim, conn, partner)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    fence = _fenced(conn, partner.id)
    plan = sliced.plan_sweep(make(), conn, partner, RUN, fence.epoch)
    sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 1)
    with conn.transaction():
        fences.bump_epoch(conn, partner.id, "forget")  # in its own transaction, as the command
    before = conn.execute("SELECT count(*) FROM reconcile_ids WHERE slice = 2").fetchone()
    with pytest.raises(PartnerChanged, match="forget"):
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 2)
    assert conn.execute("SELECT count(*) FROM reconcile_ids WHERE slice = 2").fetchone() == before == (0,)
    assert {r.slice: r.status for r in rows(conn, partner.id, RUN)}[2] == "planned"
    fences.bind(conn, None)


def test_a_slice_refuses_when_its_lease_lapsed_and_a_harvest_applied_meanwhile(conn: psycopg.Connection,
                                                                               museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """The reconcile's lease lapsed between its tasks, a harvest took the partner and applied:
    a slice's retry takes a new tenure but refuses to write (its sweep would be stale), in
    the transaction of its start, and so does the apply; nothing is purged."""
    sim, repo = museum
    partner = oai_partner(slicing=SLICED)
    harvested(sim, conn, partner)
    make = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    fence = _fenced(conn, partner.id)
    plan = sliced.plan_sweep(make(), conn, partner, RUN, fence.epoch)
    sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 1)
    fences.bind(conn, None)
    conn.execute("UPDATE partner_leases SET expires_at = now() - interval '1 second' WHERE holder = %s", (RUN,))
    conn.commit()
    fresh = set(repo.add(5))
    leases.acquire(conn, partner.id, "harvest-meanwhile", leases.HARVEST, timedelta(minutes=5))  # takes the partner
    run_once(sim, conn, partner, run_id="harvest-meanwhile")  # and applies
    leases.release(conn, partner.id, "harvest-meanwhile")
    with pytest.raises(fences.LeaseLost):  # the old tenure is gone: its fence says so
        fences.bind(conn, fence)
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 2)
    _fenced(conn, partner.id, epoch=fence.epoch)  # the retry's new tenure
    with pytest.raises(SweepStale, match="harvest-meanwhile"):
        sliced.sweep_slice(make(), conn, partner.id, RUN, plan, 2)
    with pytest.raises((SweepStale, SweepIncomplete)):
        sliced.apply_sweep(make(), conn, partner, RUN, plan)
    fences.bind(conn, None)
    assert fresh <= held(conn, partner.id)  # never purged by the stale sweep


# Behind the approval gate: a small partner in two slices (a verification request per vanished record).
GATED = {"threshold_records": 100, "target_records": 50, "reconcile_slices": 2}


@pytest.fixture
def small() -> Iterator[tuple[OaiSimulator, SimulatedRepository]]:
    repo = SimulatedRepository(records=200, page_size=50, seed=43, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        yield sim, repo


def _swept(sim: OaiSimulator, conn: psycopg.Connection, partner: Partner) -> sliced.SweepPlan:
    plan = sliced.plan_sweep(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, RUN)
    assert plan.slices == 2
    for index in range(1, plan.slices + 1):
        sliced.sweep_slice(build_adapter(partner, Endpoint(sim.base_url)), conn, partner.id, RUN, plan, index)
    return plan


def test_a_sliced_reconcile_over_its_purge_limit_waits_for_approval_and_approve_applies_exactly(
        conn: psycopg.Connection, small: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """Regression: over ``max_purge_fraction`` a sliced reconcile failed with
    MassPurgeRefused; behind the DAG's gate it stages everything, as the unsliced one, drops its
    slice state and waits; the approved apply applies exactly what it staged."""
    sim, repo = small
    partner = oai_partner(slicing=GATED)  # max_purge_fraction: the registry's 5%
    harvested(sim, conn, partner)
    before = held(conn, partner.id)
    gone, added = set(repo.delete(16)), set(repo.add(4))  # 8% vanished
    plan = _swept(sim, conn, partner)
    outcome = sliced.apply_sweep(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, RUN, plan, gate=True)
    assert outcome.awaiting_approval and outcome.staged_removals == 16 and outcome.purged == 0
    assert held(conn, partner.id) == before  # nothing applied while it waits
    assert conn.execute("SELECT status FROM harvest_runs WHERE run_id = %s", (RUN,)).fetchone() == ("harvested",)
    for table in ("reconcile_slices", "reconcile_ids"):  # the slice state is gone; staging holds the result
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE run_id = %s", (RUN,)).fetchone() == (0,)
    shrink = gates.reconcile_shrink(conn, partner, RUN, outcome.as_dict())  # what the request shows
    assert (shrink.held, shrink.removals) == (200, 16)
    assert len(shrink.sample) == 10 and {s["identifier"] for s in shrink.sample} <= gone
    applied = apply_staged(conn, partner.id, RUN)
    assert (applied["purged"], applied["upserted"]) == (16, 4)
    assert held(conn, partner.id) == (before - gone) | added == repo.live_identifiers()


def test_without_a_gate_a_sliced_reconcile_over_its_limit_still_refuses_and_allow_mass_purge_applies(
        conn: psycopg.Connection, small: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """Scripts keep the old contract: no gate refuses (nothing staged), allow_mass_purge applies."""
    sim, repo = small
    partner = oai_partner(slicing=GATED)
    harvested(sim, conn, partner)
    before = held(conn, partner.id)
    repo.delete(16)
    plan = _swept(sim, conn, partner)
    with pytest.raises(MassPurgeRefused, match="mass-purge limit"):
        sliced.apply_sweep(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, RUN, plan)
    assert held(conn, partner.id) == before
    assert conn.execute("SELECT count(*) FROM staging WHERE run_id = %s", (RUN,)).fetchone() == (0,)
    plan = _swept(sim, conn, partner)
    result = sliced.apply_sweep(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, RUN, plan,
                                allow_mass_purge=True, gate=True)
    assert not result.awaiting_approval and result.purged == 16
    assert held(conn, partner.id) == repo.live_identifiers()


def test_a_harvest_applied_between_the_sweep_and_the_request_makes_the_approval_refuse(
        conn: psycopg.Connection, small: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """The fence across the wait of a sliced reconcile starts at its plan, not at the request:
    the reconcile's lease ends with its settle task, and a harvest may apply before the gate
    opens the request; when it changed a record the reconcile staged, the approved apply then
    refuses as stale and nothing is purged."""
    sim, repo = small
    partner = oai_partner(slicing=GATED)
    harvested(sim, conn, partner)
    gone = sorted(repo.delete(16))
    plan = _swept(sim, conn, partner)
    assert sliced.apply_sweep(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, RUN, plan,
                              gate=True).awaiting_approval
    back = rec(gone[0], T0 + timedelta(days=3650), "back upstream")  # a record the sweep would purge is back
    stage(conn, partner.id, "harvest-meanwhile", [back])
    apply_run(conn, partner.id, "harvest-meanwhile")  # a harvest after the settle, before the gate's request
    shrink = gates.reconcile_shrink(conn, partner, RUN, {"local": 200, "staged_removals": 16})
    request = store_gates.open_request(conn, partner.id, RUN, "reconcile_museum", gates.PURGE, shrink, 0.05, 0)
    store_gates.decide(conn, partner.id, RUN, store_gates.APPROVED, "ada")
    with conn.transaction():
        token = leases.acquire(conn, partner.id, RUN, leases.RECONCILE, timedelta(minutes=5))
    fence = fences.Fence(partner.id, RUN, token, 0)
    fence.applied_before = gates.approval_since(request, plan.to_dict())
    assert fence.applied_before == plan.planned_at < request.requested_at
    before = held(conn, partner.id)
    fences.bind(conn, fence)
    with pytest.raises(fences.NewerRunApplied, match="harvest-meanwhile"):
        apply_run(conn, partner.id, RUN)
    conn.rollback()
    fences.bind(conn, None)
    assert held(conn, partner.id) == before and gone[0] in before  # nothing of the reconcile applied


def test_the_purge_decision_is_one_function() -> None:
    from partner_harvest.store.reconcile import ReconcilePlan

    partner = oai_partner(max_purge_fraction=0.1)
    assert purge_refusal(partner, ReconcilePlan(100, 90, 0, 10, 0, 0)) is None
    assert "mass-purge limit" in (purge_refusal(partner, ReconcilePlan(100, 80, 0, 15, 5, 0)) or "")


@pytest.mark.slow
def test_a_sierra_reconcile_sweeps_bib_id_ranges(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=800, deleted_fraction=0.0, seed=35)
    with SierraSimulator(catalogue, client_key="k", client_secret="s") as sim:
        partner = sierra_partner(page_size=100, slicing=SLICED)
        endpoint = Endpoint(sim.base_url, "k", "s")
        from partner_harvest.run import run_partner

        run_partner(partner, build_adapter(partner, endpoint), conn, "full")
        lost = set(random.Random(1).sample(sorted(catalogue.live_ids()), 5))
        conn.execute("DELETE FROM records WHERE identifier = ANY(%s)", (list(lost),))
        conn.commit()
        gone = set(catalogue.delete(8))
        plan = sliced.plan_sweep(build_adapter(partner, endpoint), conn, partner, "reconcile_library/1")
        assert plan.slices == 4
        sim.clear_requests()
        for index in range(1, 5):
            sliced.sweep_slice(build_adapter(partner, endpoint), conn, partner.id, "reconcile_library/1", plan, index)
        result = sliced.apply_sweep(build_adapter(partner, endpoint), conn, partner, "reconcile_library/1", plan)
        assert result.fetched_missing == 5 and result.purged == len(gone - lost)
        assert held(conn, "library") == catalogue.live_ids()
        ranges = {r["query"]["id"] for r in sim.requests if r["query"].get("fields") == "id"}
        assert any(not q.startswith("[0,") for q in ranges)  # id ranges, not one keyset from 0
