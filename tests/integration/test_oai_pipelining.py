"""Pipelined token chains: page N+1 is fetched while page N is staged, never page N+2.

Real simulator over loopback and real PostgreSQL; the client's ``fetch`` is wrapped only
to observe (and, for the error test, to arm the simulator just before a real request).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from benchmarks import baselines
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.errors import PartnerHttpError
from partner_harvest.factory import Endpoint
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.records import HarvestItem, HarvestStats
from partner_harvest.store import RunRef, StagingWriter
from partner_harvest.store.db import scalar
from tests.support.partners import built, oai_partner

PAGES = 6


def _fetchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("oai-fetch")]


class Observed:
    """Records, per list request, when it started; and per staged page, what was asked."""

    def __init__(self, sim: OaiSimulator, monkeypatch: pytest.MonkeyPatch, *, sequential: bool = False,
                 fail_request: int | None = None) -> None:
        self.sim = sim
        self.adapter = built(OaiAdapter, oai_partner(), Endpoint(sim.base_url))
        if sequential:  # the benchmarks' baseline (benchmarks/baselines.py)
            baselines.sequential(self.adapter.client)
        self.window = pipeline.freeze_window(self.adapter, timedelta(minutes=10), None, pipeline.RunRequest("full"))
        self.started = [threading.Event() for _ in range(PAGES + 2)]
        self.requests = 0
        self.fail_request = fail_request
        fetch = self.adapter.client.fetch

        def observed_fetch(params: dict[str, str]) -> bytes:
            if params.get("verb") == "ListRecords":
                self.requests += 1
                if self.requests == self.fail_request:
                    sim.fail_next(1, status=404)  # a real 404 answers this real request
                self.started[self.requests].set()
            return fetch(params)

        monkeypatch.setattr(self.adapter.client, "fetch", observed_fetch)

    def harvest(self, sink: StagingWriter) -> HarvestStats:
        stats = HarvestStats()
        self.adapter.harvest(self.window, sink, stats)
        return stats


@pytest.fixture
def sim() -> Iterator[OaiSimulator]:
    repo = SimulatedRepository(records=PAGES * 100, page_size=100, deleted_fraction=0.0, seed=5)
    with OaiSimulator(repo) as sim:
        yield sim


def test_next_page_is_fetched_while_this_one_is_staged_never_two_ahead(sim: OaiSimulator, conn: psycopg.Connection, db: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    observed = Observed(sim, monkeypatch)
    seen: list[tuple[int, int, int]] = []  # (page, requests made when staging began, rows staged then)

    class Sink(StagingWriter):
        pages = 0

        def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None:
            self.pages += 1
            page = self.pages
            if page < PAGES:  # the overlap itself: request page+1 starts while page waits here
                assert observed.started[page + 1].wait(10), f"page {page + 1} not requested while {page} staged"
            with psycopg.connect(db, autocommit=True) as observer:
                staged = scalar(observer.execute("SELECT count(*) FROM staging"))
            seen.append((page, observed.requests, staged))
            super().write_page(items, checkpoint)

    interval = sys.getswitchinterval()
    stats = observed.harvest(Sink(conn, RunRef("museum", "run-1")))
    assert sys.getswitchinterval() == interval  # shortened while the chain ran, restored after
    assert stats.pages == PAGES and stats.fetched == PAGES * 100
    # Staging page N: N+1 requests made (the last page: no more), pages 1..N-1 committed.
    assert seen == [(n, min(n + 1, PAGES), (n - 1) * 100) for n in range(1, PAGES + 1)]
    assert observed.requests == PAGES and _fetchers() == []


def test_the_sequential_baseline_requests_each_page_after_the_last_is_staged(sim: OaiSimulator, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    observed = Observed(sim, monkeypatch, sequential=True)
    asked: list[int] = []

    class Sink(StagingWriter):
        def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None:
            asked.append(observed.requests)
            super().write_page(items, checkpoint)

    stats = observed.harvest(Sink(conn, RunRef("museum", "run-1")))
    assert stats.fetched == PAGES * 100
    assert asked == list(range(1, PAGES + 1))


def test_fetch_error_mid_chain_raises_its_own_type_and_leaves_no_thread(sim: OaiSimulator, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    observed = Observed(sim, monkeypatch, fail_request=3)
    staged: list[int] = []

    class Sink(StagingWriter):
        def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None:
            staged.append(len(items))
            super().write_page(items, checkpoint)

    with pytest.raises(PartnerHttpError) as caught:
        observed.harvest(Sink(conn, RunRef("museum", "run-1")))
    assert type(caught.value) is PartnerHttpError
    assert "HTTP 404" in str(caught.value) and "resumptionToken" in str(caught.value)
    assert staged == [100, 100]  # pages 1 and 2 staged; page 3's request failed
    assert _fetchers() == []


def test_failing_sink_stops_the_fetcher_and_keeps_its_error(sim: OaiSimulator, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    observed = Observed(sim, monkeypatch)

    class Boom(Exception):
        pass

    class Sink(StagingWriter):
        def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None:
            raise Boom("the database went away")

    interval = sys.getswitchinterval()
    with pytest.raises(Boom):
        observed.harvest(Sink(conn, RunRef("museum", "run-1")))
    assert _fetchers() == [] and sys.getswitchinterval() == interval
    assert observed.requests <= 2  # page 1, and at most the prefetched page 2


def test_a_chain_never_has_two_requests_in_flight_at_the_partner(sim: OaiSimulator, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the partner's pool counts on: one chain, one request at a time, seen server-side
    (a harvest, its completeness count, and count probes closed after their first page)."""
    from partner_harvest.oai import slicing

    sim.set_response_delay(20)  # requests last long enough to overlap, if the client let them
    observed = Observed(sim, monkeypatch)
    observed.adapter.partner = oai_partner(options={"completeness": {"list_identifiers": True}})
    stats = observed.harvest(StagingWriter(conn, RunRef("museum", "run-1")))
    for _ in range(2):  # plan_slices' probes: the prefetch in flight is awaited at close
        assert slicing.list_size(observed.adapter.client, "oai_dc", None, "YYYY-MM-DDThh:mm:ssZ", None,
                                 observed.window.until) == PAGES * 100
    assert stats.fetched == PAGES * 100 and [c[3] for c in stats.checks] == [True, True]
    assert sim.wait_idle(timeout=10) and sim.max_in_flight == 1


def test_the_next_request_leaves_before_this_page_is_parsed(sim: OaiSimulator, conn: psycopg.Connection,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The token is read off the raw bytes, so request N+1 is at the partner while page N
    is still being parsed: parsing is off the chain's critical path."""
    from partner_harvest.oai import parse

    observed = Observed(sim, monkeypatch)
    opened = parse._open
    parsed: list[int] = []

    def parse_waiting_for_the_next_request(content: bytes, **kwargs: Any) -> Any:
        if b"<ListRecords>" in content:
            parsed.append(len(parsed) + 1)
            page = parsed[-1]
            if page < PAGES:
                assert observed.started[page + 1].wait(10), f"page {page + 1} not requested before {page} was parsed"
        return opened(content, **kwargs)

    monkeypatch.setattr(parse, "_open", parse_waiting_for_the_next_request)
    stats = observed.harvest(StagingWriter(conn, RunRef("museum", "run-1")))
    assert stats.fetched == PAGES * 100 and parsed == list(range(1, PAGES + 1))
    assert observed.requests == PAGES and _fetchers() == []


def test_token_markup_that_defeats_the_guess_costs_no_extra_request(sim: OaiSimulator, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Padding, CDATA, character references and a decoy comment, page by page: every page
    is asked for once (a CDATA or ambiguous page waits for its parse instead)."""
    sim.set_token_markup("varied")
    sim.set_response_delay(20)
    observed = Observed(sim, monkeypatch)
    stats = observed.harvest(StagingWriter(conn, RunRef("museum", "run-1")))
    assert stats.fetched == PAGES * 100 and stats.restarts == 0
    assert observed.requests == PAGES and sim.max_in_flight == 1 and sim.errors == []


def test_a_wrong_guess_is_dropped_and_the_chain_still_ends_exactly(sim: OaiSimulator, conn: psycopg.Connection,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The last page leaves an old token in a comment: the guess asks for it, the parse
    finds no token, and the stray answer (badResumptionToken) is waited for and dropped:
    no restart, no extra page, still one request at a time.

    The last page's parse waits until the guessed request has started: on a loaded
    machine the parse could otherwise win, and a guess not yet sent is cancelled unsent."""
    sim.set_token_markup("stale-comment")
    sim.set_response_delay(20)
    observed = Observed(sim, monkeypatch)
    from partner_harvest.oai import parse

    parse_page, parsed = parse.parse_list_page, []

    def parse_after_the_guess_left(content: bytes, *args: Any, **kwargs: Any) -> Any:
        parsed.append(1)
        if len(parsed) == PAGES:
            assert observed.started[PAGES + 1].wait(10), "the guessed request never started"
        return parse_page(content, *args, **kwargs)

    monkeypatch.setattr(parse, "parse_list_page", parse_after_the_guess_left)
    stats = observed.harvest(StagingWriter(conn, RunRef("museum", "run-1")))
    assert stats.fetched == PAGES * 100 and stats.pages == PAGES and stats.restarts == 0
    staged = scalar(conn.execute("SELECT count(DISTINCT identifier) FROM staging WHERE run_id = 'run-1'"))
    assert staged == PAGES * 100
    assert sim.wait_idle(timeout=10)
    assert observed.requests == PAGES + 1 and sim.max_in_flight == 1
    assert sim.requests[-1].get("resumptionToken", "").endswith("+stale")  # the dropped request
    assert sim.errors == []
    assert _fetchers() == []
