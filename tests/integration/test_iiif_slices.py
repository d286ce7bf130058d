"""A big first load of an IIIF Change Discovery stream in slices (ranges of its page chain).

The museum simulator on loopback and real PostgreSQL. Every sliced load is compared with an
unsliced load of the same stream into the same database (another partner id): the records,
their stamps and titles must be the same, and equal the museum's live set.
"""

from __future__ import annotations

import psycopg
import pytest

from include.simulators.iiif.museum import Museum
from include.simulators.iiif.server import IiifServer
from partner_harvest.errors import PartnerHttpError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.store.slices import slice_rows
from tests.support.harness import PieceRun
from tests.support.iiif_harness import IiifHarness, iiif_partner

SLICED = {"threshold_records": 10, "target_records": 10, "max_slices": 4}


def busy(museum: Museum) -> Museum:
    """A history with everything a slice boundary can split: edits of early objects late in
    the stream, a Delete, a re-Create after a Delete, a Move, equal endTimes over pages."""
    museum.create(16)
    for slug in ("o2", "o9", "o14"):
        museum.update(slug)
    museum.delete("o5")
    museum.recreate("o5")
    museum.delete("o11")
    museum.move("o4")
    museum.create(6, same_time=True)
    museum.update("o1")
    return museum


def mirror(conn: psycopg.Connection, partner_id: str) -> set[tuple]:
    rows = conn.execute("SELECT identifier, datestamp, title FROM records WHERE partner_id = %s",
                        (partner_id,)).fetchall()
    conn.commit()
    return set(rows)


def load_both(sim: IiifServer, conn: psycopg.Connection) -> tuple[IiifHarness, IiifHarness]:
    """The sliced first load (partner ``sliced``), then the same stream unsliced (``whole``)."""
    sliced = IiifHarness(sim, conn, iiif_partner("sliced", slicing=dict(SLICED)))
    sim.clear_requests()
    sliced.run()
    sliced.pages_read = sim.count("/stream/page-")
    whole = IiifHarness(sim, conn, iiif_partner("whole"))
    whole.run()
    return sliced, whole


def rows(conn: psycopg.Connection, partner_id: str = "sliced", run_id: str = "run-1") -> dict[str, dict]:
    """The run's slices (channel changes/00N) with their harvest_runs rows."""
    return {r["channel"]: r for r in slice_rows(conn, partner_id, run_id) if r["channel"].startswith("changes/")}


def assert_same(conn: psycopg.Connection, sliced: IiifHarness, whole: IiifHarness) -> None:
    assert sliced.last is not None and len(sliced.last.pieces) >= 2, sliced.last and sliced.last.pieces
    assert mirror(conn, "sliced") == mirror(conn, "whole")
    assert sliced.held() == sliced.live()
    for piece in sliced.last.pieces:
        audit = sliced.audit(f"run-{sliced.runs}", piece["channel"])
        assert audit["check_kind"] == "iiif-slice-pages" and audit["check_ok"] is True, audit["check_detail"]


def cuts_are_strict(museum: Museum, planned: dict[str, dict]) -> None:
    """Every activity of a newer slice is strictly newer than every activity of an older one."""
    pages = museum.pages()
    last = len(pages) - 1
    spans = []
    for _channel, row in sorted(planned.items()):
        events = [e for position in range(row["slice_lo"], row["slice_hi"] + 1) for e in pages[last - position]]
        spans.append((min(e.when for e in events), max(e.when for e in events)))
    for newer, older in zip(spans, spans[1:]):
        assert newer[0] > older[1], spans


@pytest.mark.parametrize("sizes", [(7, 3, 5), (1, 9)])
def test_a_sliced_first_load_equals_an_unsliced_one(conn: psycopg.Connection, sizes: tuple[int, ...]) -> None:
    museum = busy(Museum(page_sizes=sizes, fractions=True))
    with IiifServer(museum) as sim:
        sliced, whole = load_both(sim, conn)
        assert_same(conn, sliced, whole)
        planned = rows(conn)
        cuts_are_strict(museum, planned)
        assert sum(r["expected"] for r in planned.values()) == len(museum.events)
        # each page of the stream read twice at most (the plan's walk, then its slice); the last one not at all
        # each page read twice (the plan's walk, then its slice), the last page once (frozen with the window)
        assert sliced.pages_read == 2 * len(museum.pages()) - 1


def same_instant_over_a_boundary(recreated: bool = False) -> Museum:
    """Pages of 4: the 4th ends with o3's Update, the 5th starts with o3's Delete, one instant
    (``recreated``: a Delete, then a re-Create at that instant)."""
    museum = Museum(page_sizes=(4,))
    museum.create(15)
    if recreated:
        museum.delete("o3")
        museum.recreate("o3", same_time=True)
    else:
        museum.update("o3")
        museum.delete("o3", same_time=True)
    museum.create(7)
    pages = museum.pages()
    assert pages[3][-1].when == pages[4][0].when and pages[4][0].slug == "o3"
    return museum


@pytest.mark.parametrize("recreated", [False, True])
def test_equal_end_times_across_pages_never_straddle_two_slices(conn: psycopg.Connection, recreated: bool) -> None:
    """The unsliced walk takes o3's newer activity in the stream (the Delete; the re-Create);
    so must the sliced load: no slice boundary separates activities of one instant (the
    apply orders by stamp, then by when a version was staged)."""
    museum = same_instant_over_a_boundary(recreated)
    with IiifServer(museum) as sim:
        sliced, whole = load_both(sim, conn)
        assert (museum.identifier(sim.base_url, "o3") in sliced.held()) is recreated
        assert_same(conn, sliced, whole)
        cuts_are_strict(museum, rows(conn))


def test_a_slice_failing_mid_way_resumes_at_its_checkpoint(conn: psycopg.Connection) -> None:
    museum = busy(Museum(page_sizes=(2,), fractions=True))
    with IiifServer(museum) as sim:
        partner = iiif_partner("sliced", retries=1, slicing=dict(SLICED))
        run = PieceRun(conn, partner, lambda: build_adapter(partner, Endpoint(sim.collection_url)))
        channels = [p["channel"] for p in run.pieces]
        assert len(channels) >= 3
        target = channels[1]
        lo, hi = rows(conn)[target]["slice_lo"], rows(conn)[target]["slice_hi"]
        assert hi - lo >= 2
        last = len(museum.pages()) - 1
        sim.throttle[f"/stream/page-{last - (lo + 2)}.json"] = [(503, 0)] * 5  # the slice's third page
        with pytest.raises(PartnerHttpError, match="HTTP 503"):
            run.harvest(target)
        sim.throttle.clear()
        failed = rows(conn)[target]
        assert failed["status"] == "failed" and failed["checkpoint"] == lo + 2 and failed["pages"] == 2
        staged_before = failed["fetched"]
        assert staged_before > 0

        sim.clear_requests()
        stats = run.harvest(target)
        asked = [r["path"] for r in sim.requests if r["path"].startswith("/stream/")]
        assert asked == [f"/stream/page-{last - p}.json" for p in range(lo + 2, hi + 1)]  # from the checkpoint on
        resumed = rows(conn)[target]
        assert resumed["status"] == "harvested" and resumed["resumed"] == 1 and resumed["pages"] == hi - lo + 1
        assert stats.fetched == resumed["fetched"] > staged_before
        run.harvest_all(but=target)
        run.apply()
        whole = IiifHarness(sim, conn, iiif_partner("whole"))
        whole.run()
        assert mirror(conn, "sliced") == mirror(conn, "whole")
        assert whole.held() == whole.live()


def test_a_resumed_slice_keeps_the_newest_activity_it_staged_before_failing(conn: psycopg.Connection) -> None:
    """One slice holds o3's re-Create (5th page, staged before the failure) and its Delete at
    the same instant (4th page, read after the resume): the re-Create still wins, as unsliced
    (staged after it, the older Delete would win the apply's tie)."""
    museum = same_instant_over_a_boundary(recreated=True)
    partner = iiif_partner("sliced", retries=1, slicing=dict(SLICED))
    with IiifServer(museum) as sim:
        run = PieceRun(conn, partner, lambda: build_adapter(partner, Endpoint(sim.collection_url)))
        last = len(museum.pages()) - 1
        planned = rows(conn)
        holder = next(c for c, r in planned.items() if r["slice_lo"] <= last - 4 <= r["slice_hi"])
        assert planned[holder]["slice_hi"] >= last - 3, planned  # the two pages are in one slice
        sim.throttle["/stream/page-3.json"] = [(503, 0)] * 5
        with pytest.raises(PartnerHttpError):
            run.harvest(holder)
        sim.throttle.clear()
        assert rows(conn)[holder]["checkpoint"] == last - 3
        run.harvest(holder)
        assert rows(conn)[holder]["resumed"] == 1
        run.harvest_all(but=holder)
        run.apply()
        held = IiifHarness(sim, conn, partner).held()
        assert museum.identifier(sim.base_url, "o3") in held
        assert held == {museum.identifier(sim.base_url, s) for s in museum.live}


def test_a_last_page_growing_during_the_walk_belongs_to_the_next_run(conn: psycopg.Connection) -> None:
    museum = busy(Museum(page_sizes=(6,)))
    with IiifServer(museum) as sim:
        added: list[str] = []
        pages: list[str] = []

        def grow(path: str) -> None:
            if path.startswith("/stream/page-"):
                pages.append(path)
                if len(pages) > 1 and len(added) < 8:  # after the window froze (the clock's page)
                    added.extend(museum.create(1))  # the last page fills, then a new page starts

        sim.on_request = grow
        sliced = IiifHarness(sim, conn, iiif_partner("sliced", slicing=dict(SLICED)))
        first = sliced.run()
        sim.on_request = None
        assert len(first.pieces) >= 2 and added
        held = sliced.held()
        assert not {museum.identifier(sim.base_url, s) for s in added} & held
        sliced.run()  # the next night: incremental, from the frozen bound
        assert sliced.held() == sliced.live()


def test_a_sliced_full_harvest_stops_at_the_newest_refresh(conn: psycopg.Connection) -> None:
    """The Refresh keeps the history before it (Deletes, a Move): the plan's walk and the
    slices stop at it, as the unsliced walk does."""
    museum = busy(Museum(page_sizes=(5,)))
    museum.refresh(truncate=False)
    museum.create(12)
    museum.delete("o7")
    with IiifServer(museum) as sim:
        sliced, whole = load_both(sim, conn)
        assert_same(conn, sliced, whole)
        pages = museum.pages()
        refresh_page = next(i for i, page in enumerate(pages) if any(e.kind == "Refresh" for e in page))
        assert f"/stream/page-{refresh_page - 1}.json" not in {r["path"] for r in sim.requests}


def test_a_small_stream_or_one_without_total_items_stays_one_chain(conn: psycopg.Connection) -> None:
    museum = busy(Museum(page_sizes=(7,), total_items="missing"))
    with IiifServer(museum) as sim:
        harness = IiifHarness(sim, conn, iiif_partner("sliced", slicing=dict(SLICED)))
        assert harness.run().pieces == [{"channel": "changes"}]
        counted = IiifHarness(sim, conn, iiif_partner("counted", slicing={**SLICED, "without_count": 3}))
        assert len(counted.run().pieces) == 3
        assert counted.held() == counted.live()
    small = Museum(page_sizes=(7,))
    small.create(4)
    with IiifServer(small) as sim:
        harness = IiifHarness(sim, conn, iiif_partner("tiny", slicing=dict(SLICED)))
        sim.clear_requests()
        assert harness.run().pieces == [{"channel": "changes"}]
        assert sim.count("/stream/page-") <= 1  # no plan walk: totalItems is below the threshold
