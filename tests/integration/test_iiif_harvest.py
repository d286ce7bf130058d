"""IIIF Change Discovery harvests end to end: the museum simulator on loopback, real PostgreSQL.

Each night is one DAG run through partner_harvest.run (freeze, harvest, apply, cursor);
the simulator's request log counts what a night cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from include.simulators.iiif.museum import Museum
from include.simulators.iiif.server import IiifServer
from partner_harvest.errors import PartnerAsksToWait
from partner_harvest.run import RunResult
from tests.support.iiif_harness import IiifHarness, iiif_partner


def night(harness: IiifHarness) -> RunResult:
    harness.sim.clear_requests()
    return harness.run()


@pytest.fixture
def museum() -> Museum:
    museum = Museum(page_sizes=(7, 3, 5), fractions=True)
    museum.create(40)
    return museum


@pytest.fixture
def sim(museum: Museum) -> Iterator[IiifServer]:
    with IiifServer(museum) as server:
        yield server


@pytest.fixture
def harness(sim: IiifServer, conn: psycopg.Connection) -> IiifHarness:
    return IiifHarness(sim, conn, iiif_partner())


def test_first_harvest_then_quiet_night_costs_two_requests(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    first = harness.run()
    assert harness.held() == harness.live()
    assert first.applied.upserted == 40 and first.applied.quarantined == 0
    audit = harness.audit(f"run-{harness.runs}")
    assert audit["check_kind"] == "iiif-total-items" and audit["check_ok"] is True
    assert audit["check_expected"] == audit["check_found"] == len(museum.events)

    quiet = night(harness)
    assert len(sim.requests) <= 2, sim.requests  # the collection and its last page, nothing more
    assert quiet.changes.fetched == 0 or quiet.applied.upserted == 0
    assert sim.count("/objects/") == 0


def test_a_night_with_k_changes_fetches_k_descriptions(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    harness.run()
    museum.update("o3")
    museum.update("o17")
    museum.create(2)
    museum.delete("o5")
    result = night(harness)
    assert sim.count("/objects/") == 4  # two edits, two new objects; a Delete costs no request
    assert result.applied.upserted == 4
    assert harness.held() == harness.live()


def test_newest_wins_delete_after_create_and_recreate_after_delete(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    harness.run()
    [fresh] = museum.create(1)
    museum.update(fresh)
    museum.delete(fresh)  # created, edited, deleted in one window: a tombstone, no fetch
    museum.delete("o8")
    museum.recreate("o8")  # deleted then created again: it lands
    night(harness)
    held = harness.held()
    assert museum.identifier(sim.base_url, fresh) not in held
    assert museum.identifier(sim.base_url, "o8") in held
    assert sim.count(f"/objects/{fresh}/") == 0
    assert held == harness.live()


def test_move_tombstones_the_old_id_and_lands_the_target(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    harness.run()
    target = museum.move("o2")
    night(harness)
    held = harness.held()
    assert museum.identifier(sim.base_url, "o2") not in held
    assert museum.identifier(sim.base_url, target) in held


def test_equal_end_times_across_a_page_boundary_and_offsets(conn: psycopg.Connection) -> None:
    museum = Museum(page_sizes=(4,), offsets=True)
    museum.create(6)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner())
        harness.run()
        museum.create(6, same_time=True)  # six activities with one endTime over two pages
        night(harness)
        assert harness.held() == harness.live()
        # an activity appended later with that same endTime (the cursor's instant) still lands the next night
        museum.update("o2", same_time=True)
        night(harness)
        assert sim.count("/objects/o2/") == 1
        assert harness.held() == harness.live()


def test_activities_appended_during_the_run_belong_to_the_next(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    harness.run()
    museum.update("o1")
    added: list[str] = []

    def grow(path: str) -> None:
        if "/objects/" in path and not added:
            added.extend(museum.create(3))  # the last page grows while the run fetches descriptions

    sim.on_request = grow
    night(harness)
    sim.on_request = None
    held = harness.held()
    assert not {museum.identifier(sim.base_url, s) for s in added} & held
    night(harness)
    assert harness.held() == harness.live()


def test_refresh_with_truncated_history(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    harness.run()
    museum.delete("o4")
    museum.refresh(truncate=True)  # the history before it, o4's Delete with it, is gone
    museum.update("o6")
    museum.delete("o7")
    night(harness)
    held = harness.held()
    assert museum.identifier(sim.base_url, "o7") not in held  # a Delete after the Refresh is read
    assert museum.identifier(sim.base_url, "o6") in held
    assert museum.identifier(sim.base_url, "o4") in held  # the truncated Delete: only the sweep can see it
    from partner_harvest.reconcile import reconcile

    reconcile(harness.adapter(), harness.conn, harness.partner, "reconcile-1")
    assert harness.held() == harness.live()


def test_full_harvest_stops_at_a_refresh_and_says_so(conn: psycopg.Connection) -> None:
    museum = Museum(page_sizes=(5,))
    museum.create(12)
    museum.delete("o3")
    museum.refresh(truncate=False)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner())
        harness.run()
        assert harness.held() == harness.live()
        audit = harness.audit("run-1")
        assert audit["check_ok"] is True and "Refresh" in audit["check_detail"]


@pytest.mark.parametrize("total", ["missing", "wrong"])
def test_total_items_missing_or_wrong(conn: psycopg.Connection, total: str) -> None:
    museum = Museum(page_sizes=(6,), total_items=total)
    museum.create(10)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner())
        harness.run()
        audit = harness.audit("run-1")
        if total == "missing":
            assert audit["check_ok"] is True and "no totalItems" in audit["check_detail"]
        else:
            assert audit["check_ok"] is False and audit["check_expected"] == 13 and audit["check_found"] == 10


def test_description_404_is_quarantined_not_deleted_and_invalid_is_quarantined(harness: IiifHarness, sim: IiifServer, museum: Museum,
                                                                               conn: psycopg.Connection) -> None:
    harness.run()
    museum.update("o10")
    museum.missing.add("o10")
    museum.update("o11")
    museum.invalid.add("o11")
    result = night(harness)
    assert result.applied.quarantined == 2
    held = harness.held()
    assert museum.identifier(sim.base_url, "o10") in held  # kept: its latest activity is no Delete
    rows: dict[str, str] = dict(conn.execute("SELECT identifier, reason FROM quarantine WHERE partner_id = 'rijks'").fetchall())
    conn.commit()
    assert "HTTP 404" in rows[museum.identifier(sim.base_url, "o10")]
    assert "not a Delete" in rows[museum.identifier(sim.base_url, "o10")]
    assert "unreadable" in rows[museum.identifier(sim.base_url, "o11")]


def test_429_and_503_with_retry_after(harness: IiifHarness, sim: IiifServer, museum: Museum) -> None:
    harness.run()
    museum.update("o1")
    sim.throttle["/stream/collection.json"] = [(503, 0)]
    sim.throttle["/objects/o1/linked-art.json"] = [(429, 0)]
    night(harness)
    assert sim.count("/objects/o1/") == 2
    assert harness.held() == harness.live()
    sim.throttle["/stream/collection.json"] = [(503, 3600)]
    with pytest.raises(PartnerAsksToWait):
        night(harness)


def test_a_description_failing_with_5xx_fails_the_run_and_lands_on_its_retry(harness: IiifHarness, sim: IiifServer, museum: Museum,
                                                                             conn: psycopg.Connection) -> None:
    """A 5xx (or 429) that outlasts the transport's retries is the partner's outage, not the
    object's: quarantining it lost the object for good (nothing asks for it again until its
    next activity; found by the soak, seed 27, night 25). The run fails (Airflow retries it)
    and the retried run lands the description."""
    from partner_harvest.errors import PartnerHttpError

    harness.run()
    museum.update("o2")
    sim.throttle["/objects/o2/linked-art.json"] = [(503, 0)] * 20  # more than the transport retries
    with pytest.raises(PartnerHttpError, match="HTTP 503"):
        night(harness)
    sim.throttle.clear()
    night(harness)
    assert harness.held() == harness.live()
    quarantined = conn.execute("SELECT count(*) FROM quarantine WHERE partner_id = 'rijks'").fetchone()
    conn.commit()
    assert quarantined == (0,)


@pytest.mark.parametrize("style", ["object", "bare"])
def test_see_also_as_one_object_or_a_bare_url(conn: psycopg.Connection, style: str) -> None:
    museum = Museum(see_also_style=style)
    museum.create(3)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner())
        result = harness.run()
        assert result.applied.upserted == 3 and harness.held() == harness.live()


def test_lido_preferred_when_the_registry_says_so(conn: psycopg.Connection) -> None:
    museum = Museum(lido_too=True)
    museum.create(2)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner(metadata_prefix="lido"))
        harness.run()
        assert sim.count("lido.xml") == 2 and sim.count("linked-art.json") == 0
        prefixes = {r[0] for r in conn.execute("SELECT metadata_prefix FROM records").fetchall()}
        conn.commit()
        assert prefixes == {"lido"}


def test_reconcile_sweeps_the_live_set(harness: IiifHarness, sim: IiifServer, museum: Museum, conn: psycopg.Connection) -> None:
    from partner_harvest.reconcile import reconcile

    harness.run()
    conn.execute("DELETE FROM records WHERE partner_id = 'rijks' AND identifier = %s",
                 (museum.identifier(sim.base_url, "o12"),))
    conn.commit()
    museum.delete("o13")  # deleted upstream, never harvested
    result = reconcile(harness.adapter(), conn, harness.partner, "reconcile-1")
    assert result.fetched_missing == 1 and result.purged == 1
    assert harness.held() == harness.live()


def test_static_files_stream(conn: psycopg.Connection, tmp_path: Path) -> None:
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        museum = Museum(page_sizes=(4,))
        museum.create(9)
        museum.write_static(tmp_path, base)

        class Static:
            base_url = base
            collection_url = f"{base}/stream/collection.json"

        harness = IiifHarness(Static(), conn, iiif_partner())
        harness.sim.museum = museum
        result = harness.run()
        assert result.applied.upserted == 9
    finally:
        server.shutdown()
        server.server_close()


def test_a_getty_style_stream_created_stamps_and_objects_without_see_also(conn: psycopg.Connection) -> None:
    """The shape of the Getty's real stream (tests/fixtures/iiif/getty-page.json): no seeAlso
    (the object's id is its Linked Art record) and `created` instead of endTime. With
    options.iiif.object_itself the objects land; the `created` stamps stop a quiet night
    after the two clock requests (they used to be None: every night walked the whole stream)."""
    museum = Museum(page_sizes=(5,), see_also_style="none", stamp="created")
    museum.create(23)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner(iiif={"object_itself": "linked_art"}))
        first = harness.run()
        assert first.applied.quarantined == 0 and harness.held() == harness.live()
        assert sim.count("/objects/") == 23
        quiet = night(harness)
        assert len(sim.requests) <= 2, sim.requests
        assert quiet.applied.upserted == 0
        museum.update("o4")
        museum.delete("o9")
        night(harness)
        assert sim.count("/objects/") == 1 and harness.held() == harness.live()


def test_objects_without_a_matching_see_also_are_quarantined_naming_the_offers(conn: psycopg.Connection) -> None:
    museum = Museum(page_sizes=(10,), see_also_style="none")
    museum.create(3)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner())
        result = harness.run()
        assert result.applied.quarantined == 3 and harness.held() == set()
        reasons = [r for (r,) in conn.execute("SELECT reason FROM quarantine WHERE partner_id = 'rijks'")]
        assert all("no seeAlso matches options.iiif.descriptions; offered: none" in r for r in reasons), reasons


@pytest.mark.parametrize("refresh", [False, True])
def test_a_day_of_deletions_and_moves_before_a_refresh_that_keeps_the_history(conn: psycopg.Connection, refresh: bool) -> None:
    museum = Museum(page_sizes=(10, 7, 13), fractions=True)
    museum.create(80)
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner())
        harness.run()
        museum.mutate(edit=5, delete=3, add=2, move=2)
        if refresh:
            museum.refresh(truncate=False)
            museum.update(sorted(museum.live)[0])
        night(harness)
        assert harness.held() == harness.live()


def test_a_full_harvest_after_a_full_harvest_stages_every_live_object(harness: IiifHarness, sim: IiifServer, museum: Museum,
                                                                      conn: psycopg.Connection) -> None:
    """Found by the 50,000-object soak: a full harvest run again (a rerun after a kill between
    the apply and the cursor, or an operator's full harvest) skipped the descriptions the mirror
    already held, so they were absent from its staging; the shrink gate then counted them as
    not returned by the partner and asked to approve the loss of the whole collection."""
    from partner_harvest.store import gates as store_gates

    harness.run("full")
    museum.update("o3")
    sim.clear_requests()
    shrinks = []
    harness.run("full", on_staged=lambda channel: shrinks.append(
        store_gates.measure_shrink(conn, harness.partner.id, f"run-{harness.runs}", whole_collection=True)))
    [shrink] = shrinks
    assert shrink.held == len(harness.live()) and shrink.absent == 0, shrink
    assert sim.count("/objects/") == len(harness.live())  # a full harvest fetches every description
    assert harness.held() == harness.live()
