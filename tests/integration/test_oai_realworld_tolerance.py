"""What real OAI-PMH servers do that the protocol's text does not: tolerated, end to end.

The simulator serves the shapes the real-world corpus and harvester users report (I13):
OAI error bodies under non-200 statuses, and windows refused as too large (HTTP 413, 422,
or an OAI badArgument saying so). Harvests run the pipeline into real PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.errors import HarvestError
from partner_harvest.registry import Partner
from tests.support.checks import present
from tests.support.harness import OaiHarness as Runs
from tests.support.partners import oai_partner


def partner(**options: Any) -> Partner:
    return oai_partner("refuser", retries=3, options=options)


@pytest.fixture
def repo() -> SimulatedRepository:
    return SimulatedRepository(records=400, page_size=50, deleted_fraction=0.05, seed=11)


@pytest.fixture
def sim(repo: SimulatedRepository) -> Iterator[OaiSimulator]:
    with OaiSimulator(repo) as server:
        yield server


def first_requests(sim: OaiSimulator) -> list[dict]:
    return [r for r in sim.requests if r.get("verb") == "ListRecords" and "resumptionToken" not in r]


def test_a_quiet_window_answered_no_records_match_with_http_422_is_an_empty_window(sim: OaiSimulator, repo: SimulatedRepository,
                                                                                   conn: psycopg.Connection) -> None:
    runs = Runs(sim, conn, partner())
    runs.run()
    repo.advance_clock(3600)
    sim.set_error_status("noRecordsMatch", 422)
    window, stats, result = runs.run()
    assert window.from_ is not None
    assert stats.fetched == 0 and result.fetched == 0
    assert runs.held() == repo.live_identifiers()


def test_an_expired_token_answered_with_http_400_restarts_the_window(sim: OaiSimulator, repo: SimulatedRepository,
                                                                     conn: psycopg.Connection) -> None:
    sim.set_error_status("badResumptionToken", 400)
    sim.expire_tokens_after(3)
    runs = Runs(sim, conn, partner())
    _, stats, _ = runs.run()
    assert stats.restarts == 1
    assert runs.held() == repo.live_identifiers()


@pytest.mark.parametrize("how", ["413", "422", "badArgument"])
def test_a_window_refused_as_too_large_is_bisected_until_it_answers(sim: OaiSimulator, repo: SimulatedRepository, conn: psycopg.Connection,
                                                                    how: str) -> None:
    span = repo.clock_epoch - repo.earliest_stamp()
    sim.refuse_windows_longer_than(span // 6, how)
    runs = Runs(sim, conn, partner())
    window, stats, result = runs.run()
    assert window.is_full
    assert runs.held() == repo.live_identifiers()
    # the halves share only the granule of each cut (no record here is stamped at one): each fetched once
    assert stats.fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())
    assert result.fetched == stats.fetched
    asked = first_requests(sim)
    answered = [r for r in asked if "from" in r and "until" in r]
    assert len(asked) > len(answered) > 1  # refused ones first, then smaller pieces
    assert all(r["until"] <= window.until.strftime("%Y-%m-%dT%H:%M:%SZ") for r in asked)  # within the frozen bounds
    # the first piece keeps the window's open start (a wrong earliestDatestamp loses nothing)
    assert any("from" not in r for r in asked[1:])


def test_an_incremental_window_refused_is_bisected_within_its_bounds(sim: OaiSimulator, repo: SimulatedRepository,
                                                                     conn: psycopg.Connection) -> None:
    runs = Runs(sim, conn, partner())
    runs.run()
    repo.advance_clock(4 * 86400)
    repo.edit(20)
    repo.delete(5)
    sim.clear_requests()
    sim.refuse_windows_longer_than(86400, "413")
    window, stats, _ = runs.run()
    asked = first_requests(sim)
    assert window.from_ is not None
    low = window.from_.strftime("%Y-%m-%dT%H:%M:%SZ")
    high = window.until.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert all(low <= r["from"] and r["until"] <= high for r in asked)
    assert stats.fetched == 25
    assert runs.held() == repo.live_identifiers()


def test_bisection_has_a_cap_and_then_fails_naming_the_refusal(sim: OaiSimulator, repo: SimulatedRepository,
                                                               conn: psycopg.Connection) -> None:
    sim.refuse_windows_longer_than(-1, "413")  # even a one-second window is refused
    runs = Runs(sim, conn, partner(oai={"max_window_splits": 3}))
    with pytest.raises(HarvestError, match=r"HTTP 413.*split 3 times"):
        runs.run()
    assert len(first_requests(sim)) <= 2 ** 4  # at most 1 + 2 + 4 + 8 pieces asked


def test_a_quiet_nights_probe_of_a_refused_window_falls_back_to_the_bisecting_harvest(sim: OaiSimulator, repo: SimulatedRepository,
                                                                                      conn: psycopg.Connection) -> None:
    """The quiet-night probe (OaiAdapter.window_is_empty) asks the whole frozen window in one
    request. After an outage the window has grown past what the repository answers: the probe
    must send the night the ordinary way (which bisects the window), not fail every try."""
    runs = Runs(sim, conn, partner())
    runs.run()
    repo.advance_clock(600)
    _, stats, _ = runs.run()
    assert stats.fetched == 0  # a quiet night: the next one probes
    repo.advance_clock(4 * 86400)  # the partner's server was down for four nights
    added = repo.add(3)
    sim.refuse_windows_longer_than(86400, "413")
    window = runs.freeze()
    assert runs.adapter().window_is_empty(window) is False
    _, stats, _ = runs.run(window=window)
    assert stats.fetched == 3 and set(added) <= runs.held()
    assert runs.held() == repo.live_identifiers()


def test_a_sliced_full_harvest_whose_count_probe_is_refused_is_harvested_whole_and_bisected(sim: OaiSimulator, repo: SimulatedRepository,
                                                                                            conn: psycopg.Connection) -> None:
    """The slice planner's count probe (one ListIdentifiers of the whole list) is refused as too
    large like the harvest's own request: the plan goes on without a count, not fails."""
    span = repo.clock_epoch - repo.earliest_stamp()
    sim.refuse_windows_longer_than(span // 6, "413")
    runs = Runs(sim, conn, oai_partner("refuser", retries=3, slicing={"threshold_records": 100,
                                                                       "target_records": 50, "max_slices": 4}))
    window, stats, _ = runs.run()
    assert window.is_full
    assert runs.held() == repo.live_identifiers()


def test_the_reconcile_sweep_of_a_repository_refusing_long_windows_is_bisected(sim: OaiSimulator, repo: SimulatedRepository,
                                                                               conn: psycopg.Connection) -> None:
    """The reconcile's sweep (one ListIdentifiers, no from, no until) meets the same refusal as
    the harvest: it is cut like the harvest's windows, the last piece still open-ended."""
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.reconcile import reconcile

    span = repo.clock_epoch - repo.earliest_stamp()
    sim.refuse_windows_longer_than(span // 6, "413")
    runs = Runs(sim, conn, partner())
    runs.run()
    vanished = set(repo.delete(4))
    added = set(repo.add(3))
    sim.clear_requests()
    result = reconcile(build_adapter(runs.partner, Endpoint(sim.base_url)), conn, runs.partner, "reconcile-1")
    assert runs.held() == repo.live_identifiers() and not vanished & runs.held() and added <= runs.held()
    assert result.plan.missing == 3
    sweep = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "resumptionToken" not in r]
    assert sweep[0] == {"verb": "ListIdentifiers", "metadataPrefix": "oai_dc"}  # the whole list first, refused
    assert any("from" in r and "until" not in r for r in sweep[1:])  # the last piece open-ended


def test_the_list_identifiers_witness_of_a_refused_window_counts_the_bisected_list(sim: OaiSimulator, repo: SimulatedRepository,
                                                                                   conn: psycopg.Connection) -> None:
    """The completeness witness (a separate ListIdentifiers count) tolerates the refusal the
    harvest bisected: it proves the harvest, not 'could not count'."""
    span = repo.clock_epoch - repo.earliest_stamp()
    sim.refuse_windows_longer_than(span // 6, "422")
    runs = Runs(sim, conn, oai_partner("refuser", retries=3, options={"completeness": {"list_identifiers": True}}))
    window, stats, _ = runs.run()
    kind, expected, found, ok, detail = present(conn.execute(
        "SELECT check_kind, check_expected, check_found, check_ok, check_detail FROM harvest_runs"
        " WHERE partner_id = 'refuser' ORDER BY started_at DESC LIMIT 1").fetchone())
    conn.commit()
    assert (kind, ok) == ("oai-list-identifiers", True), detail
    assert expected == found == stats.fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())
