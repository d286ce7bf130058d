"""Guards that a broken build used to slip past: each test here fails when only its guard
is removed (see tests/INVARIANTS.md for the mutation each was checked against).

Real PostgreSQL and the OAI-PMH simulator over loopback; only public pipeline and
reconcile functions are driven.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline, run
from partner_harvest.adapters import Adapter, IdSink, SweptId
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.reconcile import MassPurgeRefused, reconcile
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef
from partner_harvest.store.apply import ApplyResult
from partner_harvest.store.db import scalar
from partner_harvest.window import Window
from tests.support.db import held
from tests.support.partners import built, fast_http
from tests.support.partners import oai_partner as support_oai_partner


def oai_partner(**kw: Any) -> Partner:
    return support_oai_partner(options={"http": fast_http(2, read_timeout=120)}, **kw)


def harvest(adapter: Adapter, conn: psycopg.Connection, run_id: str) -> tuple[HarvestStats, ApplyResult]:
    """One full run: frozen and staged as the DAG's tasks do it (partner_harvest.run), then
    applied without re-staging: the guards here are about what the harvest staged, which the
    apply's repair of lost staging (``run.apply``) would otherwise harvest again and hide."""
    window = run.freeze(adapter.partner, adapter, conn, request=pipeline.RunRequest("full"))
    _, staged = run.stage(adapter.partner, adapter, conn, run_id, window)
    return staged["changes"], pipeline.apply_changes(conn, adapter.partner_id, run_id)


def audit_rows(conn: psycopg.Connection, run_id: str) -> list[dict]:
    cur = conn.execute("SELECT * FROM harvest_runs WHERE run_id = %s ORDER BY channel", (run_id,))
    names = [d.name for d in cur.description or ()]
    rows = [dict(zip(names, row)) for row in cur.fetchall()]
    conn.commit()
    return rows


def assert_audit_adds_up(conn: psycopg.Connection, run_id: str) -> None:
    """I6: every fetched item is upserted, unchanged, purged or quarantined, exactly once."""
    rows = audit_rows(conn, run_id)
    assert rows
    for row in rows:
        outcomes = row["upserted"] + row["unchanged"] + row["purged"] + row["quarantined"]
        assert row["status"] == "applied" and outcomes == row["fetched"], row


def quarantined(conn: psycopg.Connection, run_id: str) -> list[str]:
    ids = [r[0] for r in conn.execute(
        "SELECT identifier FROM quarantine WHERE run_id = %s ORDER BY identifier", (run_id,)).fetchall()]
    conn.commit()
    return ids


# -- a token restart starts the window's staging afresh (I6, I8) ---------------------------


def test_a_token_restart_stages_the_window_once(conn: psycopg.Connection) -> None:
    """The broken attempt's pages are dropped: counts, audit and quarantine are the window's
    own, not the window's plus the broken attempt's."""
    repo = SimulatedRepository(records=600, page_size=50, invalid_every=25, deleted_fraction=0.05, seed=41)
    with OaiSimulator(repo) as sim:
        sim.expire_tokens_after(3)  # 3 pages (with rejects and tombstones) staged, then a restart
        stats, result = harvest(build_adapter(oai_partner(), Endpoint(sim.base_url)), conn, "run-1")
    invalid = sorted(f"oai:sim.example:rec-{n:07d}" for n in range(25, 601, 25)
                     if f"oai:sim.example:rec-{n:07d}" in repo.live_identifiers())
    assert stats.restarts == 1 and stats.fetched == 600
    assert result.fetched == stats.fetched
    assert result.quarantined == stats.rejected == len(invalid)
    assert quarantined(conn, "run-1") == invalid  # each reject once
    assert_audit_adds_up(conn, "run-1")
    assert held(conn) == repo.live_identifiers() - set(invalid)


class _VanishAfterFirstPage:
    """Sweep sink wrapper: after the first page is staged, some records it listed vanish
    upstream (deletedRecord=no), as they may while a long sweep runs."""

    def __init__(self, sink: IdSink, repo: SimulatedRepository, count: int, keep: set[str]) -> None:
        self.sink, self.repo, self.count, self.keep = sink, repo, count, keep
        self.vanished: list[str] = []

    def reset(self) -> None:
        self.sink.reset()

    def write_page(self, rows: list[SweptId]) -> None:
        self.sink.write_page(rows)
        if not self.vanished:
            live = [identifier for identifier, _, deleted in rows if not deleted and identifier not in self.keep]
            self.vanished = self.repo.delete_ids(live[: self.count])


class _SweepWatcher(OaiAdapter):
    """The real adapter (its partner, its client), with the sweep's sink wrapped."""

    def __init__(self, adapter: OaiAdapter, repo: SimulatedRepository, count: int, keep: set[str]) -> None:
        super().__init__(adapter.partner, adapter.client)
        self._repo, self._count, self._keep = repo, count, keep
        self.sink: _VanishAfterFirstPage | None = None

    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        self.sink = _VanishAfterFirstPage(sink, self._repo, self._count, self._keep)
        super().sweep_ids(window, self.sink, stats)


def test_a_token_restart_in_the_reconcile_sweep_forgets_the_broken_attempt(conn: psycopg.Connection) -> None:
    """Records listed by the broken attempt but gone by the restart are purged; the
    reconcile's audit adds up and its rejects are quarantined once."""
    repo = SimulatedRepository(records=400, page_size=100, deleted_record="no", deleted_fraction=0.0,
                               invalid_every=0, seed=42)
    partner = oai_partner(max_purge_fraction=0.5)
    with OaiSimulator(repo) as sim:
        harvest(build_adapter(partner, Endpoint(sim.base_url)), conn, "full")
        lost = [f"oai:sim.example:rec-{n:07d}" for n in (6, 7, 14)]  # held locally no more:
        conn.execute("DELETE FROM records WHERE identifier = ANY(%s)", (lost,))  # fetched back
        conn.commit()
        repo.invalid_every = 7  # rec 7 and 14 now serve an invalid payload: two rejects
        sim.expire_tokens_after(2)
        adapter = _SweepWatcher(built(OaiAdapter, partner, Endpoint(sim.base_url)), repo, 5, set(lost))
        result = reconcile(adapter, conn, partner, "reconcile-1")
        starts = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "resumptionToken" not in r]
    assert len(starts) == 2  # the sweep restarted once, from its frozen bounds
    assert adapter.sink is not None
    vanished = set(adapter.sink.vanished)
    assert len(vanished) == 5
    assert result.plan.vanished == 5 and result.purged == 5
    assert not vanished & held(conn)
    assert result.plan.missing == 3 and result.fetched_missing == 3
    assert quarantined(conn, "reconcile-1") == lost[1:]  # each reject once
    assert held(conn) == repo.live_identifiers() - set(lost[1:])
    assert_audit_adds_up(conn, "reconcile-1")


# -- the mass-purge threshold is the configured fraction, inclusive (I11) -------------------


@pytest.mark.parametrize("records,fraction", [(1000, 0.1), (400, 0.25)])
@pytest.mark.parametrize("over", [False, True], ids=["at_the_limit", "one_more"])
def test_mass_purge_limit_is_exactly_the_configured_fraction(conn: psycopg.Connection, records: int, fraction: float, over: bool) -> None:
    limit = round(records * fraction)
    repo = SimulatedRepository(records=records, page_size=200, deleted_record="no", deleted_fraction=0.0, seed=43)
    partner = oai_partner(max_purge_fraction=fraction)
    with OaiSimulator(repo) as sim:
        harvest(build_adapter(partner, Endpoint(sim.base_url)), conn, "full")
        before = held(conn)
        gone = set(repo.delete(limit + 1 if over else limit))
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        if over:
            with pytest.raises(MassPurgeRefused, match=f"remove {limit + 1} of {records} records"):
                reconcile(adapter, conn, partner, "reconcile-1")
            conn.rollback()
            assert held(conn) == before
        else:
            result = reconcile(adapter, conn, partner, "reconcile-1")
            assert result.purged == limit
            assert held(conn) == before - gone


# -- memory is bounded by a page: each page is staged before the next is fetched (I5) -------


def test_each_page_is_staged_before_the_next_is_requested(conn: psycopg.Connection, db: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request finds all pages but the one just before it committed to staging:
    the pipelined chain fetches page N+1 while page N is staged, never page N+2, so at
    most two pages are held in memory."""
    repo = SimulatedRepository(records=500, page_size=100, deleted_fraction=0.0, seed=44)
    staged_at_request: list[int] = []
    with OaiSimulator(repo) as sim, psycopg.connect(db, autocommit=True) as observer:
        adapter = built(OaiAdapter, oai_partner(), Endpoint(sim.base_url))
        fetch = adapter.client.fetch

        def counting_fetch(params: dict[str, str]) -> bytes:
            if params.get("verb") == "ListRecords" or "resumptionToken" in params:
                staged_at_request.append(scalar(observer.execute("SELECT count(*) FROM staging")))
            return fetch(params)

        monkeypatch.setattr(adapter.client, "fetch", counting_fetch)
        window = pipeline.freeze_window(adapter, timedelta(minutes=10), None, pipeline.RunRequest("full"))
        stats = pipeline.harvest_window(adapter, conn, RunRef("museum", "run-1"), window)
    assert stats.pages == 5
    assert len(staged_at_request) == 5
    for n, staged in enumerate(staged_at_request):  # request n+1 (page n+1), counting from 0
        assert max(0, n - 1) * 100 <= staged <= n * 100, staged_at_request
