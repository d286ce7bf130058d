"""Looks that need one page ask for one page: the plan's probes (a range's count, the sample of
a repository without counts) and the quiet night's look read a list's first page only. A
pipelined chain sends the next page's request as soon as it sees a token; for these looks that
request is wasted on the partner and waited for before the look returns (one response time
more, on every probe of the plan). The OAI-PMH simulator on loopback logs every request."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from tests.support.harness import PieceRun as Run
from tests.support.partners import oai_partner


def _continuations(sim: OaiSimulator) -> list[dict]:
    return [r for r in sim.requests if "resumptionToken" in r]


@pytest.mark.parametrize("list_size", ["exact", "omitted"])
def test_the_plans_probes_ask_for_first_pages_only(conn: psycopg.Connection, list_size: str) -> None:
    repo = SimulatedRepository(records=2_000, page_size=100, seed=3, deleted_fraction=0.05)
    with OaiSimulator(repo, list_size=list_size) as sim:
        partner = oai_partner(slicing={"threshold_records": 300, "target_records": 300, "max_slices": 4,
                                       "without_count": 4})
        run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)), mode="full")
        probes = [r for r in sim.requests if r.get("verb") == "ListIdentifiers"]
        assert len(run.pieces) >= 2 and probes, (run.pieces, sim.requests)
        assert _continuations(sim) == []


def test_the_quiet_nights_look_at_a_window_with_changes_asks_for_its_first_page_only() -> None:
    repo = SimulatedRepository(records=500, page_size=100, seed=3)
    with OaiSimulator(repo) as sim:
        partner = oai_partner()
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        window = pipeline.freeze_window(adapter, timedelta(0), None, pipeline.RunRequest("full"))
        sim.requests.clear()
        assert not adapter.window_is_empty(window)
        assert [r.get("verb") for r in sim.requests] == ["ListRecords"]
