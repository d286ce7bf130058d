"""Recorded real OAI-PMH chains harvested through the pipeline into real PostgreSQL.

Each recording (tests/fixtures/realworld/oai, sources in its SOURCES.md) is served by the
replay server on loopback and harvested the way the DAG's tasks do it (the OaiAdapter
built by the factory, ``partner_harvest.run`` over the recording's window: staging, apply). The
window is the one the recorder asked for, so the harvest's first request is the recorded
one.

The expected outcome of each row is written from the standard, not from our code:
OAI-PMH 2.0 §2.5.1 (a header with ``status="deleted"`` is a tombstone), §3.5 (``<metadata>``
holds exactly one payload element, a live record has one), §2.5/§3.2 (a header without an
identifier or datestamp cannot be placed), oai_dc (a record must be showable: a
``dc:title``) and MARC 21 (a leader is 24 characters, blanks included). ``live`` counts the
identifiers ``records`` must hold afterwards, ``deleted`` the tombstones fetched and
``rejected`` the quarantine rows. A chain cut by its recorder (the next page was not
recorded) is marked ``cut``: the replay ends it with ``noRecordsMatch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from include.simulators.replay import ReplayServer, load_recording
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.parse import DAY_GRANULARITY, SECOND_GRANULARITY
from partner_harvest.records import HarvestStats
from partner_harvest.run import run_partner
from partner_harvest.store.apply import ApplyResult
from partner_harvest.store.db import scalar
from partner_harvest.window import DAY, SECONDS, Window, WindowFacts, parse_instant
from tests.support.partners import fast_http, oai_partner

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "oai"
# arXiv's recorded 503 asks for 10 s (Retry-After); the replay honours it, capped to keep the test fast.
FAST_HTTP = {"http": fast_http(3, retry_after_cap=0.2)}


@dataclass(frozen=True)
class Expected:
    path: str
    prefix: str
    from_: str | None
    until: str
    live: int
    deleted: int = 0
    rejected: int = 0
    set_spec: str | None = None
    cut: bool = False
    why: str = ""


# One row per recorded ListRecords chain. Counts read off the recordings by the rules above.
EXPECTED = [
    Expected("bepress/calpoly_ListRecords-3pages.yaml", "oai_dc", "2015-03-10", "2015-03-11", 208,
             why="3 pages; self-closing last token with completeListSize"),
    Expected("bhl/bhl_ListRecords.yaml", "oai_dc", "2015-03-10", "2015-03-11", 42),
    Expected("datacite/datacite_ListRecords-2pages.yaml", "oai_dc", "2012-12-19T00:00:00Z", "2012-12-21T00:00:00Z", 56,
             why="token with commas; empty last token"),
    Expected("dspace/hacettepe_ListRecords-2pages.yaml", "oai_dc", "2013-06-01T00:00:00Z", "2013-06-03T00:00:00Z", 103),
    Expected("dspace/eur-dspace-2003_ListRecords.xml", "oai_dc", "2003-04-10", "2003-04-30", 16),
    Expected("dspace/eur-dspace-2004_ListRecords-252KB.xml", "oai_dc", "2004-01-01", "2004-02-17", 79, deleted=2),
    Expected("eprints/cogprints_ListRecords.yaml", "oai_dc", "2015-04-19", "2015-04-20", 45),
    Expected("esgf/ncar-earthsystemgrid_ListRecords-dif.yaml", "dif", "2015-10-04T00:00:00Z", "2015-10-06T00:00:00Z", 1,
             why="served as text/html"),
    Expected("hubzero/purr_ListRecords-redirect.yaml", "oai_dc", "2015-11-30T00:00:00Z", "2015-12-02T00:00:00Z", 1,
             why="302 first"),
    Expected("humcore/mla-commons_ListRecords-14pages.yaml", "oai_dc", "2016-05-25T00:00:00Z", "2016-05-27T00:00:00Z",
             319, why="the last token is answered noRecordsMatch"),
    Expected("icpsr/icpsr_ListRecords.yaml", "oai_dc", "2007-12-19", "2007-12-21", 4),
    Expected("invenio/zenodo_ListRecords.yaml", "oai_dc", "2015-04-27T00:00:00Z", "2015-04-28T00:00:00Z", 7),
    Expected("nsdl/nsdl_ListRecords_nsdl_dc-544KB.xml", "nsdl_dc", "2012-08-03T08:00:22Z", "2012-08-06T20:55:41Z", 162),
    Expected("oaicat/scholarsportal-dvn_ListRecords-2pages.yaml", "oai_dc", "2015-04-21", "2015-04-22", 4, deleted=15),
    Expected("pmc/pmc_ListRecords-17pages.yaml", "oai_dc", "2014-12-24", "2014-12-25", 844,
             why="17 pages; tokens already percent-encoded"),
    Expected("pyoai-server/asu_ListRecords-2pages.yaml", "oai_dc", "2015-03-10", "2015-03-11", 78, deleted=1),
    Expected("ruby-oai/columbia-academiccommons_ListRecords.yaml", "oai_dc", "2015-03-10T00:00:00Z",
             "2015-03-11T00:00:00Z", 6),
    Expected("sldr/sldr_ListRecords.yaml", "oai_dc", "2015-12-15", "2015-12-17", 1),
    Expected("tdar/tdar_ListRecords.yaml", "oai_dc", "2015-04-21", "2015-04-22", 24),
    Expected("arxiv/listrecords---should-list-identifiers-from-arxiv.json", "arXiv", "2015-01-01", "2015-01-03", 2,
             why="503 first, then 200"),
    Expected("subjectsplus/subjectsplus_ListRecords.xml", "oai_dc", None, "2023-03-30", 1,
             why="request echo without arguments"),
    Expected("alma/alma_ListRecords_marc21.xml", "marc21", None, "2016-06-01T07:57:34Z", 100,
             set_spec="TESTING_DIGI_TEST", cut=True, why="MARCXML, control fields in storage order"),
    Expected("doaj/doaj_ListRecords_oai_doaj.xml", "oai_doaj", None, "2017-04-06T19:23:56Z", 100, cut=True),
    Expected("gallica/bnf_ListRecords-prefixed-namespace.xml", "oai_dc", None, "2015-07-29T19:56:59Z", 1, cut=True),
    Expected("spec-examples/ListRecords.xml", "oai_dc", None, "2013-02-27T09:10:56Z", 1, deleted=1, cut=True),
    Expected("spec-examples/ListRecords4.xml", "oai_dc", None, "2013-02-27T09:10:56Z", 1, rejected=1,
             why="deleted header without identifier and datestamp: cannot be placed"),
]


def _window(row: Expected) -> Window:
    day = len(row.until) == 10
    protocol = WindowFacts.model_validate({
        "metadata_prefix": row.prefix, "oai_granularity": DAY_GRANULARITY if day else SECOND_GRANULARITY,
        "deleted_record": "persistent", "set": row.set_spec})
    granularity = DAY if day else SECONDS
    until = parse_instant(row.until)
    if row.from_ is None:
        return Window("full", None, until, granularity, advances_cursor=False, protocol=protocol)
    return Window("window", parse_instant(row.from_), until, granularity, advances_cursor=False, protocol=protocol)


def replay(conn: psycopg.Connection, row: Expected,
           partner_id: str = "replayed") -> tuple[HarvestStats, ApplyResult, ReplayServer]:
    """Harvest and apply one recording; returns (stats, apply result, server)."""
    exchanges = load_recording(CORPUS / row.path)
    partner = oai_partner(partner_id, metadata_prefix=row.prefix, set=row.set_spec, options=FAST_HTTP)
    with ReplayServer(exchanges, end_open_chains=row.cut) as server:
        adapter = build_adapter(partner, Endpoint(server.base_url))
        run = run_partner(partner, adapter, conn, "replay-1", window=_window(row))  # the recording's window
    return run.changes, run.applied, server


def held_counts(conn: psycopg.Connection, partner_id: str) -> tuple[int, int]:
    records = scalar(conn.execute("SELECT count(*) FROM records WHERE partner_id = %s", (partner_id,)))
    quarantined = scalar(conn.execute("SELECT count(*) FROM quarantine WHERE partner_id = %s", (partner_id,)))
    conn.commit()
    return records, quarantined


@pytest.mark.parametrize("row", EXPECTED, ids=lambda row: row.path)
def test_a_recorded_chain_lands_as_the_standard_says(conn: psycopg.Connection, row: Expected) -> None:
    stats, result, server = replay(conn, row)
    assert server.unmatched == [], f"requests no recording answers: {server.unmatched}"
    assert (stats.records, stats.tombstones, stats.rejected) == (row.live, row.deleted, row.rejected)
    assert held_counts(conn, "replayed") == (row.live, row.rejected)
    assert result.fetched == row.live + row.deleted + row.rejected
    assert result.quarantined == row.rejected


def test_the_table_covers_every_recorded_list_records_chain() -> None:
    """A recording added to the corpus without a row here is noticed."""
    chains = set()
    for path in CORPUS.rglob("*"):
        if path.suffix in (".xml", ".yaml", ".json") and any(
                e.params.get("verb") == "ListRecords" and e.status == 200 and b"<ListRecords" in e.body
                for e in load_recording(path)):
            chains.add(str(path.relative_to(CORPUS)))
    assert chains == {row.path for row in EXPECTED}
