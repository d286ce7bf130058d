"""Reconcile sweeps racing partner staff: nothing the partner still holds is ever purged.

The simulator pages the way many database-backed servers do (the token holds the query
and an offset, and each page re-runs the query), and staff edit or delete records between
two pages of the sweep. Real PostgreSQL, the simulator over loopback.
"""

from __future__ import annotations

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository, identifier_for
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.reconcile import reconcile
from partner_harvest.records import Record, Tombstone
from partner_harvest.window import Window, WindowFacts
from tests.support.db import held
from tests.support.db import outcomes as audit
from tests.support.harness import run_once
from tests.support.partners import oai_partner


def deletions(conn: psycopg.Connection, run_id: str) -> set[str]:
    rows = conn.execute("SELECT identifier FROM deletions WHERE run_id = %s", (run_id,)).fetchall()
    conn.commit()
    return {r[0] for r in rows}





def test_records_edited_during_the_sweep_are_not_purged(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=2000, page_size=100, deleted_fraction=0.0, seed=41)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_once(sim, conn, partner, "full")
        before = held(conn, "museum")
        sim.requery_pages()
        # Staff edit 20 records the sweep has not reached yet: their new datestamps are later
        # than the clock read when the reconcile began.
        edited = [identifier_for(n) for n in range(1200, 1400, 10)]
        sim.mutate_after_pages(3, edit_ids=edited)
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        assert sim.mutations == [{"edited": edited, "deleted": []}]
        assert result.purged == 0 and deletions(conn, "rec") == set()
        assert held(conn, "museum") == before == repo.live_identifiers()
        fetched, upserted, unchanged, purged, quarantined = audit(conn, "rec")
        assert upserted + unchanged + purged + quarantined == fetched


def test_a_deletion_shifting_the_pages_purges_only_what_is_gone(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=2000, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=42)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_once(sim, conn, partner, "full")
        sim.requery_pages()
        # Ten records the sweep has already listed vanish: every later record moves back by
        # ten places, so the ten records at the next page boundary are never listed.
        gone = [identifier_for(n) for n in range(5, 105, 10)]
        sim.mutate_after_pages(3, delete_ids=gone)
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        skipped = {identifier_for(n) for n in range(301, 311)}
        assert result.plan.vanished == 10  # the skipped ones; the sweep saw the deleted ones live
        assert result.purged == 0 and deletions(conn, "rec") == set()
        assert result.verified == {"gone": 0, "deleted": 0, "live": 10, "unverified": 0}
        assert skipped <= held(conn, "museum")
        fetched, upserted, unchanged, purged, quarantined = audit(conn, "rec")
        assert (fetched, unchanged) == (10, 10) and upserted + unchanged + purged + quarantined == fetched
        # The next reconcile (no race this time) removes exactly the ten deleted ones.
        again = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec-2")
        assert again.purged == 10 and deletions(conn, "rec-2") == set(gone)
        assert again.verified == {"gone": 10, "deleted": 0, "live": 0, "unverified": 0}
        assert held(conn, "museum") == repo.live_identifiers()


def test_vanished_candidates_beyond_the_verify_limit_are_kept_for_the_next_reconcile(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=1000, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=43)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_once(sim, conn, partner, "full")
        gone = set(repo.delete(30))
        budget = oai_partner(options={"reconcile": {"verify_limit": 12}})  # the registry key
        first = reconcile(build_adapter(budget, Endpoint(sim.base_url)), conn, budget, "rec-1")
        assert first.purged == 12 and deletions(conn, "rec-1") <= gone
        assert first.verified == {"gone": 12, "deleted": 0, "live": 0, "unverified": 18}
        assert len(held(conn, "museum") - repo.live_identifiers()) == 18
        second = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec-2")  # default 1,000
        assert second.purged == 18 and held(conn, "museum") == repo.live_identifiers()


def test_an_allowed_mass_purge_verifies_every_candidate_at_once(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=1000, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=46)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_once(sim, conn, partner, "full")
        repo.delete(100)  # 10%: over the mass-purge limit
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        adapter.verify_limit = 12
        result = reconcile(adapter, conn, partner, "rec", allow_mass_purge=True)
        assert result.purged == 100 and held(conn, "museum") == repo.live_identifiers()
        assert result.verified == {"gone": 100, "deleted": 0, "live": 0, "unverified": 0}


def test_a_record_deleted_during_the_sweep_never_costs_a_neighbour(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=600, page_size=100, deleted_record="persistent", deleted_fraction=0.0,
                               seed=44)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        run_once(sim, conn, partner, "full")
        sim.requery_pages()
        # A record on an already-served page becomes a tombstone dated after the reconcile's
        # clock: a sweep bounded by that clock drops it and every later record moves back.
        victim = identifier_for(50)
        sim.mutate_after_pages(2, delete_ids=[victim])
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        assert result.purged == 0 and deletions(conn, "rec") == set()
        assert held(conn, "museum") == repo.live_identifiers() | {victim}
        again = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec-2")
        assert again.plan.deleted_upstream == 1 and deletions(conn, "rec-2") == {victim}
        assert held(conn, "museum") == repo.live_identifiers()


def test_verification_tells_gone_deleted_and_live_apart() -> None:
    repo = SimulatedRepository(records=50, page_size=100, deleted_fraction=0.0, seed=45)
    with OaiSimulator(repo) as sim:
        adapter = build_adapter(oai_partner(), Endpoint(sim.base_url))
        deleted = repo.delete_ids([identifier_for(7)])[0]
        live, unknown = identifier_for(8), identifier_for(999)
        window = Window("reconcile", None, repo.clock, "seconds", False, WindowFacts(metadata_prefix="oai_dc"))
        answers = dict(adapter.verify_vanished(window, [deleted, live, unknown]))
        gone, kept = answers[deleted], answers[live]
        assert isinstance(gone, Tombstone) and gone.datestamp == repo.clock
        assert isinstance(kept, Record) and kept.identifier == live
        assert answers[unknown] is None
