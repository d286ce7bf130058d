"""Sierra shapes recorded from real servers, played by the simulator (I13), harvested for real.

Each test names the recorded response (tests/fixtures/realworld/sierra/SOURCES.md) whose
shape the simulator is asked to produce: 8-digit record numbers, a bibs/marc block that
answers 500 code 135 on every try, list bodies without ``start``, bare numeric export file
ids, padded codes, a non-zero ``specificCode``, a 401 with code 113; and a full load
onto a mirror that holds bibs deleted upstream since.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from include.simulators.sierra.faults import SierraFaults
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from tests.support.db import check_row
from tests.support.harness import SIERRA_KEY as KEY
from tests.support.harness import SIERRA_SECRET as SECRET
from tests.support.harness import PieceRun as Run
from tests.support.harness import SierraHarness as Harness
from tests.support.partners import sierra_partner as partner


def quarantined(conn: psycopg.Connection) -> dict[str, str]:
    rows = conn.execute("SELECT identifier, reason FROM quarantine WHERE partner_id = 'library'").fetchall()
    conn.commit()
    return dict(rows)


def exports(sim: SierraSimulator) -> list[dict[str, Any]]:
    return [r for r in sim.requests if r["path"].endswith("/bibs/marc")]


# -- record numbers of any width ---------------------------------------------------------

@pytest.mark.parametrize("first_id", [11_651_200, 9_999_900], ids=["8-digit", "crossing-into-8-digits"])
def test_a_catalogue_with_8_digit_ids_is_exported_to_its_end(conn: psycopg.Connection, first_id: int) -> None:
    """NYPL's export (907 $a .b116512684): ids above 9,999,999. The export must go on block
    by block to the end, not stop after the first and leave the rest to the id-list fetch."""
    catalogue = SimulatedCatalogue(bibs=450, deleted_fraction=0.04, seed=8, first_id=first_id)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        _, changes, _, result = harness.run()
        assert harness.held() == catalogue.live_ids()
        kind, expected, found, ok, detail = check_row(conn)
        assert ok and found == expected == len(catalogue.live_ids()), detail  # every live bib came through the export
        assert "fetched 0 missing of 0" in detail
        assert len(exports(sim)) >= 5  # 450 ids in blocks of 100, then the 404/107 that ends it


def test_id_slices_cut_a_catalogue_with_8_digit_ids(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=700, deleted_fraction=0.02, seed=9, first_id=11_651_200)
    settings = {"threshold_records": 300, "target_records": 150, "max_slices": 6}
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        p = partner(slicing=settings)
        adapter = build_adapter(p, Endpoint(sim.base_url, KEY, SECRET))
        window = pipeline.freeze_window(adapter, p.lag, None, pipeline.RunRequest("full"))
        pieces = adapter.plan_slices(window, p.slicing)
    assert len(pieces) == 5, pieces  # 700 ids / 150 a slice
    assert pieces[0].lo == 0 and pieces[-1].hi is None
    for a, b in zip(pieces, pieces[1:]):
        assert a.hi is not None and b.lo == a.hi + 1
    assert pieces[-1].lo is not None and pieces[-1].lo <= catalogue.last_id
    assert pieces[0].hi is not None and pieces[0].hi >= catalogue.first_id


# -- a block bib2Marc cannot build: 500 code 135 on every try ------------------------------

def poisoned(first_id: int = 11_000_001, **sim_options: Any) -> tuple[SimulatedCatalogue, SierraSimulator]:
    catalogue = SimulatedCatalogue(bibs=1000, deleted_fraction=0.03, seed=13, first_id=first_id, poison_every=250)
    return catalogue, SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, **sim_options)


def poison_ids(catalogue: SimulatedCatalogue) -> set[str]:
    return {i for i in catalogue.live_ids() if catalogue.is_poison(int(i))}


@pytest.mark.parametrize("first_id", [11_000_001, 1_000_001], ids=["8-digit", "7-digit"])
def test_a_block_failing_with_135_on_every_try_is_bisected_and_its_poison_bibs_land_through_get_bibs(
        conn: psycopg.Connection, first_id: int) -> None:
    """Acceptance figure: 8-digit ids, a few poison bibs; every other live bib comes through
    the export, the poison ones through GET bibs, the run succeeds; requests counted."""
    catalogue, server = poisoned(first_id)
    with server as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": 100, "rate_limit_wait": 0}}))
        _, changes, _, result = harness.run()
        poison = poison_ids(catalogue)
        assert len(poison) == 4
        assert harness.held() == catalogue.live_ids() and result.quarantined == 0
        kind, expected, found, ok, detail = check_row(conn)
        assert ok and "fetched 0 missing of 0" in detail, detail  # nothing was left to the id-list fetch
        fetched_one = [r for r in sim.requests if r["path"].endswith("/bibs") and r["query"].get("id") in poison]
        assert {r["query"]["id"] for r in fetched_one} == poison  # each poison bib fetched by itself
        failed = [r for r in exports(sim) if r["status"] == 500]
        print(f"\nfull load of {len(catalogue)} bibs ({len(catalogue.live_ids())} live, 4 poison, limit 100): "
              f"{len(sim.requests)} requests, {len(exports(sim))} bibs/marc summaries of which {len(failed)} "
              f"answered 500/135")
        assert len(failed) <= 4 * (3 + 7)  # per poison bib: the client's 3 tries, then one per halving
        assert not sim.open_export_files


def test_poison_bibs_that_get_bibs_cannot_serve_either_are_quarantined_by_id_with_the_error(conn: psycopg.Connection) -> None:
    catalogue, server = poisoned(poison_json_fails=True)
    with server as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": 100, "rate_limit_wait": 0}}))
        _, changes, _, result = harness.run()
        poison = poison_ids(catalogue)
        assert harness.held() == catalogue.live_ids() - poison
        reasons = quarantined(conn)
        assert set(reasons) == poison
        assert all("code 135" in r or "External Process Failed" in r for r in reasons.values()), reasons
        assert all("GET bibs failed" in r for r in reasons.values())


def test_a_sliced_full_load_isolates_poison_bibs_within_each_slice(conn: psycopg.Connection) -> None:
    catalogue, server = poisoned(first_id=9_999_800)
    settings = {"threshold_records": 300, "target_records": 300, "max_slices": 4}
    with server as sim:
        p = partner(slicing=settings, options={"export": {"limit": 100, "rate_limit_wait": 0}})
        run = Run(conn, p, lambda: build_adapter(p, Endpoint(sim.base_url, KEY, SECRET)), mode="full")
        assert len(run.pieces) >= 3
        run.harvest_all()
        run.apply()
        rows = conn.execute("SELECT identifier FROM records WHERE partner_id = 'library'").fetchall()
        conn.commit()
        assert {r[0] for r in rows} == catalogue.live_ids()


# -- a full load onto a mirror that already holds the partner ------------------------------

def test_a_full_load_onto_a_mirror_purges_the_bibs_deleted_upstream_since(conn: psycopg.Connection) -> None:
    """A ``mode: full`` run leaves the cursors unset, so the next scheduled run is again a
    load from the beginning, which polls no deletions; the export and the enumeration list
    only live bibs. The mirror must still equal the live set after it."""
    catalogue = SimulatedCatalogue(bibs=600, deleted_fraction=0.02, seed=17, first_id=11_000_001)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        harness.run(mode="full")
        assert harness.held() == catalogue.live_ids() and harness.cursor is None
        catalogue.advance_clock(86400 * 3)
        gone = catalogue.delete(6)
        catalogue.edit(10)
        added = catalogue.add(4)
        window, changes, deletions, result = harness.run()  # no cursor: a load from the beginning again
        assert window.is_full and deletions is not None and deletions.fetched == 0
        assert harness.held() == catalogue.live_ids(), sorted(set(gone) & harness.held())
        assert result.purged == len(gone) and set(added) <= harness.held()
        reasons = conn.execute("SELECT reason, count(*) FROM deletions WHERE partner_id = 'library' GROUP BY 1").fetchall()
        conn.commit()
        assert dict(reasons) == {"tombstone": len(gone)}
        _, _, _, ok, detail = check_row(conn, "run-2")
        assert ok and f"{len(gone)} held bibs no longer live staged as deletions" in detail
        # another full load changes nothing (I2)
        _, _, _, again = harness.run(mode="full")
        assert again.purged == 0 and again.upserted == 0 and harness.held() == catalogue.live_ids()


def test_a_full_load_leaves_a_mass_disappearance_to_the_reconcile(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.0, seed=18)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        harness.run(mode="full")
        catalogue.advance_clock(86400)
        gone = catalogue.delete(60)  # 20 %: above the 5 % mass-purge limit
        _, _, _, result = harness.run()
        assert result.purged == 0 and set(gone) <= harness.held()
        _, _, _, ok, detail = check_row(conn, "run-2")
        assert "above the mass-purge limit" in detail


def test_a_sliced_full_load_onto_a_mirror_purges_only_within_each_slice_and_all_of_them(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=700, deleted_fraction=0.02, seed=19, first_id=9_999_700)
    settings = {"threshold_records": 300, "target_records": 150, "max_slices": 6}
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        p = partner(slicing=settings)
        make = lambda: build_adapter(p, Endpoint(sim.base_url, KEY, SECRET))  # noqa: E731
        first = Run(conn, p, make, "run-1", mode="full")
        first.harvest_all()
        first.apply()
        catalogue.advance_clock(86400)
        gone = catalogue.delete(12)
        second = Run(conn, p, make, "run-2", mode="full")
        assert len(second.pieces) >= 3
        second.harvest_all()
        result = second.apply()
        rows = conn.execute("SELECT identifier FROM records WHERE partner_id = 'library'").fetchall()
        conn.commit()
        assert {r[0] for r in rows} == catalogue.live_ids() and result.purged == len(gone)


# -- other recorded shapes ------------------------------------------------------------------

def test_a_401_with_code_113_gets_one_fresh_token(conn: psycopg.Connection) -> None:
    """Wellcome's recorded token refresh: an expired token answered 401 code 113, not 123."""
    catalogue = SimulatedCatalogue(bibs=120, seed=4)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        catalogue.advance_clock(3600)
        catalogue.edit(5)
        body = {"code": 113, "specificCode": 0, "httpStatus": 401, "name": "Unauthorized",
                "description": "Invalid or missing authorization header"}
        sim.clear_requests()
        harness.run()
        plain = sum(1 for r in sim.requests if r["path"].endswith("/token"))
        catalogue.advance_clock(3600)
        catalogue.edit(5)
        sim.clear_requests()
        sim.fail_next(1, status=401, body=body, path_prefix="/iii/sierra-api/v6/bibs")
        harness.run()
        assert harness.held() == catalogue.live_ids()
        assert sum(1 for r in sim.requests if r["path"].endswith("/token")) == plain + 1  # one fresh token


@pytest.mark.parametrize("options", [
    {"list_start": False},
    {"export_file_ids": "numeric"},
    {"export_file_ids": "bare"},
    {"specific_code": 3},
    {"padded_codes": True, "mixed_fixed_types": True},
    {"marc_storage_order": True},
], ids=lambda o: ",".join(o))
def test_recorded_server_shapes_land_the_live_set(conn: psycopg.Connection, options: dict[str, Any]) -> None:
    catalogue = SimulatedCatalogue(bibs=260, deleted_fraction=0.05, seed=6, first_id=10_000_001)
    fields = ["id", "updatedDate", "createdDate", "deleted", "suppressed", "marc", "fixedFields", "materialType",
              "country"]
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, **options) as sim:
        harness = Harness(sim, conn, partner(fields=fields))
        harness.run()
        catalogue.advance_clock(3600)
        catalogue.edit(30)
        added = catalogue.add(3)
        catalogue.delete(2)
        if options.get("specific_code"):
            sim.fail_export_next(135)  # an error body with a non-zero specificCode, once
        _, changes, _, result = harness.run()
        assert harness.held() == catalogue.live_ids() and set(added) <= harness.held()
        assert result.quarantined == 0
        assert not sim.open_export_files


@pytest.mark.parametrize("style", ["empty_leader_every", "blank_leader_every"])
def test_bibs_with_an_empty_or_blank_leader_land(conn: psycopg.Connection, style: str) -> None:
    """The vendor sandbox serves MARC-in-JSON with leader "" (dcb-sandbox/bibs-slice-0-9.json)."""
    catalogue = SimulatedCatalogue(bibs=100, deleted_fraction=0.0, seed=7)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET,
                         faults=SierraFaults.model_validate({style: 10})) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        catalogue.advance_clock(3600)
        catalogue.edit(100)  # every bib comes again through the change poll (MARC-in-JSON)
        _, _, _, result = harness.run()
        assert result.quarantined == 0
