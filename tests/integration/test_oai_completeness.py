"""Completeness of an OAI-PMH full harvest, proven by a second witness (I12).

The simulator over loopback and real PostgreSQL: the check lands on the run's
``harvest_runs`` row, where the alerts read it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store.db import one
from partner_harvest.window import SECONDS, Window, WindowFacts, format_instant
from tests.support.harness import run_once
from tests.support.partners import built
from tests.support.partners import oai_partner as support_oai_partner

FAST: dict[str, Any] = {}  # the test partner's own quick HTTP retries (tests/support/partners.py)
WITNESS = {"completeness": {"list_identifiers": True}}


def oai_partner(options: dict[str, Any], **kw: Any) -> Partner:
    return support_oai_partner(options=options, **kw)


def harvest(sim: OaiSimulator, conn: psycopg.Connection, partner: Partner, run_id: str = "full",
            cursor: datetime | None = None) -> tuple[Window, HarvestStats]:
    result = run_once(sim, conn, partner, run_id, {"changes": cursor})
    return result.window, result.changes


def check(conn: psycopg.Connection, run_id: str) -> tuple:
    row = one(conn.execute(
        "SELECT check_kind, check_expected, check_found, check_ok, check_detail, status, list_size_mismatch"
        " FROM harvest_runs WHERE run_id = %s", (run_id,)))
    conn.commit()
    return row


def test_an_honest_full_harvest_is_proven_by_a_list_identifiers_count(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=1200, page_size=100, deleted_fraction=0.05, invalid_every=97, seed=61)
    with OaiSimulator(repo) as sim:
        window, stats = harvest(sim, conn, oai_partner(WITNESS))
        assert stats.rejected > 0 and stats.tombstones > 0  # rejects and tombstones count too
        kind, expected, found, ok, detail, status, _ = check(conn, "full")
        assert (kind, expected, found, ok, status) == ("oai-list-identifiers", 1200, 1200, True, "applied")
        assert "lists 1200 headers" in detail
        witness = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "resumptionToken" not in r]
        assert witness == [{"verb": "ListIdentifiers", "metadataPrefix": "oai_dc",
                            "until": format_instant(window.until)}]


def test_a_list_that_stops_short_fails_both_witnesses(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=2000, page_size=100, deleted_fraction=0.0, seed=62)
    with OaiSimulator(repo) as sim:
        sim.end_list_after(3)  # the ListRecords chain ends after 300 records, silently
        _, stats = harvest(sim, conn, oai_partner(WITNESS))
        assert stats.fetched == 300
        kind, expected, found, ok, detail, status, mismatch = check(conn, "full")
        assert (kind, expected, found, ok) == ("oai-list-identifiers", 2000, 300, False)
        assert mismatch and status == "applied"  # applied: what arrived is good, only incomplete
        assert "lists 2000 headers; the harvest fetched 300" in detail


def test_without_the_option_the_complete_list_size_is_the_witness(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=800, page_size=100, deleted_fraction=0.0, seed=63)
    with OaiSimulator(repo) as sim:
        harvest(sim, conn, oai_partner(FAST), "honest")
        assert check(conn, "honest")[:4] == ("oai-complete-list-size", 800, 800, True)
        sim.end_list_after(2)
        harvest(sim, conn, oai_partner(FAST), "short")
        kind, expected, found, ok, detail, _, _ = check(conn, "short")
        assert (kind, expected, found, ok) == ("oai-complete-list-size", 800, 200, False)
        assert "completeListSize=800" in detail
        assert not [r for r in sim.requests if r.get("verb") == "ListIdentifiers"]


def test_incremental_windows_are_not_checked(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=500, page_size=100, deleted_fraction=0.0, seed=64)
    with OaiSimulator(repo) as sim:
        window, _ = harvest(sim, conn, oai_partner(WITNESS), "first")
        repo.edit(150)
        sim.clear_requests()
        harvest(sim, conn, oai_partner(WITNESS), "second", cursor=window.until)
        assert check(conn, "second")[:4] == (None, None, None, None)
        assert not [r for r in sim.requests if r.get("verb") == "ListIdentifiers"]


def test_the_witness_counts_the_same_set(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=900, page_size=100, deleted_fraction=0.0, seed=65)
    with OaiSimulator(repo) as sim:
        _, stats = harvest(sim, conn, oai_partner(WITNESS, set="type:print"))
        in_set = len(repo.select(set_spec="type:print"))
        assert check(conn, "full")[:4] == ("oai-list-identifiers", in_set, in_set, True)
        witness = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "resumptionToken" not in r]
        assert witness[0]["set"] == "type:print"


def test_a_witness_that_fails_proves_nothing_and_does_not_fail_the_harvest() -> None:
    repo = SimulatedRepository(records=300, page_size=100, deleted_fraction=0.0, seed=66)
    with OaiSimulator(repo) as sim:
        adapter = built(OaiAdapter, oai_partner(WITNESS), Endpoint(sim.base_url))
        stats = HarvestStats(fetched=300, records=300)
        sim.fail_next(10, status=503)  # more than the HTTP retries
        window = Window("full", None, datetime(2026, 1, 1, tzinfo=timezone.utc), SECONDS, True,
                        WindowFacts(metadata_prefix="oai_dc", oai_granularity="YYYY-MM-DDThh:mm:ssZ"))
        kind, expected, found, ok, detail = adapter._list_identifiers_check("oai_dc", window, stats)
        assert (kind, expected, found, ok) == ("oai-list-identifiers", None, 300, False)
        assert "could not count" in detail and "HTTP 503" in detail and "nothing proven" in detail
