"""Slices that balance without counts: the OAI-PMH simulator on loopback
serves a repository that announces no completeListSize and whose records cluster (a few
bursts, a trickle over part of the year; the seed varies them, I13), listed by identifier or
by datestamp; real PostgreSQL. The plan cuts by what the first pages show
(oai/sampled_cut.py); equal time ranges (main's planner) are the contrast."""

from __future__ import annotations

import bisect

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai import sampled_cut
from tests.support.db import held
from tests.support.harness import PieceRun as Run
from tests.support.partners import oai_partner

RECORDS, PAGE = 2_000, 100


def sizes(repo: SimulatedRepository, pieces: list[dict]) -> list[int]:
    """What each planned slice holds in the simulator (its from..until, inclusive)."""
    stamps = sorted(repo._stamp)
    out = []
    for p in pieces:
        low = 0 if p["from"] is None else bisect.bisect_left(stamps, _epoch(p["from"]))
        out.append(bisect.bisect_right(stamps, _epoch(p["until"])) - low)
    return out


def _epoch(text: str) -> int:
    from partner_harvest.window import parse_instant

    return int(parse_instant(text).timestamp())


@pytest.mark.parametrize(("seed", "order"), [(1, "identifier"), (9, "identifier"),
                                             pytest.param(9, "datestamp", marks=pytest.mark.slow)])
def test_a_clustered_repository_without_counts_is_cut_into_slices_of_similar_size(conn: psycopg.Connection, seed: int,
                                                                                  order: str) -> None:
    """Four equal time ranges of these repositories hold e.g. 9,090 / 1,393 / 27,914 / 11,602
    of 50,000 (seed 1): the run waits on the biggest. Listed by identifier, the cut by the
    first page keeps the biggest slice within 1.5x of an even share; listed by datestamp the
    estimate is rougher (sampled_cut.py) and only exactness is asserted. Either way the run
    is exact (every item once, but for a boundary granule's)."""
    repo = SimulatedRepository(records=RECORDS, page_size=PAGE, seed=seed, deleted_fraction=0.05,
                               spread="clustered", list_order=order)
    with OaiSimulator(repo, list_size="omitted") as sim:
        partner = oai_partner(slicing={"threshold_records": 300, "target_records": 150, "max_slices": 8,
                                       "without_count": 4})
        run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)), mode="full")
        held_by = sizes(repo, run.pieces)
        assert len(run.pieces) == 4, run.pieces
        if order == "identifier":
            assert max(held_by) <= 1.5 * RECORDS / 4, held_by
        run.harvest_all()
        result = run.apply()
    assert held(conn, partner.id) == repo.live_identifiers()
    overlap = sum(held_by) - RECORDS  # records on a boundary granule come twice, merged by the apply
    assert result.fetched == RECORDS + overlap and overlap <= 3


def test_equal_time_ranges_of_the_same_repository_are_uneven() -> None:
    """The contrast (main's planner, what a sampler-less plan still does): equal ranges of
    the clustered repository leave one slice with far more than an even share."""
    repo = SimulatedRepository(records=RECORDS, seed=1, spread="clustered")
    stamps = sorted(repo._stamp)
    low, high = stamps[0], stamps[-1] + 1
    quarters = [bisect.bisect_left(stamps, low + (high - low) * (k + 1) // 4)
                - bisect.bisect_left(stamps, low + (high - low) * k // 4) for k in range(4)]
    assert max(quarters) > 2 * RECORDS / 4, quarters


def test_the_order_of_a_page_tells_a_sample_from_a_datestamp_index() -> None:
    from datetime import datetime, timedelta, timezone

    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    rising = tuple(t0 + timedelta(seconds=i) for i in range(100))
    shuffled = tuple(rising[(i * 37) % 100] for i in range(100))
    assert sampled_cut.ordered(rising) and not sampled_cut.ordered(shuffled)


def test_the_simulator_varies_its_clusters_with_the_seed() -> None:
    """I13: the bursts' number, places and shares are the seed's, not one fixed shape."""
    shapes = set()
    for seed in (1, 2, 3):
        stamps = sorted(SimulatedRepository(records=2_000, seed=seed, spread="clustered")._stamp)
        shapes.add(tuple(stamps[i] // 86400 for i in range(0, 2_000, 400)))
    assert len(shapes) == 3
    ordered = SimulatedRepository(records=500, seed=1, spread="clustered", list_order="datestamp")
    numbers = ordered.select_numbers()
    assert [ordered._stamp[n - 1] for n in numbers] == sorted(ordered._stamp)
