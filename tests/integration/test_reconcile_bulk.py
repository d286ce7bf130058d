"""Many missing records come back through one ListRecords stream, not one GetRecord each.

Real PostgreSQL, the OAI-PMH simulator over loopback; request counts come from the
simulator's own request log.
"""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.reconcile import reconcile
from partner_harvest.records import HarvestStats, Tombstone
from partner_harvest.store import RunRef, StagingWriter, begin_run
from partner_harvest.store.reconcile import MissingOnlySink
from tests.support.db import held as held_by
from tests.support.db import outcomes as audit
from tests.support.harness import run_once
from tests.support.partners import oai_partner

# These tests count the reconcile's requests for missing records: no content-check sample beside them.
UNCHECKED = {"content_check": {"mode": "off"}}


def lose_locally(conn: psycopg.Connection, ids: list[str]) -> None:
    """A restore from an old backup, a bad manual DELETE: records the partner still has."""
    conn.execute("DELETE FROM records WHERE partner_id = 'museum' AND identifier = ANY(%s)", (ids,))
    conn.commit()


def held(conn: psycopg.Connection) -> set[str]:
    return held_by(conn, "museum")


def verbs(sim: OaiSimulator) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in sim.requests:
        counts[request.get("verb", "?")] = counts.get(request.get("verb", "?"), 0) + 1
    return counts





def test_two_thousand_missing_records_take_a_list_stream_not_two_thousand_requests(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=5000, page_size=500, deleted_fraction=0.02, seed=51)
    with OaiSimulator(repo) as sim:
        partner = oai_partner(options=UNCHECKED)
        run_once(sim, conn, partner, "full")
        lost = random.Random(5).sample(sorted(repo.live_identifiers()), 2000)
        lose_locally(conn, lost)
        sim.clear_requests()
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        assert held(conn) == repo.live_identifiers()
        count = verbs(sim)
        assert count.get("GetRecord", 0) == 0
        assert result.bulk_fetch and result.plan.missing == 2000
        assert result.fetched_missing == 2000 and result.upserted == 2000 and result.purged == 0
        # the sweep (5000 headers) and the list stream: ten pages each at most, plus Identify
        assert count["ListIdentifiers"] <= 10 and count["ListRecords"] <= 10
        assert sum(count.values()) <= 25
        # only the missing records were staged: the apply found nothing 'unchanged'
        fetched, upserted, unchanged, purged, quarantined = audit(conn, "rec")
        assert (fetched, upserted, unchanged) == (2000, 2000, 0)
        assert upserted + unchanged + purged + quarantined == fetched


def test_the_list_stream_covers_only_the_missing_records_datestamps(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=3000, page_size=200, deleted_fraction=0.0, seed=52)
    with OaiSimulator(repo) as sim:
        partner = oai_partner(options=UNCHECKED)
        run_once(sim, conn, partner, "full")
        newest = sorted(repo.select(), key=lambda r: r.stamp)[-600:]
        lose_locally(conn, [r.identifier for r in newest])
        sim.clear_requests()
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        assert held(conn) == repo.live_identifiers() and result.fetched_missing == 600
        stream = [r for r in sim.requests if r.get("verb") == "ListRecords" and "resumptionToken" not in r]
        oldest = min(r.datestamp for r in newest)
        assert len(stream) == 1 and stream[0]["from"] == oldest.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert sum(1 for r in sim.requests if r.get("verb") == "ListRecords") <= 4  # 600 of 3000, 200 a page
        assert held(conn) == repo.live_identifiers()


def test_missing_records_edited_during_the_list_stream_are_fetched_by_id(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=2000, page_size=100, deleted_fraction=0.0, seed=53)
    with OaiSimulator(repo) as sim:
        partner = oai_partner(options=UNCHECKED)
        run_once(sim, conn, partner, "full")
        lost = sorted(repo.live_identifiers())[:800]
        lose_locally(conn, lost)
        sim.requery_pages()
        # staff re-date five lost records the stream has not reached: they leave its window
        late = lost[-5:]
        sim.mutate_after_pages(2, edit_ids=late, verb="ListRecords")
        sim.clear_requests()
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        assert sim.mutations and sim.mutations[0]["edited"] == late
        assert result.fetched_missing == 800
        assert sorted(r["identifier"] for r in sim.requests if r.get("verb") == "GetRecord") == late
        assert held(conn) == repo.live_identifiers()
        versions = conn.execute("SELECT count(*) FROM records WHERE identifier = ANY(%s) AND datestamp = %s",
                                (late, repo.clock)).fetchone()
        assert versions == (5,)


def test_few_missing_records_still_go_by_id(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=1000, page_size=200, deleted_fraction=0.0, seed=54)
    with OaiSimulator(repo) as sim:
        partner = oai_partner(options=UNCHECKED)
        run_once(sim, conn, partner, "full")
        lose_locally(conn, sorted(repo.live_identifiers())[100:140])
        sim.clear_requests()
        result = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rec")
        assert not result.bulk_fetch and result.fetched_missing == 40
        assert verbs(sim).get("GetRecord") == 40 and "ListRecords" not in verbs(sim)
        assert held(conn) == repo.live_identifiers()


def test_an_expired_token_in_the_list_stream_drops_only_what_the_stream_staged(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=1000, page_size=100, deleted_fraction=0.0, seed=55)
    with OaiSimulator(repo) as sim:
        partner = oai_partner(options=UNCHECKED)
        run_once(sim, conn, partner, "full")
        lost = sorted(repo.live_identifiers())[::2]
        lose_locally(conn, lost)
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        window = pipeline.freeze_window(adapter, timedelta(0), None, pipeline.RunRequest("full"))
        run = RunRef("museum", "rec", "reconcile")
        begin_run(conn, run, window, "oai_dc")
        writer = StagingWriter(conn, run)
        writer.write_page([Tombstone("oai:elsewhere:1", repo.clock)])  # staged before the stream
        sink = MissingOnlySink(conn, writer, "museum")
        sim.expire_tokens_after(3)
        stats = HarvestStats()
        adapter.harvest(window, sink, stats)
        assert stats.restarts == 1 and sink.staged == len(lost) == 500
        rows = conn.execute("SELECT seq, identifier FROM staging WHERE run_id = 'rec' ORDER BY seq").fetchall()
        conn.commit()
        assert rows[0] == (1, "oai:elsewhere:1")
        assert [i for _, i in rows[1:]] == lost and [s for s, _ in rows] == list(range(1, 502))
