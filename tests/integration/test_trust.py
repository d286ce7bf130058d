"""Trust, verify, undo, end to end without Airflow: an OAI-PMH partner on the simulator, real
PostgreSQL, each run through partner_harvest.run as the DAG runs it.

- a bad run is undone: a full harvest A, nights B and C, then a rollback to before B gives
  back exactly what A left, one change-feed event per restored record, the cursor of A; the
  next run makes the records the partner's live set again;
- datestamps that lie: records edited without a new datestamp are found by the weekly
  reconcile's content check and brought in by the refresh it asks for;
- identifiers that move: a partner renaming every identifier, moved at a person's Move.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import gates, run
from partner_harvest.reconcile import reconcile
from partner_harvest.store import feed, history
from partner_harvest.store import gates as store_gates
from tests.support.harness import OaiHarness as Harness
from tests.support.partners import oai_partner


def live(repo: SimulatedRepository, identifier: str) -> Any:
    record = repo.get(identifier)
    assert record is not None, identifier
    return record


def contents(conn: psycopg.Connection, partner_id: str = "museum") -> dict[str, tuple]:
    """identifier -> (content hash, datestamp, first harvested) of every held record."""
    rows = conn.execute("SELECT identifier, content_hash, datestamp, first_harvested_at FROM records"
                        " WHERE partner_id = %s", (partner_id,)).fetchall()
    conn.commit()
    return {identifier: (digest, stamp, first) for identifier, digest, stamp, first in rows}


def feed_events(conn: psycopg.Connection, after: int, partner_id: str = "museum") -> list[dict]:
    until = feed.high_water(conn, partner_id)
    events = list(feed.changes(conn, partner_id, after, until))
    conn.commit()
    return events


@pytest.fixture
def repo() -> SimulatedRepository:
    return SimulatedRepository(records=300, page_size=100, deleted_fraction=0.0, deleted_record="persistent", seed=44)


@pytest.fixture
def sim(repo: SimulatedRepository) -> Iterator[OaiSimulator]:
    with OaiSimulator(repo) as server:
        yield server


@pytest.fixture
def harness(sim: OaiSimulator, conn: psycopg.Connection) -> Harness:
    return Harness(sim, conn, oai_partner(retries=1))


def test_rollback_to_before_b_gives_back_a_then_the_next_run_matches_the_partner(
        harness: Harness, repo: SimulatedRepository, conn: psycopg.Connection) -> None:
    harness.run()  # A: the first, full harvest
    after_a, cursor_a = contents(conn), harness.cursor
    repo.edit(12), repo.delete(6), repo.add(7)
    harness.run()  # B
    repo.edit(9), repo.delete(4), repo.add(5), repo.edit_silently(3)
    harness.run()  # C
    after_c = contents(conn)
    assert after_c != after_a and harness.cursor > cursor_a
    seen = feed.high_water(conn, "museum")

    (at_a,) = conn.execute("SELECT marked_at FROM feed_marks WHERE run_id = 'run-1'").fetchall()[0]
    as_of: dict[str, str] = dict(conn.execute("SELECT identifier, content_hash FROM records_as_of('museum', %s)",
                                              (at_a,)).fetchall())
    conn.commit()
    assert as_of == {i: v[0] for i, v in after_a.items()}  # the documented "as of" read
    plan = history.plan_rollback(conn, "museum", "run-2")
    assert plan.undone_runs == ["run-2", "run-3"]
    done = run.rollback(conn, "museum", "run-2", harness.cursors, requested_by="ada", via="test")

    assert contents(conn) == after_a  # identifier for identifier, content hash for content hash
    changed = {i for i in after_a.keys() | after_c.keys() if after_a.get(i) != after_c.get(i)}
    events = feed_events(conn, seen)
    assert sorted(e["identifier"] for e in events) == sorted(changed)  # one event per restored record
    assert {e["op"] for e in events if e["identifier"] not in after_a} == {"delete"}
    assert {e["reason"] for e in events if e["op"] == "delete"} == {"rollback"}
    assert done.plan.restore + done.plan.remove == len(changed)
    assert harness.cursor == cursor_a
    row = conn.execute("SELECT requested_by, via, undone_runs, restored, removed FROM rollbacks").fetchone()
    assert row == ("ada", "test", ["run-2", "run-3"], done.plan.restore, done.plan.remove)
    conn.commit()

    harness.run()  # resumed: from A's cursor, the partner's changes since come again
    assert harness.held() == repo.live_identifiers()
    held = contents(conn)
    assert all(held[i][1] == live(repo, i).datestamp for i in held)

    history.prune(conn, "museum", timedelta(0))  # past the retention: no way back to before B any more
    with pytest.raises(history.RollbackRefused, match="no longer kept|before the retained history"):
        history.plan_rollback(conn, "museum", "run-2")
    with pytest.raises(psycopg.errors.RaiseException, match="no state of partner museum is kept"):
        conn.execute("SELECT * FROM records_as_of('museum', %s)", (at_a,))
    conn.rollback()


def stale(conn: psycopg.Connection, repo: SimulatedRepository, partner_id: str = "museum") -> set[str]:
    """Held records whose content is not the partner's (the simulator's title names the version)."""
    rows = conn.execute("SELECT identifier, title FROM records WHERE partner_id = %s", (partner_id,)).fetchall()
    conn.commit()
    return {i for i, title in rows if f", version {live(repo, i).version}:" not in (title or "")}


def test_silent_edits_are_found_by_the_content_check_and_refreshed_within_two_weeks(conn: psycopg.Connection) -> None:
    """3,000 records, 2 % edited without a new datestamp, default settings: at most two weekly
    reconciles and the nights after them, then every held record's content is the partner's."""
    repo = SimulatedRepository(records=3000, page_size=200, deleted_fraction=0.0, seed=4402)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(retries=1))
        harness.run()
        silently = set(repo.edit_silently(60))
        harness.run()  # a night: the incremental cannot see them
        assert stale(conn, repo) == silently
        weeks = 0
        while stale(conn, repo) and weeks < 2:
            weeks += 1
            found = reconcile(harness.adapter(), conn, harness.partner, f"reconcile-{weeks}").content
            print(f"week {weeks}: content check sampled {found['sampled']}, {found['silent']} silent, "
                  f"{found['requests']} requests; examples {[e['identifier'] for e in found['examples']]}")
            night = harness.run_through()
            print(f"week {weeks}: night {night.window.describe()}: {night.applied.as_dict()}")
        assert stale(conn, repo) == set(), f"still stale after {weeks} weeks"
        assert harness.held() == repo.live_identifiers()
        figures = conn.execute(
            "SELECT run_id, content_sampled, content_silent, content_requests FROM harvest_runs"
            " WHERE channel = 'reconcile' ORDER BY run_id").fetchall()
        refreshes = conn.execute("SELECT run_id, refresh FROM harvest_runs WHERE refresh IS NOT NULL").fetchall()
        state = conn.execute("SELECT unreliable_since IS NOT NULL, refresh_due, last_refresh_run FROM partner_content"
                             ).fetchone()
        conn.commit()
        print(f"checks {figures}; refreshes {refreshes}")
        assert figures[0][1] == 200 and figures[0][2] >= 1 and figures[0][3] == 200  # one GetRecord each
        assert len(refreshes) == 1 and refreshes[0][1].startswith("content check of reconcile-")
        assert state == (True, None, refreshes[0][0])


def test_a_partner_renaming_every_identifier_is_offered_move_and_moved(
        harness: Harness, repo: SimulatedRepository, conn: psycopg.Connection) -> None:
    harness.run()
    before = contents(conn)
    seen = feed.high_water(conn, "museum")
    pairs = dict(repo.rename("oai:new.example:object-"))
    partner = harness.partner
    window = harness.freeze()
    _, staged = run.stage(partner, harness.adapter(), conn, "run-2", window)
    shrink = gates.harvest_shrink(conn, partner, "run-2", window, staged["changes"].tombstones)
    assert shrink is not None and (shrink.removals, shrink.movable) == (300, 300)  # the gate offers Move
    request = store_gates.open_request(conn, "museum", "run-2", partner.dag_id, gates.SHRINK, shrink,
                                       partner.max_shrink_fraction, None)
    assert gates.options(request) == ["Approve", "Reject", "Move"] and "300 reappear" in gates.subject(request)
    store_gates.decide(conn, "museum", "run-2", store_gates.APPROVED, "ada", move=True)  # the person's Move
    applied = run.apply(conn, "museum", "run-2", window, run.Kept(), None)

    after = contents(conn)
    assert set(after) == set(pairs.values()) == repo.live_identifiers()
    assert all(after[new][2] == before[old][2] for old, new in pairs.items())  # first harvested: unchanged
    assert all(after[new][0] == before[old][0] for old, new in pairs.items())
    events = feed_events(conn, seen)
    assert [e["op"] for e in events] == ["moved"] * 300
    assert {e["moved_from"]: e["identifier"] for e in events} == pairs
    assert applied.purged == 0 and applied.upserted == 300
    moved = conn.execute("SELECT sum(moved) FROM harvest_runs WHERE run_id = 'run-2'").fetchone()
    kept = conn.execute("SELECT count(*) FROM record_history WHERE ended_by = 'moved'").fetchone()
    conn.commit()
    assert moved == (300,) and kept == (300,)


def test_a_partial_match_moves_the_matched_and_purges_and_adds_the_rest(
        harness: Harness, repo: SimulatedRepository, conn: psycopg.Connection) -> None:
    harness.run()
    renamed = dict(repo.rename("oai:new.example:object-"))
    edited = repo.edit(40)  # renamed AND edited: no longer the same content
    window = harness.freeze()
    _, staged = run.stage(harness.partner, harness.adapter(), conn, "run-2", window)
    shrink = gates.harvest_shrink(conn, harness.partner, "run-2", window, staged["changes"].tombstones)
    assert shrink is not None and shrink.movable == 260
    store_gates.open_request(conn, "museum", "run-2", harness.partner.dag_id, gates.SHRINK, shrink, 0.25, None)
    store_gates.decide(conn, "museum", "run-2", store_gates.APPROVED, "ada", move=True)
    applied = run.apply(conn, "museum", "run-2", window, run.Kept(), None)
    assert harness.held() == repo.live_identifiers() == set(renamed.values())
    assert (applied.purged, applied.upserted) == (40, 300)
    moves = conn.execute("SELECT count(*) FROM moves").fetchone()
    conn.commit()
    assert moves == (260,) and set(edited) <= set(renamed.values())


class FakeAirflow:
    """The Airflow side of a rollback (rollback.AirflowSide) kept in dicts: Variables and paused DAGs."""

    def __init__(self, variables: dict[str, Any]) -> None:
        self.variables = variables
        self.paused: list[str] = []

    def read_variable(self, key: str) -> Any | None:
        return self.variables.get(key)

    def write_variable(self, key: str, value: dict[str, Any], description: str) -> None:
        self.variables[key] = value

    def delete_variable(self, key: str) -> bool:
        return self.variables.pop(key, None) is not None

    def pause_dags(self, dag_ids: list[str]) -> list[str]:
        self.paused += dag_ids
        return dag_ids


def test_the_rollback_command_asks_pauses_sets_the_cursor_back_and_is_recorded(
        harness: Harness, repo: SimulatedRepository, conn: psycopg.Connection, db: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from partner_harvest import cli
    from partner_harvest.registry import cursor_value

    (tmp_path / "partners.yaml").write_text(
        "partners:\n  - {id: museum, protocol: oai-pmh, conn_id: partner_museum}\n", encoding="utf-8")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(tmp_path / "partners.yaml"))
    harness.run()
    after_a, cursor_a = contents(conn), harness.cursor
    repo.edit(10)
    harness.run_through()
    airflow = FakeAirflow({"harvest_cursor__museum": cursor_value(harness.cursor, "seconds", "run-2")})
    monkeypatch.setattr(cli, "_airflow", lambda purpose: airflow)

    monkeypatch.setattr("sys.stdin", io.StringIO("no\n"))
    status = cli.main(["rollback", "museum", "--to-before", "run-2", "--database-url", db])
    out = capsys.readouterr().out
    assert status == 1 and "records restored (older version or purged record back): 10" in out
    assert "nothing changed" in out and airflow.paused == [] and contents(conn) != after_a

    status = cli.main(["rollback", "museum", "--to-before", "run-2", "--yes", "--database-url", db])
    out = capsys.readouterr().out
    assert status == 0, out
    assert contents(conn) == after_a
    assert airflow.paused == ["harvest_museum", "reconcile_museum"]
    assert airflow.variables["harvest_cursor__museum"]["until"] == cursor_a.strftime("%Y-%m-%dT%H:%M:%SZ")
    row = conn.execute("SELECT via, cursors FROM rollbacks").fetchone()
    assert row is not None
    epoch = conn.execute("SELECT epoch_command FROM partner_fences WHERE partner_id = 'museum'").fetchone()
    conn.commit()
    assert row[0] == "cli" and row[1]["harvest_cursor__museum"]["to"] == cursor_a.isoformat()
    assert epoch == ("rollback",)  # a run planned before fails at its next write (store/fences.py)

    status = cli.main(["rollback", "museum", "--to-before", "run-9", "--yes", "--database-url", db])
    assert status == 1 and "no such run" in capsys.readouterr().err


def test_the_health_page_rolls_back_after_a_persons_confirmation(
        harness: Harness, repo: SimulatedRepository, conn: psycopg.Connection, db: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The partner page lists the runs to roll back to before; the rollback page shows the plan
    and acts only on the partner id typed back, from the page's own origin, for a user who may
    change the partner's DAG; it is recorded with that user's name."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.registry import Registry
    from partner_harvest.store import connect

    harness.run()
    after_a = contents(conn)
    repo.edit(5), repo.delete(2)
    harness.run()
    airflow = FakeAirflow({})
    registry = Registry(Path("partners.yaml"), [harness.partner], [])
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: {})
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(source, "ServerSide", lambda: airflow)
    allowed = {"grace"}
    monkeypatch.setattr(source, "may_edit_dag", lambda user, dag_id: user.get_name() in allowed)
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login: test_health.py
    app = health_app.create_app()
    who = {"name": "grace"}
    app.dependency_overrides[get_user] = lambda: type("User", (), {"get_name": lambda self: who["name"]})()
    client = TestClient(app)

    page = client.get("/partner/museum").text
    assert "rollback?to_before=run-2" in page and "roll back to before it" in page
    plan = client.get("/partner/museum/rollback", params={"to_before": "run-2"}).text
    assert "records restored (older version or purged record back): 7" in plan and 'id="rollback-form"' in plan
    form = {"to_before": "run-2", "undone": "run-2", "confirm": "museu"}
    assert "type the partner id to confirm" in client.post("/partner/museum/rollback", data=form).text
    assert client.post("/partner/museum/rollback", data={**form, "confirm": "museum"},
                       headers={"Origin": "https://elsewhere.example"}).status_code == 403
    who["name"] = "mallory"
    assert client.post("/partner/museum/rollback", data={**form, "confirm": "museum"}).status_code == 403
    assert contents(conn) != after_a and airflow.paused == []

    who["name"] = "grace"
    done = client.post("/partner/museum/rollback", data={**form, "confirm": "museum"}).text
    assert 'id="rollback-done"' in done and "7 records restored" in done
    assert contents(conn) == after_a and airflow.paused == ["harvest_museum", "reconcile_museum"]
    row = conn.execute("SELECT requested_by, via FROM rollbacks").fetchone()
    conn.commit()
    assert row == ("grace", "health page")
    assert "<td>grace</td><td>health page</td>" in client.get("/partner/museum").text
