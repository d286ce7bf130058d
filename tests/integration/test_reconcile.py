"""The full reconcile against the simulators over loopback and real PostgreSQL."""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.adapters import Adapter
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.reconcile import MassPurgeRefused, reconcile
from partner_harvest.run import run_partner
from partner_harvest.store.db import one
from partner_harvest.store.leases import HARVEST, RECONCILE, PartnerBusy, acquire, release
from tests.support.db import held
from tests.support.partners import oai_partner, sierra_partner


def full_harvest(adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str = "full") -> None:
    run_partner(adapter.partner, adapter, conn, run_id)


@pytest.mark.slow  # 25,000 records
def test_reconcile_removes_exactly_what_vanished_without_tombstones(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=25000, page_size=500, deleted_record="no", deleted_fraction=0.0, seed=31)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        full_harvest(adapter, conn, "museum")
        before = held(conn, "museum")
        vanished = set(repo.delete(1000))  # deletedRecord=no: no tombstones, ever
        added = set(repo.add(7))  # and a few the nightly run has not seen yet
        # the nightly incremental run cannot see vanished records
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "reconcile-1")
        assert result.plan.vanished == 1000 and result.purged == 1000
        assert result.plan.missing == 7 and result.fetched_missing == 7 and result.upserted == 7
        assert held(conn, "museum") == repo.live_identifiers() == (before - vanished) | added
        reasons = conn.execute(
            "SELECT reason, count(*) FROM deletions WHERE run_id = 'reconcile-1' GROUP BY reason").fetchall()
        assert reasons == [("reconcile", 1000)]
        sweep = [r for r in sim.requests if r.get("verb") == "ListIdentifiers"]
        assert sweep and set(sweep[0]) == {"verb", "metadataPrefix"}  # no until: the list as it is now
        assert result.verified == {"gone": 1000, "deleted": 0, "live": 0, "unverified": 0}
        assert conn.execute("SELECT count(*) FROM reconcile_ids").fetchone() == (0,)


def test_mass_purge_is_refused_and_nothing_changes(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=2000, page_size=500, deleted_record="no", deleted_fraction=0.0, seed=32)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        full_harvest(build_adapter(partner, Endpoint(sim.base_url)), conn, "museum")
        before = conn.execute("SELECT identifier, content_hash FROM records ORDER BY 1").fetchall()
        repo.delete(400)  # 20%
        repo.add(5)
        with pytest.raises(MassPurgeRefused, match=r"remove 400 of 2000 records \(20.0%.*allow_mass_purge") as err:
            reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "reconcile-1")
        assert not err.value.retryable
        conn.rollback()
        assert conn.execute("SELECT identifier, content_hash FROM records ORDER BY 1").fetchall() == before
        assert conn.execute("SELECT count(*) FROM deletions").fetchone() == (0,)
        status, error = one(conn.execute(
            "SELECT status, error FROM harvest_runs WHERE run_id = 'reconcile-1'"))
        assert status == "failed" and "mass-purge" in error
        allowed = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "reconcile-2",
                            allow_mass_purge=True)
        assert allowed.purged == 400 and held(conn, "museum") == repo.live_identifiers()


def test_a_partner_outage_listing_nothing_never_empties_the_aggregation(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=300, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=33)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        full_harvest(build_adapter(partner, Endpoint(sim.base_url)), conn, "museum")
        repo.delete_ids(sorted(repo.live_identifiers()))  # the endpoint now answers noRecordsMatch
        with pytest.raises(MassPurgeRefused):
            reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "outage")
        conn.rollback()
        assert len(held(conn, "museum")) == 300


def test_deleted_headers_seen_by_the_sweep_purge_too(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=400, page_size=100, deleted_record="persistent", deleted_fraction=0.0, seed=34)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        full_harvest(build_adapter(partner, Endpoint(sim.base_url)), conn, "museum")
        gone = set(repo.delete(6))  # tombstones the nightly run has not picked up yet
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "r")
        assert result.plan.deleted_upstream == 6 and result.purged == 6
        assert not gone & held(conn, "museum")


def test_sierra_reconcile_sweeps_live_ids(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=400, deleted_fraction=0.0, seed=35)
    with SierraSimulator(catalogue, client_key="k", client_secret="s") as sim:
        partner = sierra_partner(page_size=100)
        endpoint = Endpoint(sim.base_url, "k", "s")
        full_harvest(build_adapter(partner, endpoint), conn, "library")
        rng = random.Random(1)
        lost = set(rng.sample(sorted(catalogue.live_ids()), 5))
        conn.execute("DELETE FROM records WHERE identifier = ANY(%s)", (list(lost),))  # local loss
        conn.commit()
        gone = set(catalogue.delete(8))
        sim.clear_requests()
        result = reconcile(build_adapter(partner, endpoint), conn, partner, "r")
        assert result.fetched_missing == 5 and result.purged == len(gone - lost)
        assert held(conn, "library") == catalogue.live_ids()
        sweeps = [r["query"] for r in sim.requests if r["path"].endswith("/bibs") and r["query"].get("fields") == "id"]
        assert sweeps and all(q["deleted"] == "false" for q in sweeps)


def test_reconcile_and_harvest_leases_exclude_each_other(conn: psycopg.Connection) -> None:
    acquire(conn, "p", "nightly-1", HARVEST, timedelta(hours=1))
    acquire(conn, "p", "backfill-7", HARVEST, timedelta(hours=1))  # harvests may overlap
    with pytest.raises(PartnerBusy, match="harvest run"):
        acquire(conn, "p", "weekly", RECONCILE, timedelta(hours=1))
    acquire(conn, "other", "weekly", RECONCILE, timedelta(hours=1))  # other partners are free
    release(conn, "p", "nightly-1")
    release(conn, "p", "backfill-7")
    acquire(conn, "p", "weekly", RECONCILE, timedelta(hours=1))
    with pytest.raises(PartnerBusy, match="reconcile run"):
        acquire(conn, "p", "nightly-2", HARVEST, timedelta(hours=1))
    conn.execute("UPDATE partner_leases SET expires_at = now() - interval '1 second' WHERE holder = 'weekly'")
    conn.commit()
    acquire(conn, "p", "nightly-2", HARVEST, timedelta(hours=1))  # an expired lease frees the partner


def test_the_settles_getrecords_go_the_pools_slots_at_once_and_stop_at_an_error() -> None:
    """Verifications, missing records and the content check's sample are GetRecords one id
    each: they go as many at once as the partner's pool has slots (never more), answers in
    the order asked; the first error raises and sends nothing more than what was in flight."""
    import threading

    from partner_harvest.errors import HarvestError
    from partner_harvest.reconcile import reconcile_window

    repo = SimulatedRepository(records=30, page_size=100, seed=5, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo, response_delay_ms=60_000) as sim:
        adapter = build_adapter(oai_partner(pool_slots=3, retries=0), Endpoint(sim.base_url))
        sim.set_response_delay(0)
        window = reconcile_window(adapter)
        asked = [*sorted(repo.live_identifiers())[:10], "oai:sim.example:nowhere"]
        sim.set_response_delay(60_000)  # held until released: what is in flight at once, without timing
        sim.reset_in_flight()
        answers: list[object] = []
        worker = threading.Thread(target=lambda: answers.append(adapter.verify_vanished(window, asked)))
        worker.start()
        try:
            assert sim.wait_in_flight(3, timeout=10), f"only {sim.in_flight} in flight"
        finally:
            sim.set_response_delay(0)
            worker.join(timeout=30)
        assert sim.wait_idle(timeout=10) and sim.max_in_flight == 3
        (verdicts,) = answers
        assert [identifier for identifier, _ in verdicts] == asked  # type: ignore[attr-defined]
        assert [item is None for _, item in verdicts] == [False] * 10 + [True]  # type: ignore[attr-defined]
        sim.clear_requests()
        sim.fail_next(1, status=500)
        with pytest.raises(HarvestError):
            adapter.fetch_records(window, asked)
        assert sim.wait_idle(timeout=10)
        gets = [r for r in sim.requests if r.get("verb") == "GetRecord"]
        assert len(gets) <= 2 * 3 < len(asked)  # what was in flight, not the rest of the list
