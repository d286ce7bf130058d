"""Politeness per endpoint host, shared through PostgreSQL, measured at the server."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.politeness import Pacer
from partner_harvest.store import ensure_schema
from partner_harvest.store.db import scalar
from partner_harvest.store.pacing import PgPacingStore, partner_rate
from tests.support.partners import fast_http, oai_partner
from tests.support.politeness import harvest_slice, most_in_any_second, run_in_processes, slices


@pytest.fixture
def pacing_db(conn: psycopg.Connection) -> psycopg.Connection:
    ensure_schema(conn)
    conn.commit()
    return conn


def _conninfo(conn: psycopg.Connection) -> str:
    return conn.info.dsn + (f" password={conn.info.password}" if conn.info.password else "")


def test_reservations_from_two_connections_keep_the_gap(pacing_db: psycopg.Connection) -> None:
    """Back to back, each reservation's slot starts one gap after the one before, whoever asks."""
    one, two = PgPacingStore(_conninfo(pacing_db)), PgPacingStore(_conninfo(pacing_db))
    try:
        slots = []
        for n in range(6):
            assert (one if n % 2 else two).reserve("repo.example.org", 200, 0, 0.1).wait <= 0.2 * n + 0.01
            # When this reservation's slot starts, as the server keeps it (no client-side jitter).
            row = pacing_db.execute("SELECT extract(epoch FROM next_slot) - last_gap_ms / 1000.0 FROM host_pacing"
                                    " WHERE host = 'repo.example.org'").fetchone()
            pacing_db.commit()
            assert row is not None
            slots.append(float(row[0]))
    finally:
        one.close()
        two.close()
    steps = [b - a for a, b in zip(slots, slots[1:])]
    assert steps == pytest.approx([0.2] * 5, abs=1e-3), steps
    other = PgPacingStore(_conninfo(pacing_db))
    try:
        assert other.reserve("other.example.org", 200, 0, 0.1).wait < 0.05  # another host: its own slots
    finally:
        other.close()


def test_strain_doubles_once_per_gap_and_healthy_responses_wear_it_off(pacing_db: psycopg.Connection) -> None:
    store = PgPacingStore(_conninfo(pacing_db))
    try:
        assert store.strain("h", 500, 30_000) == 500
        assert store.strain("h", 500, 30_000) == 500  # four slices strained at once: grown once
        pacing_db.execute("UPDATE host_pacing SET strained_at = now() - interval '1 s'")
        pacing_db.commit()
        assert store.strain("h", 500, 30_000) == 1000
        pacing_db.execute("UPDATE host_pacing SET strained_at = now() - interval '30 s', penalty_ms = 20000")
        pacing_db.commit()
        assert store.strain("h", 500, 30_000) == 30_000  # never above max_backoff

        def no_decay_by_time() -> None:  # the row "written" later than now: only the healthy responses wear it off
            pacing_db.execute("UPDATE host_pacing SET updated_at = now() + interval '1 hour'")
            pacing_db.commit()

        no_decay_by_time()
        slot = store.reserve("h", 0, 1, 0.1)
        assert slot.penalty_ms == pytest.approx(27_000, rel=1e-3) and slot.gap_ms == pytest.approx(27_000, rel=1e-3)
        no_decay_by_time()
        slot = store.reserve("h", 40_000, 3, 0.1)  # a partner's own longer delay wins over the back-off
        assert slot.penalty_ms == pytest.approx(27_000 * 0.9 ** 3, rel=1e-3) and slot.gap_ms == 40_000
    finally:
        store.close()


def test_the_back_off_halves_for_every_quiet_minute(pacing_db: psycopg.Connection) -> None:
    """An outage's back-off must not crawl the next night: it halves per minute since the
    host's row last changed, besides wearing off with healthy responses."""
    store = PgPacingStore(_conninfo(pacing_db))
    try:
        assert store.strain("quiet.example.org", 500, 30_000) == 500
        pacing_db.execute("UPDATE host_pacing SET penalty_ms = 20000, updated_at = now() - interval '2 minutes'"
                          " WHERE host = 'quiet.example.org'")
        pacing_db.commit()
        slot = store.reserve("quiet.example.org", 0, 0, 0.1)
        assert slot.penalty_ms == pytest.approx(5_000, rel=1e-2)  # two minutes: a quarter left
        pacing_db.execute("UPDATE host_pacing SET updated_at = now() - interval '1 hour'"
                          " WHERE host = 'quiet.example.org'")
        pacing_db.commit()
        assert store.reserve("quiet.example.org", 0, 0, 0.1).penalty_ms == 0  # gone by the next night
    finally:
        store.close()


class _NoDatabase:
    def __call__(self) -> PgPacingStore:
        raise AssertionError("a quiet partner without request_delay opened the pacing database")


def test_a_quiet_partner_without_a_delay_never_touches_the_database() -> None:
    """Healthy responses and no request_delay: no round trip at all (quiet nights stay cheap)."""
    with OaiSimulator(SimulatedRepository(records=30, page_size=10)) as sim:
        adapter = build_adapter(oai_partner(), Endpoint(sim.base_url), pacing=_NoDatabase())
        assert isinstance(adapter, OaiAdapter)
        pacer = getattr(adapter.client.session, "pacer", None)  # a paced session's
        assert isinstance(pacer, Pacer) and not pacer.engaged
        pages = list(adapter.client.list_pages("ListRecords", metadata_prefix="oai_dc", set_spec=None,
                                               from_=None, until=None))
        assert len(pages) == 3 and pacer.reservations == 0


def test_a_failed_response_engages_the_back_off_and_it_wears_off(pacing_db: psycopg.Connection) -> None:
    """A 503 (retried by the transport) strains the host: the retry and the pages after it wait
    for slots; healthy responses shrink the back-off until the session stops pacing."""
    options = {"politeness": {"backoff_step": 100, "recovery": 0.5}}
    with OaiSimulator(SimulatedRepository(records=100, page_size=10)) as sim:
        partner = oai_partner(options=options)
        adapter = build_adapter(partner, Endpoint(sim.base_url), pacing=lambda: PgPacingStore(_conninfo(pacing_db)))
        assert isinstance(adapter, OaiAdapter)
        pacer = getattr(adapter.client.session, "pacer", None)
        assert isinstance(pacer, Pacer)
        sim.fail_next(1, status=503)
        pages = list(adapter.client.list_pages("ListRecords", metadata_prefix="oai_dc", set_spec=None,
                                               from_=None, until=None))
        assert len(pages) == 10
        arrivals = sim.arrivals
    assert pacer.reservations >= 3  # engaged by the 503: the retry and later pages reserved slots
    assert arrivals[1] - arrivals[0] >= 0.095  # the retry waited for the back-off (100 ms)
    assert not pacer.engaged  # 100 ms halved per healthy response: worn off within the run
    rate = partner_rate(pacing_db, "museum")
    assert rate is not None and rate.host == "127.0.0.1" and rate.strains == 1


@pytest.mark.slow
def test_the_delay_holds_at_the_simulator_across_four_slices_and_two_partners_on_one_host(
        pacing_db: psycopg.Connection) -> None:
    """Two partners served from one host (127.0.0.1, two ports), each harvested as 4 slices in
    4 processes (a slice of each partner per process, side by side): the requests the host
    receives, counted at the servers, never come faster than request_delay allows."""
    delay_ms = 100  # 10 requests/s at most
    conninfo = _conninfo(pacing_db)
    with OaiSimulator(SimulatedRepository(records=200, page_size=10, seed=1)) as a, \
            OaiSimulator(SimulatedRepository(records=200, page_size=10, seed=2)) as b:
        entries = [{"id": pid, "protocol": "oai-pmh", "conn_id": "unused", "metadata_prefix": "oai_dc",
                    "request_delay": delay_ms, "options": {"http": fast_http()}} for pid in ("museum_a", "museum_b")]
        jobs_a = slices(entries[0], a.base_url, 4)
        jobs_b = slices(entries[1], b.base_url, 4)
        results = run_in_processes([[ja, jb] for ja, jb in zip(jobs_a, jobs_b)], conninfo)
        arrivals = sorted(a.arrivals + b.arrivals)
    assert sum(r["records"] for r in results) == 400 and len(results) == 8
    gaps = sorted(y - x for x, y in zip(arrivals, arrivals[1:]))
    span = arrivals[-1] - arrivals[0]
    # Slots start 100 ms apart at the database's clock. The server stamps a request when its
    # thread gets to it: on a loaded machine some ms late (never early), so one stamp may
    # slip next to the following one; the rate over the run cannot drift.
    assert (len(arrivals) - 1) / span <= 1000 / delay_ms * 1.02  # the mean: 10 a second
    assert most_in_any_second(arrivals) <= 1000 // delay_ms + 2  # 10, 11 touching both ends, 1 of jitter
    assert most_in_any_second([t / 3 for t in arrivals]) <= 3 * 1000 // delay_ms + 2  # any 3 s: 30
    assert gaps[len(gaps) // 2] >= 0.095, gaps[:5]  # unpaced, 8 chains send within ms of each other
    assert len(arrivals) >= 40
    rate = partner_rate(pacing_db, "museum_b")
    assert rate is not None and rate.limit_per_s == pytest.approx(10.0) and rate.recent_per_s is not None


@pytest.mark.slow
def test_a_slow_host_is_backed_off_and_recovered_slowly(pacing_db: psycopg.Connection) -> None:
    """4 slices against a host whose responses turn slow (300 ms against slow_response 0.2 s):
    the gap between requests grows to max_backoff; once the host is fast again each healthy
    response halves it (recovery 0.5), step by step, until pacing stops."""
    options = {"politeness": {"slow_response": 0.2, "backoff_step": 250, "max_backoff": 1000, "recovery": 0.5}}
    entry = {"id": "museum", "protocol": "oai-pmh", "conn_id": "unused", "metadata_prefix": "oai_dc",
             "options": {"http": fast_http(), **options}}
    slow_phase = 9
    with OaiSimulator(SimulatedRepository(records=320, page_size=10), response_delay_ms=300) as sim:
        jobs = slices(entry, sim.base_url, 4)
        conninfo = _conninfo(pacing_db)
        with ThreadPoolExecutor(4) as pool:
            running = [pool.submit(harvest_slice, job, conninfo) for job in jobs]
            assert sim.wait_arrivals(slow_phase)
            penalty_then = scalar(pacing_db.execute("SELECT penalty_ms FROM host_pacing"))
            pacing_db.commit()
            sim.set_response_delay(0)  # the host recovers
            results = [r.result() for r in running]
        arrivals = sorted(sim.arrivals)
    gaps = [y - x for x, y in zip(arrivals, arrivals[1:])]
    print(f"penalty at the switch {penalty_then} ms; gaps {[round(g, 3) for g in gaps]}")
    assert sum(r["records"] for r in results) == 320
    assert penalty_then >= 490  # doubled twice at least by then (less its decay with time), never past max_backoff
    assert max(gaps[:slow_phase]) >= 0.45  # the slow phase: requests spread out
    after = gaps[slow_phase - 1:]
    # Recovery is gradual: the first healthy gaps are still long, shrinking, before full speed.
    assert after[0] >= 0.2 and after[1] >= 0.1
    fast = next(i for i, gap in enumerate(after) if gap < 0.015)
    assert fast >= 3
    rate = partner_rate(pacing_db, "museum")
    assert rate is not None and rate.penalty_ms == 0 and rate.strains >= 3


def test_the_partner_page_shows_the_effective_rate(pacing_db: psycopg.Connection, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The health page's Request rate field: not paced, then the rate in force and the back-off."""
    from pathlib import Path

    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.registry import Registry
    from partner_harvest.store import connect

    registry = Registry(Path("partners.yaml"), [oai_partner("museum", request_delay=250)], [])
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: {})
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login: test_health.py
    client = TestClient(health_app.create_app())
    field = lambda page: page[page.index('id="request-rate"'):].split("</td>")[0]  # noqa: E731
    assert "not paced" in field(client.get("/partner/museum").text)

    store = PgPacingStore(_conninfo(pacing_db))
    try:
        store.register("museum", "repo.example.org", 250)
        for _ in range(3):
            store.reserve("repo.example.org", 250, 0, 0.1)
        assert field(client.get("/partner/museum").text).startswith(
            'id="request-rate">repo.example.org: at most 4 requests/s for the host (request_delay 250 ms, '
            'no back-off in force)')
        pacing_db.execute("UPDATE host_pacing SET strained_at = now() - interval '1 h'")
        pacing_db.commit()
        store.strain("repo.example.org", 500, 30_000)
        store.strain("repo.example.org", 500, 30_000)  # within the gap: still 500
    finally:
        store.close()
    shown = field(client.get("/partner/museum").text)
    # the back-off wears off by the second (halving each minute): 500 ms a moment ago
    assert re.search(r"at most 2 requests/s for the host \(request_delay 250 ms, back-off (49\d|500) ms in force", shown), shown
    assert "requests/s paced in the last minute" in shown and "last back-off" in shown


def test_a_back_off_is_shown_only_while_it_is_in_force_and_as_the_hosts(pacing_db: psycopg.Connection) -> None:
    """A host strained to the cap half an hour ago and not asked since: its back-off has worn off
    (it halves every minute), so the page shows the request_delay's rate, not the cap's
    (it said "at most 0.0333 requests/s (back-off 30000 ms)" long after the partner recovered);
    and the rate is the host's, shared by every partner on it, which the text says."""
    store = PgPacingStore(_conninfo(pacing_db))
    try:
        for partner in ("museum", "archive"):
            store.register(partner, "shared.example.org", 250)
        for _ in range(6):
            store.strain("shared.example.org", 30_000, 30_000)
        pacing_db.execute("UPDATE host_pacing SET updated_at = now() - interval '30 minutes'")
        pacing_db.commit()
        rate = partner_rate(pacing_db, "museum")
        assert rate is not None and rate.penalty_ms == 0 and rate.limit_per_s == 4
        assert rate.describe().startswith("shared.example.org: at most 4 requests/s for the host, shared by the 2 "
                                          "partners on it (request_delay 250 ms, no back-off in force)"), rate.describe()
        pacing_db.execute("UPDATE host_pacing SET updated_at = now()")  # strained just now: in force
        pacing_db.commit()
        strained = partner_rate(pacing_db, "archive")
        assert strained is not None and strained.penalty_ms > 29_000 and " ms in force" in strained.describe()
    finally:
        store.close()
