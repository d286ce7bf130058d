"""Slice boundaries lose no record whatever the partner's clock resolution (I13).

The simulator stores sub-second stamps and compares ``from``/``until`` with them raw (as
some repositories do, against OAI-PMH's granules): ``until=m`` leaves out a record stored at
``m + 0.5 s`` and so does ``from=m + 1 s``. Adjacent slices ``[.., m]``, ``[m + 1 s, ..]`` lost
it; slices that overlap at ``m`` harvest it (and the apply merges a record stamped ``m``
that both slices return). Real PostgreSQL, the simulator over loopback.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.adapters import Adapter
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.window import format_instant, parse_instant
from tests.support.db import held as held_by
from tests.support.harness import PieceRun
from tests.support.partners import oai_partner

if TYPE_CHECKING:
    from datetime import datetime

    from partner_harvest.window import Window

SLICES = {"threshold_records": 300, "target_records": 150, "max_slices": 6}


def held(conn: psycopg.Connection) -> set[str]:
    return held_by(conn, "museum")


def test_the_simulator_compares_sub_second_stamps_raw() -> None:
    repo = SimulatedRepository(records=10, deleted_fraction=0.0, seed=3, stamps="raw")
    victim = sorted(repo.live_identifiers())[0]
    m = parse_instant("2025-10-01T12:00:00Z")
    repo.restamp([victim], m + timedelta(milliseconds=500))
    assert repo[victim].datestamp == m  # reported at the granularity
    until_m = {r.identifier for r in repo.select(until=format_instant(m))}
    from_next = {r.identifier for r in repo.select(from_=format_instant(m + timedelta(seconds=1)))}
    from_m = {r.identifier for r in repo.select(from_=format_instant(m))}
    assert victim not in until_m and victim not in from_next and victim in from_m
    granular = SimulatedRepository(records=10, deleted_fraction=0.0, seed=3)
    granular.restamp([victim], m + timedelta(milliseconds=500))
    assert victim in {r.identifier for r in granular.select(until=format_instant(m))}


def test_records_stored_just_after_each_slice_boundary_are_harvested(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=900, page_size=50, seed=9, deleted_fraction=0.0, stamps="raw")
    with OaiSimulator(repo) as sim:
        partner = oai_partner(slicing=SLICES)

        def make() -> Adapter:
            return build_adapter(partner, Endpoint(sim.base_url))

        run = PieceRun(conn, partner, make)  # frozen and planned
        pieces = run.pieces
        assert len(pieces) >= 3, pieces
        boundaries = [parse_instant(p["until"]) for p in pieces[:-1]]
        victims = sorted(repo.live_identifiers())[:len(boundaries)]
        for identifier, m in zip(victims, boundaries):  # stored half a second past the boundary
            repo.restamp([identifier], m + timedelta(milliseconds=500))
        on_a_boundary = sorted(repo.live_identifiers())[-1]
        repo.restamp([on_a_boundary], boundaries[0])  # stamped the boundary itself: in both slices
        run.harvest_all()
        result = run.apply()
        lost = set(victims) - held(conn)
        assert not lost, f"{len(lost)} record(s) stored just after a slice boundary were harvested by no slice"
        assert held(conn) == repo.live_identifiers()
        assert result.fetched == len(repo.live_identifiers()) + 1  # the boundary record twice, merged
        assert result.upserted == len(repo.live_identifiers()) and result.unchanged == 1


def test_records_stored_just_after_each_cut_of_a_refused_window_are_harvested(conn: psycopg.Connection) -> None:
    """A window the repository refuses as too large is bisected: the halves overlap at the cut
    as slices do, so a repository comparing sub-second stamps raw loses nothing there."""
    repo = SimulatedRepository(records=300, page_size=50, seed=4, deleted_fraction=0.0, stamps="raw")
    with OaiSimulator(repo) as sim:
        sim.refuse_windows_longer_than((repo.clock_epoch - repo.earliest_stamp()) // 5, "413")
        partner = oai_partner()
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        run = PieceRun(conn, partner, lambda: adapter)
        window = run.window
        cuts = _bisection_cuts(adapter, window, sim)
        assert len(cuts) >= 3, cuts
        victims = sorted(repo.live_identifiers())[:len(cuts)]
        for identifier, m in zip(victims, cuts):  # stored half a second past the cut
            repo.restamp([identifier], m + timedelta(milliseconds=500))
        run.harvest_all()
        run.apply()
        lost = set(victims) - held(conn)
        assert not lost, f"{len(lost)} record(s) stored just after a cut of the refused window were harvested by no half"
        assert held(conn) == repo.live_identifiers()


def _bisection_cuts(adapter: Adapter, window: Window, sim: OaiSimulator) -> list[datetime]:
    """The instants the adapter cuts the refused window at: the until of every answered lower half."""
    from partner_harvest.records import HarvestItem, HarvestStats

    class Nowhere:  # a StagingSink that keeps nothing
        conn = run = attempt = None
        seq = 0

        def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None: ...

        def reset(self) -> None: ...

    mark = len(sim.requests)
    adapter.harvest(window, Nowhere(), HarvestStats())
    asked = [r for r in sim.requests[mark:] if r.get("verb") == "ListRecords" and "resumptionToken" not in r]
    top = format_instant(window.until)
    return sorted({parse_instant(r["until"]) for r in asked if r["until"] != top})
