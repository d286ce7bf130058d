"""The partner-state table (partner_state.TABLE), case by case, on real PostgreSQL: the health
page's rows (store.health.partner_health) and `partner-harvest status` give every partner
the same state, with the same cause, for each row of the table; and the operator docs' list of
states is the table (generated from the code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from partner_harvest import partner_state
from partner_harvest.cli import main
from partner_harvest.registry import load_registry
from partner_harvest.store import events
from partner_harvest.store.health import SchedulerRun, partner_health

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 2, 8, 0, tzinfo=timezone.utc)  # the reference clock of every case
DEMO_CLOCK = datetime(2026, 1, 1, tzinfo=timezone.utc)  # the demo simulators' fixed clock


@dataclass
class Case:
    partner: str
    state: str
    cause: str | None = None  # a piece of the cause both must show


def run_row(conn: psycopg.Connection, partner: str, run: str, *, status: str, started: datetime,
            until: datetime | None = None, clock: datetime | None = None, fetched: int = 5, mode: str = "incremental",
            error: str | None = None) -> None:
    conn.execute(
        "INSERT INTO harvest_runs (partner_id, run_id, channel, mode, status, window_until, partner_clock, fetched,"
        " upserted, error, started_at, harvested_at, applied_at)"
        " VALUES (%s, %s, 'changes', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (partner, f"harvest_{partner}/{run}", mode, status, until or started, clock or until or started, fetched,
         fetched, error, started, started + timedelta(minutes=1) if status != "harvesting" else None,
         started + timedelta(minutes=2) if status == "applied" else None),
    )


def event(conn: psycopg.Connection, partner: str, run: str, kind: str, message: str, at: datetime) -> None:
    events.record(conn, partner, f"harvest_{partner}", f"harvest_{partner}/{run}", "freeze_window", 1, kind, message)
    conn.execute("UPDATE run_events SET at = %s WHERE run_id = %s AND kind = %s", (at, f"harvest_{partner}/{run}", kind))
    conn.commit()


REGISTRY = "partners:\n" + "".join(
    f"  - id: {pid}\n    protocol: oai-pmh\n    conn_id: partner_{pid}\n" + extra
    for pid, extra in [
        ("okay", ""), ("demo", ""), ("fresh", ""), ("skipped", ""), ("going", ""), ("between", ""),
        ("between_db", ""), ("down", ""), ("died", ""), ("slow", ""), ("silent", "    quiet_period: 2d\n"),
        ("backfilled", ""),
    ]
) + "  - id: broken_entry\n    protocol: oai-pmh\n    conn_id: partner_broken_entry\n    lag: soon\n"


def seed(conn: psycopg.Connection) -> tuple[list[Case], dict[str, SchedulerRun]]:
    """One partner per row of the table (some rows twice: with and without the scheduler)."""
    hour = timedelta(hours=1)
    with conn.transaction():
        run_row(conn, "okay", "n1", status="applied", started=NOW - 3 * hour, until=NOW - 3 * hour)
        # The demo: the partner's clock stands at 2026-01-01; the run an hour ago harvested up to it.
        run_row(conn, "demo", "n1", status="applied", started=NOW - hour, until=DEMO_CLOCK - timedelta(minutes=10),
                clock=DEMO_CLOCK)
        run_row(conn, "going", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
        run_row(conn, "going", "n2", status="harvesting", started=NOW - hour)
        run_row(conn, "between", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
        run_row(conn, "between", "n2", status="harvesting", started=NOW - hour)
        run_row(conn, "between_db", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
        run_row(conn, "between_db", "n2", status="harvesting", started=NOW - hour)
        run_row(conn, "down", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
        run_row(conn, "died", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
        run_row(conn, "died", "n2", status="harvesting", started=NOW - 2 * hour)
        run_row(conn, "slow", "n1", status="applied", started=NOW - 5 * 24 * hour, until=NOW - 5 * 24 * hour)
        run_row(conn, "silent", "n1", status="applied", started=NOW - 3 * 24 * hour, until=NOW - 3 * 24 * hour)
        run_row(conn, "silent", "n2", status="applied", started=NOW - 2 * hour, until=NOW - 2 * hour, fetched=0)
        run_row(conn, "backfilled", "n1", status="applied", started=NOW - 5 * hour, until=NOW - 5 * hour, fetched=27)
        run_row(conn, "backfilled", "b1", status="applied", started=NOW - 4 * hour, until=NOW - 4 * hour,
                fetched=0, mode="window")
    event(conn, "skipped", "scheduled__1", events.SKIPPED, "skipped: no cursor yet ... Trigger harvest_skipped once by hand",
          NOW - hour)
    event(conn, "between_db", "n2", events.RETRY, "harvest_changes: ConnectionError: Connection refused", NOW - 0.5 * hour)
    event(conn, "down", "n2", events.FAILED, "freeze_window: ConnectionError: HTTPConnectionPool(host='127.0.0.1', "
          "port=9): Connection refused", NOW - 0.5 * hour)
    event(conn, "died", "n2", events.FAILED, "harvest_changes: unusable response: not XML", NOW - hour)
    scheduled = {
        "going": SchedulerRun("harvest_going", "n2", "running", NOW - hour, None),
        "between": SchedulerRun("harvest_between", "n2", "running", NOW - hour, None, ("harvest_changes",)),
        "down": SchedulerRun("harvest_down", "n2", "failed", NOW - hour, NOW - 0.5 * hour),
    }
    cases = [
        Case("broken_entry", partner_state.INVALID, "lag"),
        Case("down", partner_state.FAILING, "freeze_window: ConnectionError"),
        Case("died", partner_state.FAILING, "unusable response: not XML"),
        Case("between", partner_state.RETRYING, "harvest_changes waiting for its next try"),
        Case("between_db", partner_state.RETRYING, "Connection refused"),
        Case("going", partner_state.RUNNING),
        Case("slow", partner_state.BEHIND),
        Case("silent", partner_state.QUIET),
        Case("fresh", partner_state.NEVER_RUN),
        Case("skipped", partner_state.NEVER_RUN, "no cursor yet"),
        Case("okay", partner_state.OK),
        Case("demo", partner_state.OK),
        Case("backfilled", partner_state.OK),
    ]
    return cases, scheduled


def test_the_health_page_and_status_agree_on_every_state(conn: psycopg.Connection, db: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    registry_path = tmp_path / "partners.yaml"
    registry_path.write_text(REGISTRY, encoding="utf-8")
    registry = load_registry(registry_path)
    cases, scheduled = seed(conn)
    # Every row of the table has its case (warning has its own tests in test_health.py).
    assert {c.state for c in cases} == set(partner_state.NAMES) - {partner_state.WARNING}

    page = {h.partner_id: h for h in partner_health(conn, registry.partners, NOW, scheduled, registry.errors)}
    assert {p: page[p].state for p in page} == {c.partner: c.state for c in cases}
    for case in cases:
        if case.cause:
            assert case.cause in (page[case.partner].cause or ""), (case, page[case.partner].cause)

    # The demo partner trails its own clock by the run's age, not by the 335 days to ours.
    demo = page["demo"]
    assert demo.cursor_lag < timedelta(hours=2) and demo.clock_offset > timedelta(days=330)
    # "Last night" is the real harvest, not the empty backfill that ran after it.
    assert page["backfilled"].last_harvest.upserted == 27 and page["backfilled"].last_success.upserted == 0

    # The command line: the same states, the same causes, from the same table.
    from partner_harvest.cli import status as status_module

    monkeypatch.setattr(status_module, "scheduler_runs", lambda partners: (scheduled, None))
    monkeypatch.setattr("partner_harvest.cli.datetime", _FixedNow)
    assert main(["status", "--registry", str(registry_path), "--database-url", db]) == 0
    out = capsys.readouterr().out.splitlines()
    table = out[2:2 + len(cases)]
    printed = {line.split()[0]: _state_of(line) for line in table}
    assert printed == {c.partner: c.state for c in cases}
    causes = {line.split()[0]: line for line in out[2 + len(cases):]}
    for case in cases:
        if case.cause:
            assert case.cause in causes[case.partner], (case, causes.get(case.partner))
            assert causes[case.partner].startswith(f"{case.partner} {case.state}: ")
    demo_line = next(line for line in table if line.startswith("demo "))
    assert "2026-01-01 00:00 (335d 7h behind)" in demo_line


class _FixedNow(datetime):
    @classmethod
    def now(cls, tz=None):  # noqa: ANN001
        return NOW


def _state_of(line: str) -> str:
    for name in sorted(partner_state.NAMES, key=len, reverse=True):
        if re.search(rf"\s{re.escape(name)}\s", line):
            return name
    return "?"


def test_a_run_that_failed_before_it_wrote_harvest_runs_is_failing_without_the_scheduler(
        conn: psycopg.Connection) -> None:
    """Issue 25: `status` printed `behind` for a partner whose endpoint was down (the failure was
    only in Airflow's DagRun table, which `status` never read); the task's event says it."""
    registry = load_registry_text(REGISTRY)
    cases, _ = seed(conn)
    (down,) = partner_health(conn, [p for p in registry.partners if p.id == "down"], NOW)
    assert down.state == partner_state.FAILING
    assert down.cause.startswith("freeze_window: ConnectionError")
    assert down.last_run.run_id == "harvest_down/n2" and down.last_run.status == "failed"


def load_registry_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "partners.yaml"
        path.write_text(text, encoding="utf-8")
        return load_registry(path)


def test_the_operator_docs_list_the_states_of_the_table() -> None:
    """docs/operator/health.md's table of states is generated: `python -m partner_harvest.partner_state`
    (or scripts/gen_docs.py)."""
    page = "docs/operator/health.md"
    readme = (ROOT / page).read_text(encoding="utf-8")
    block = re.search(r"<!-- partner-states:begin -->\n(.*?)\n<!-- partner-states:end -->", readme, re.S)
    assert block, f"{page} lacks the generated table of partner states (<!-- partner-states:begin -->)"
    assert block.group(1) == partner_state.markdown_table(), (
        f"{page}'s table of partner states is stale: run scripts/gen_docs.py")


def test_the_health_page_shows_a_partners_cause_once(conn: psycopg.Connection, db: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 (noticed defect): the index showed a failing partner's cause twice, in the State
    cell and again as the Last run cell's error; the partner page in its cause line and again in
    its Last run row. The cause stays beside the state (the browser test reads it there); the
    run cell keeps an error that is not the partner's cause."""
    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.store import connect

    registry = load_registry_text(REGISTRY)
    _, scheduled = seed(conn)
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: scheduled)
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login: test_health.py
    client = TestClient(health_app.create_app())

    index = client.get("/").text
    for partner, cause in (("down", "freeze_window: ConnectionError"), ("died", "unusable response: not XML"),
                           ("between_db", "Connection refused")):
        row = index[index.index(f'<tr data-partner="{partner}"'):].split("</tr>")[0]
        assert row.count(cause) == 1, (partner, row)
        state_cell = row[row.index('class="state-cell"'):row.index('class="last-run"')]
        assert '<div class="cause">' in state_cell and cause in state_cell
        page = client.get(f"/partner/{partner}").text
        assert page.count(cause) == 1, (partner, page[:3000])
        assert 'id="cause"' in page
