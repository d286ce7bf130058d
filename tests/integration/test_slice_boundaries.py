"""Slice boundaries lose no record whatever the partner's clock resolution (I13).

The simulator stores sub-second stamps and compares ``from``/``until`` with them raw (as
some repositories do, against OAI-PMH's granules): ``until=m`` leaves out a record stored at
``m + 0.5 s`` and so does ``from=m + 1 s``. Adjacent slices ``[.., m]``, ``[m + 1 s, ..]`` lost
it; slices that overlap at ``m`` harvest it (and the apply merges a record stamped ``m``
that both slices return). Real PostgreSQL, the simulator over loopback.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.adapters import Adapter
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.window import format_instant, parse_instant
from tests.support.db import held as held_by
from tests.support.harness import PieceRun
from tests.support.partners import oai_partner

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
