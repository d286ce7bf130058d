"""Partner health (store/health.py) and the records_held counter, on real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.reconcile import reconcile
from partner_harvest.records import Record, Rejected, Tombstone
from partner_harvest.registry import Partner
from partner_harvest.run import run_partner
from partner_harvest.store import RunRef, apply_run, begin_run, fail_run
from partner_harvest.store.admin import forget_partner
from partner_harvest.store.db import one, scalar
from partner_harvest.store.health import (
    BEHIND,
    FAILING,
    HEALTHY,
    NEW,
    WARNING,
    partner_health,
    quarantine_today,
    recent_runs,
)
from partner_harvest.window import Window, WindowFacts
from tests.support.checks import present
from tests.support.partners import oai_partner, partner_from_entry
from tests.support.records import seed_sliced_run
from tests.support.records import stage as support_stage


def counter_and_count(conn: psycopg.Connection, partner_id: str) -> tuple[int, int]:
    """(records_held, count(*) of records); also checks the quarantined_now counter."""
    row = one(conn.execute(
        "SELECT (SELECT records_held FROM partner_stats WHERE partner_id = %(p)s),"
        " (SELECT count(*) FROM records WHERE partner_id = %(p)s),"
        " (SELECT quarantined_now FROM partner_stats WHERE partner_id = %(p)s),"
        " (SELECT count(*) FROM quarantine_current WHERE partner_id = %(p)s)", {"p": partner_id}))
    conn.commit()
    assert row[2] == row[3], f"quarantined_now {row[2]} but quarantine_current holds {row[3]}"
    return row[:2]


def test_records_held_counter_equals_count_after_applies_purges_and_reconciles(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=600, page_size=100, deleted_fraction=0.05, seed=41, invalid_every=37)
    partner = oai_partner()
    with OaiSimulator(repo) as sim:
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        cursors: dict = {}
        for step in range(3):  # a full harvest, then incrementals with edits, purges and additions
            if step:
                repo.edit(25)
                repo.delete(30)
                repo.add(12)
                repo.advance_clock(timedelta(hours=1))
            run = run_partner(partner, adapter, conn, f"h{step}", cursors)
            result, cursors = run.applied, run.cursors
            assert step == 0 or result.purged > 0
            held, count = counter_and_count(conn, "museum")
            assert held == count == len(_held_ids(conn, "museum"))
        repo.delete(20)  # unseen by any incremental: the reconcile purges them
        repo.add(9)  # unseen too: the reconcile fetches them
        repo.advance_clock(timedelta(hours=1))
        outcome = reconcile(build_adapter(partner, Endpoint(sim.base_url)), conn, partner, "rc1")
        assert outcome.purged == 20 and outcome.upserted > 0
    held, count = counter_and_count(conn, "museum")
    assert scalar(conn.execute("SELECT quarantined_now FROM partner_stats")) > 0  # invalid_every
    conn.commit()
    # the run's audit notes what was held after it: the chart's "records held"
    assert conn.execute("SELECT DISTINCT records_held FROM harvest_runs WHERE run_id = 'rc1'").fetchall() == [(count,)]


def _held_ids(conn: psycopg.Connection, partner_id: str) -> set[str]:
    ids = {r[0] for r in conn.execute("SELECT identifier FROM records WHERE partner_id = %s", (partner_id,))}
    conn.commit()
    return ids


def test_forget_partner_drops_its_counter(conn: psycopg.Connection) -> None:
    stage(conn, "p", "harvest_p/r1", [rec("a"), rec("b")], until=now_of(conn))
    apply_run(conn, "p", "harvest_p/r1")
    forget_partner(conn, "p")
    stage(conn, "p", "harvest_p/r2", [rec("c")], until=now_of(conn))
    apply_run(conn, "p", "harvest_p/r2")
    assert counter_and_count(conn, "p") == (1, 1)


def test_migration_fills_the_counter_from_existing_records(conn: psycopg.Connection) -> None:
    stage(conn, "p", "harvest_p/r1", [rec("a"), rec("b"), rec("c")], until=now_of(conn))
    apply_run(conn, "p", "harvest_p/r1")
    conn.execute("DROP TABLE partner_stats")
    conn.execute("DELETE FROM schema_migrations WHERE name = '0006_partner_stats.sql'")
    conn.commit()
    from partner_harvest.store import ensure_schema

    assert ensure_schema(conn) == ["0006_partner_stats.sql"]
    assert counter_and_count(conn, "p") == (3, 3)


# ---------------------------------------------------------------------- health
def now_of(conn: psycopg.Connection) -> datetime:
    """The database's clock: started_at and quarantined_at come from it."""
    (now,) = one(conn.execute("SELECT now()"))
    conn.commit()
    return now


def rec(ident: str, at: datetime | None = None, title: str = "t") -> Record:
    at = at or datetime(2026, 3, 1).astimezone()
    return Record(ident, at, "oai_dc", f'<dc xmlns="urn:x"><title>{title}</title></dc>', ("s",), title)


def stage(conn: psycopg.Connection, partner: str, run_id: str, items: list, *, until: datetime,
          channel: str = "changes", mode: str = "incremental") -> None:
    window = Window(mode, None, until, "seconds", True, WindowFacts(metadata_prefix="oai_dc"))
    support_stage(conn, partner, run_id, items, channel, window)


def partners(*ids: str) -> list[Partner]:
    return [partner_from_entry({"id": i, "protocol": "oai-pmh", "conn_id": f"partner_{i}"}) for i in ids]


def test_health_tells_healthy_failing_behind_warning_and_new_partners_apart(conn: psycopg.Connection) -> None:
    now = now_of(conn)
    # healthy: a run an hour ago landed everything; a reconcile since found nothing to do
    stage(conn, "good", "harvest_good/scheduled__1", [rec(f"g{i}") for i in range(30)], until=now - timedelta(hours=1))
    apply_run(conn, "good", "harvest_good/scheduled__1")
    stage(conn, "good", "reconcile_good/scheduled__1", [], until=now, channel="reconcile", mode="reconcile")
    apply_run(conn, "good", "reconcile_good/scheduled__1")
    # failing: a run landed, then the next one failed
    stage(conn, "bad", "harvest_bad/scheduled__1", [rec("b1")], until=now - timedelta(hours=30))
    apply_run(conn, "bad", "harvest_bad/scheduled__1")
    begin_run(conn, RunRef("bad", "harvest_bad/manual__2"),
              Window("incremental", None, now, "seconds", True, WindowFacts()), "oai_dc")
    fail_run(conn, RunRef("bad", "harvest_bad/manual__2"), "connection refused by 127.0.0.1:9")
    # behind: its newest run succeeded, but its window stops five days ago
    stage(conn, "slow", "harvest_slow/scheduled__1", [rec("s1"), rec("s2")], until=now - timedelta(days=5))
    apply_run(conn, "slow", "harvest_slow/scheduled__1")
    # warning: a third of what came was quarantined (over the 5 % alert rate)
    items = [rec(f"w{i}") for i in range(20)] + [Rejected(f"x{i}", "no title", "<x/>") for i in range(10)]
    stage(conn, "leaky", "harvest_leaky/scheduled__1", items, until=now - timedelta(hours=1))
    apply_run(conn, "leaky", "harvest_leaky/scheduled__1")

    health = {h.partner_id: h for h in partner_health(conn, partners("good", "bad", "slow", "leaky", "fresh"), now)}

    good = health["good"]
    assert good.state == HEALTHY and good.alerts == ()
    assert good.records_held == 30 and good.quarantined_now == 0
    assert good.last_run == good.last_success and present(good.last_run).status == "applied"
    assert (present(good.last_run).dag_id, present(good.last_run).dag_run_id) == ("harvest_good", "scheduled__1")
    assert (present(good.last_success).upserted, present(good.last_success).purged, present(good.last_success).quarantined) == (30, 0, 0)
    assert good.cursor_lag == timedelta(hours=1)
    assert present(good.last_reconcile).run_id == "reconcile_good/scheduled__1" and present(good.last_reconcile).status == "applied"

    bad = health["bad"]
    assert bad.state == FAILING
    assert present(bad.last_run).status == "failed" and "connection refused" in (present(bad.last_run).error or "")
    assert present(bad.last_success).run_id == "harvest_bad/scheduled__1" and bad.records_held == 1

    slow = health["slow"]
    assert slow.state == BEHIND and slow.cursor_lag == timedelta(days=5) > slow.behind_after

    leaky = health["leaky"]
    assert leaky.state == WARNING and leaky.quarantined_now == 10 and leaky.records_held == 20
    assert any("quarantine rate" in a for a in leaky.alerts)

    fresh = health["fresh"]
    assert fresh.state == NEW and fresh.last_run is None and fresh.records_held == 0
    # worst first
    assert [h.state for h in partner_health(conn, partners("good", "bad", "slow", "leaky", "fresh"), now)] == [
        FAILING, BEHIND, WARNING, NEW, HEALTHY]


def stage_a_quarter_purged(conn: psycopg.Connection, now: datetime) -> None:
    """Partner p: 40 records applied, then a run staged (not applied) that purges 10 of them."""
    stage(conn, "p", "harvest_p/1", [rec(f"a{i}") for i in range(40)], until=now - timedelta(hours=2))
    apply_run(conn, "p", "harvest_p/1")
    stage(conn, "p", "harvest_p/2", [Tombstone(f"a{i}", datetime(2026, 4, 1).astimezone()) for i in range(10)],
          until=now - timedelta(hours=1))


def test_health_alerts_on_a_failed_completeness_check_and_a_purge_spike(conn: psycopg.Connection) -> None:
    now = now_of(conn)
    stage_a_quarter_purged(conn, now)
    conn.execute("UPDATE harvest_runs SET check_kind = 'list-size', check_expected = 50, check_found = 30,"
                 " check_ok = false WHERE run_id = 'harvest_p/2'")
    conn.commit()
    apply_run(conn, "p", "harvest_p/2")
    (health,) = partner_health(conn, partners("p"), now)
    assert health.state == WARNING and health.records_held == 30
    assert any(a.startswith("purge spike: 10 of 40") for a in health.alerts)
    assert any("completeness check failed: list-size on the changes channel: the witness says 50" in a
               for a in health.alerts)


def test_a_purge_a_person_approved_at_the_gate_raises_no_purge_spike(conn: psycopg.Connection) -> None:
    """After Approve, a "purge spike 25 %" data-quality warning fired about the purge just approved:
    in the run's own check (check_quality) and on the health page, from the index's facts too."""
    from partner_harvest import quality
    from partner_harvest.store.health import index_health
    from partner_harvest.store.quality import run_figures

    now = now_of(conn)
    stage_a_quarter_purged(conn, now)
    conn.execute("INSERT INTO approval_requests (partner_id, run_id, dag_id, kind, held, removals, limit_fraction,"
                 " state, decided_by) VALUES ('p', 'harvest_p/2', 'harvest_p', 'shrink', 40, 10, 0.1, 'approved', 'ada')")
    conn.commit()
    apply_run(conn, "p", "harvest_p/2")
    conn.execute("UPDATE approval_requests SET state = 'applied'")  # as the approved apply leaves it
    conn.commit()
    (partner,) = partners("p")
    assert quality.findings(partner, run_figures(conn, "p", "harvest_p/2"), now) == []
    (health,) = partner_health(conn, [partner], now)
    (fast,) = index_health(conn, [partner], now)
    assert (health.state, health.alerts, fast.state, fast.alerts) == (HEALTHY, (), HEALTHY, ())


def test_recent_runs_and_todays_quarantine_feed_the_partner_page(conn: psycopg.Connection) -> None:
    now = now_of(conn)
    for n in range(1, 4):
        items = [rec(f"r{i}", title=f"v{n}") for i in range(5 * n)] + [Rejected(f"q{n}", f"reason {n % 2}", "<x/>")]
        stage(conn, "p", f"harvest_p/{n}", items, until=now - timedelta(hours=4 - n))
        apply_run(conn, "p", f"harvest_p/{n}")
    runs = recent_runs(conn, "p", limit=2)
    assert [r.run_id for r in runs] == ["harvest_p/2", "harvest_p/3"]  # the newest two, oldest first
    assert [r.records_held for r in runs] == [10, 15]
    assert all(r.duration is not None and r.duration >= timedelta(0) for r in runs)
    reasons, entries = quarantine_today(conn, "p", now_of(conn))
    assert reasons == [("reason 1", 2), ("reason 0", 1)]
    assert [e.identifier for e in entries] == ["q3", "q2", "q1"]


def test_a_run_the_scheduler_saw_fail_before_any_audit_row_makes_the_partner_failing(conn: psycopg.Connection) -> None:
    from partner_harvest.store.health import SchedulerRun

    now = now_of(conn)
    stage(conn, "p", "harvest_p/scheduled__1", [rec("a")], until=now - timedelta(hours=30))
    apply_run(conn, "p", "harvest_p/scheduled__1")
    later = now_of(conn)
    down = SchedulerRun("harvest_p", "manual__2", "failed", later, later)
    (health,) = partner_health(conn, partners("p"), later, {"p": down})
    assert health.state == FAILING and present(health.last_run).run_id == "harvest_p/manual__2"
    assert present(health.last_success).run_id == "harvest_p/scheduled__1"
    older = SchedulerRun("harvest_p", "manual__0", "failed", now - timedelta(days=3), now - timedelta(days=3))
    (health,) = partner_health(conn, partners("p"), now, {"p": older})
    assert health.state == HEALTHY and present(health.last_run).run_id == "harvest_p/scheduled__1"


def test_the_health_pages_refuse_a_request_without_airflow_login() -> None:
    """The routes depend on Airflow's own auth check: no JWT (cookie or bearer), no page."""
    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health.app import create_app

    client = TestClient(create_app())
    for path in ("/", "/partner/museum"):
        response = client.get(path, headers={"Accept": "application/json"})
        assert response.status_code == 401, path


def test_the_partner_page_shows_a_running_run_slice_by_slice(conn: psycopg.Connection, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a run is going, the partner page lists its slices with records so far, rate and
    time left (store/progress.py, as `partner-harvest progress`); once applied, the section goes."""
    from pathlib import Path

    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.registry import Registry
    from partner_harvest.store import connect, ensure_schema

    ensure_schema(conn)
    registry = Registry(Path("partners.yaml"), partners("museum"), [])
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: {})
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login, tested above
    client = TestClient(health_app.create_app())
    seed_sliced_run(conn, "museum", "harvest_museum/manual__2026-12-01")

    page = client.get("/partner/museum").text
    assert "Running now" in page
    assert 'href="/dags/harvest_museum/runs/manual__2026-12-01"' in page
    assert "12,000 of 26,000 records, 21/s now, time left 11m 19s" in page
    table = page[page.index('<table id="progress">'):page.index("</table>", page.index('<table id="progress">'))]
    assert table.count("<tr class=") == 3  # the three slices, not the sliced run's parent row
    running = table[table.index("changes/002"):].split("</tr>")[0]
    assert "set dept:prints 2021-01-01T00:00:01Z..2026-01-01T00:00:00Z" in running
    assert ">2,000<" in running and ">10,000<" in running and ">20%<" in running and ">6m 28s<" in running

    conn.execute("UPDATE harvest_runs SET status = 'failed' WHERE channel = 'changes/002'")  # its try ended
    conn.execute("UPDATE harvest_runs SET status = 'harvested' WHERE channel = 'changes/003'")
    conn.commit()
    page = client.get("/partner/museum").text  # a failed slice waiting for its retry (or a dead run): still shown
    assert "Running now" not in page and "Newest run, not applied" in page and ">failed<" in page
    conn.execute("UPDATE harvest_runs SET status = 'applied' WHERE partner_id = 'museum'")
    conn.commit()
    page = client.get("/partner/museum").text
    assert 'id="progress' not in page
    assert 'id="warnings-none"' in page
    conn.execute("""UPDATE harvest_runs SET warnings = '{"marc.no_001": 7}', applied_at = now()
                    WHERE partner_id = 'museum' AND channel = 'changes/001'""")
    conn.commit()
    warned = client.get("/partner/museum").text  # today's warnings per check, beside today's quarantine
    table = warned[warned.index('<table id="warnings"'):]
    assert "<td>marc.no_001</td><td class=\"num\">7</td>" in table.split("</table>")[0]
