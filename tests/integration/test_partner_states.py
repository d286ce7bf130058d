"""The partner-state table (partner_state.TABLE), case by case, on real PostgreSQL: the health
page's rows (store.health.partner_health) and `partner-harvest status` give every partner
the same state, with the same cause, for each row of the table; and the operator docs' list of
states is the table (generated from the code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import psycopg
import pytest

from partner_harvest import partner_state
from partner_harvest.cli import main
from partner_harvest.registry import Registry, load_registry
from partner_harvest.store import events
from partner_harvest.store.health import PartnerHealth, SchedulerRun, partner_health

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
        ("backfilled", ""), ("asking", ""), ("again", ""),
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
        # A shrinking harvest stopped at its approval gate: staged, its request pending.
        run_row(conn, "asking", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
        run_row(conn, "asking", "n2", status="harvested", started=NOW - hour)
        conn.execute("INSERT INTO approval_requests (partner_id, run_id, dag_id, kind, held, removals, limit_fraction,"
                     " requested_at) VALUES ('asking', 'harvest_asking/n2', 'harvest_asking', 'shrink', 200, 40, 0.1,"
                     " %s)", (NOW - 0.5 * hour,))
        run_row(conn, "again", "n1", status="applied", started=NOW - 30 * hour, until=NOW - 30 * hour)
    event(conn, "skipped", "scheduled__1", events.SKIPPED, "skipped: no cursor yet ... Trigger harvest_skipped once by hand",
          NOW - hour)
    event(conn, "between_db", "n2", events.RETRY, "harvest_changes: ConnectionError: Connection refused", NOW - 0.5 * hour)
    event(conn, "down", "n2", events.FAILED, "freeze_window: ConnectionError: HTTPConnectionPool(host='127.0.0.1', "
          "port=9): Connection refused", NOW - 0.5 * hour)
    event(conn, "died", "n2", events.FAILED, "harvest_changes: unusable response: not XML", NOW - hour)
    event(conn, "again", "n2", events.RETRY, "connection refused at 127.0.0.1:9 (freeze_window, attempt 1 of 4 "
          "failed; next try in 2m–3m 59s (by 07:33Z))\nthe full text", NOW - 0.5 * hour)
    scheduled = {
        "going": SchedulerRun("harvest_going", "n2", "running", NOW - hour, None),
        "between": SchedulerRun("harvest_between", "n2", "running", NOW - hour, None, ("harvest_changes",)),
        "down": SchedulerRun("harvest_down", "n2", "failed", NOW - hour, NOW - 0.5 * hour),
        # Its gate parked in awaiting_input: running, no task between tries.
        "asking": SchedulerRun("harvest_asking", "n2", "running", NOW - hour, None),
        # The next try of the task whose first try failed is running: still retrying, with its cause.
        "again": SchedulerRun("harvest_again", "n2", "running", NOW - hour, None, (), ("freeze_window",)),
    }
    cases = [
        Case("broken_entry", partner_state.INVALID, "lag"),
        Case("down", partner_state.FAILING, "freeze_window: ConnectionError"),
        Case("died", partner_state.FAILING, "unusable response: not XML"),
        Case("between", partner_state.RETRYING, "harvest_changes waiting for its next try"),
        Case("between_db", partner_state.RETRYING, "Connection refused"),
        Case("again", partner_state.RETRYING, "connection refused at 127.0.0.1:9 (freeze_window, attempt 1 of 4"),
        Case("asking", partner_state.AWAITING_APPROVAL, "asking: approve a shrinking harvest? 40 of 200 records"),
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
                                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
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
    assert page["asking"].approval_path == "/dags/harvest_asking/runs/n2/tasks/approval_gate/required_actions"
    assert (page["again"].short_cause or "").endswith("(by 07:33Z))")  # the first line; the full text follows

    # The demo partner trails its own clock by the run's age, not by the 335 days to ours.
    demo = page["demo"]
    assert demo.cursor_lag is not None and demo.cursor_lag < timedelta(hours=2)
    assert demo.clock_offset is not None and demo.clock_offset > timedelta(days=330)
    # "Last night" is the real harvest, not the empty backfill that ran after it.
    backfilled = page["backfilled"]
    assert backfilled.last_harvest is not None and backfilled.last_harvest.upserted == 27
    assert backfilled.last_success is not None and backfilled.last_success.upserted == 0

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
    assert causes["asking"].endswith("(answer: /dags/harvest_asking/runs/n2/tasks/approval_gate/required_actions)")
    assert "the full text" not in causes["again"]  # the short cause only
    demo_line = next(line for line in table if line.startswith("demo "))
    assert "2026-01-01 00:00 (335d 7h behind)" in demo_line


class _FixedNow(datetime):
    @classmethod
    def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]  # datetime.now's own signature, narrowed to what it returns here
        return NOW


def _state_of(line: str) -> str:
    for name in sorted(partner_state.NAMES, key=len, reverse=True):
        if re.search(rf"\s{re.escape(name)}\s", line):
            return name
    return "?"


def test_a_run_that_failed_before_it_wrote_harvest_runs_is_failing_without_the_scheduler(
        conn: psycopg.Connection) -> None:
    """Regression: `status` printed `behind` for a partner whose endpoint was down (the failure was
    only in Airflow's DagRun table, which `status` never read); the task's event says it."""
    registry = load_registry_text(REGISTRY)
    cases, _ = seed(conn)
    (down,) = partner_health(conn, [p for p in registry.partners if p.id == "down"], NOW)
    assert down.state == partner_state.FAILING
    assert (down.cause or "").startswith("freeze_window: ConnectionError")
    assert down.last_run is not None and (down.last_run.run_id, down.last_run.status) == ("harvest_down/n2", "failed")


def load_registry_text(text: str) -> Registry:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "partners.yaml"
        path.write_text(text, encoding="utf-8")
        return load_registry(path)


def test_the_operator_docs_list_the_states_of_the_table() -> None:
    """docs/operator/health.md's table of states is generated by scripts/gen_docs.py."""
    page = "docs/operator/health.md"
    readme = (ROOT / page).read_text(encoding="utf-8")
    block = re.search(r"<!-- partner-states:begin -->\n(.*?)\n<!-- partner-states:end -->", readme, re.S)
    assert block, f"{page} lacks the generated table of partner states (<!-- partner-states:begin -->)"
    assert block.group(1) == partner_state.markdown_table(), (
        f"{page}'s table of partner states is stale: run scripts/gen_docs.py")


def test_the_health_page_shows_a_partners_cause_once(conn: psycopg.Connection, db: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The index showed a failing partner's cause twice, in the State
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
        assert '<div class="cause"' in state_cell and cause in state_cell
        page = client.get(f"/partner/{partner}").text
        assert page.count(cause) == 1, (partner, page[:3000])
        assert 'id="cause"' in page


# The index's own cases beside the table's: a warning, a run stopped at its approval gate, a run
# the partner told to come back later, a gate's rejection, a sliced run with a failed slice, a
# partner with reconciles only, two runs started in the same microsecond.
MORE = "".join(f"  - id: {pid}\n    protocol: oai-pmh\n    conn_id: partner_{pid}\n"
               for pid in ("spiked", "checked", "gated", "later", "rejected", "sliced", "swept", "twins"))


def seed_more(conn: psycopg.Connection) -> dict[str, str]:
    hour = timedelta(hours=1)
    with conn.transaction():
        for pid in ("spiked", "checked", "gated", "later", "rejected", "sliced", "twins"):
            run_row(conn, pid, "n1", status="applied", started=NOW - 26 * hour, until=NOW - 26 * hour, fetched=40)
        conn.execute("UPDATE harvest_runs SET purged = 30 WHERE partner_id = 'spiked'")
        conn.execute("UPDATE harvest_runs SET check_kind = 'list_size', check_expected = 40, check_found = 39,"
                     " check_ok = false WHERE partner_id = 'checked'")
        run_row(conn, "gated", "n2", status="harvested", started=NOW - hour)
        run_row(conn, "later", "n2", status="waiting", started=NOW - hour, error="429: come back at 09:00")
        run_row(conn, "rejected", "n2", status="abandoned", started=NOW - hour, error="rejected at the gate")
        run_row(conn, "sliced", "n2", status="applied", started=NOW - hour, until=NOW - hour)
        conn.execute(
            "INSERT INTO harvest_runs (partner_id, run_id, channel, mode, status, error, started_at)"
            " VALUES ('sliced', 'harvest_sliced/n2', 'changes/002', 'incremental', 'failed', 'slice 2: timeout', %s)",
            (NOW - hour,))
        conn.execute(
            "INSERT INTO harvest_runs (partner_id, run_id, channel, mode, status, fetched, started_at, applied_at)"
            " VALUES ('swept', 'reconcile_swept/w1', 'reconcile', 'reconcile', 'applied', 3, %s, %s)",
            (NOW - 2 * hour, NOW - hour))
        run_row(conn, "twins", "a2", status="failed", started=NOW - hour, error="twin a failed")
        run_row(conn, "twins", "b2", status="applied", started=NOW - hour, until=NOW - hour)
    return {"spiked": partner_state.WARNING, "checked": partner_state.WARNING, "gated": partner_state.RUNNING,
            "later": partner_state.RETRYING, "rejected": partner_state.FAILING, "sliced": partner_state.FAILING,
            "swept": partner_state.NEVER_RUN, "twins": partner_state.OK}


def _view(h: PartnerHealth) -> tuple[Any, ...]:
    """What the index filters and sorts a row by."""
    last = h.last_run
    return (h.state, h.cause, h.note, h.cursor, h.cursor_lag, h.records_held, h.quarantined_now, h.alerts,
            None if last is None else (last.run_id, last.started_at))


def _assert_index_agrees(conn: psycopg.Connection, registry: Registry,
                         scheduled: dict[str, SchedulerRun]) -> dict[str, str]:
    from partner_harvest.health_index import SORTS, IndexQuery, select_page
    from partner_harvest.store.health import index_health

    fast = index_health(conn, registry.partners, NOW, scheduled, registry.errors)
    each = [one for entry in registry.partners for one in partner_health(conn, [entry], NOW, scheduled)]
    each += partner_health(conn, [], NOW, scheduled, registry.errors)
    assert {h.partner_id: _view(h) for h in fast} == {h.partner_id: _view(h) for h in each}
    for sort in SORTS:  # every sort, both ways, and the state filter: the same partners in the same order
        for order in ("asc", "desc"):
            for state in (None, partner_state.FAILING, partner_state.BEHIND):
                query = IndexQuery(sort=sort, order=order, state=state, per_page=500)
                page, reference = select_page(fast, query), select_page(each, query)
                assert [h.partner_id for h in page.rows] == [h.partner_id for h in reference.rows], (sort, order)
                assert page.counts == reference.counts
    return {h.partner_id: h.state for h in fast}


def test_the_index_decides_every_state_as_the_partner_page_does_and_keeps_up_with_every_write(
        conn: psycopg.Connection, db: str) -> None:
    """The index reads one row per partner (partner_health_facts, kept by a trigger on
    harvest_runs) instead of the audit: every partner's state, cause, lag and sort keys are the
    ones the partner's own page computes from harvest_runs, for every state of the table, and
    stay so after inserts, updates, deletes, a rolled-back write, a writer committing under
    another's open transaction, and forget."""
    from partner_harvest.store import connect
    from partner_harvest.store.admin import forget_partner

    registry = load_registry_text(REGISTRY + MORE)
    cases, scheduled = seed(conn)
    more = seed_more(conn)
    states = _assert_index_agrees(conn, registry, scheduled)
    assert states == {**{c.partner: c.state for c in cases}, **more}
    assert set(states.values()) == set(partner_state.NAMES)

    hour = timedelta(hours=1)
    with conn.transaction():  # the gate approved and applied; the waiting run failed its last try
        conn.execute("UPDATE harvest_runs SET status = 'applied', applied_at = %s, window_until = %s"
                     " WHERE run_id = 'harvest_gated/n2'", (NOW - 0.5 * hour, NOW - hour))
        conn.execute("UPDATE harvest_runs SET status = 'failed' WHERE run_id = 'harvest_later/n2'")
    conn.execute("DELETE FROM harvest_runs WHERE run_id = 'harvest_slow/n1'")  # autocommit-like: its own commit
    conn.commit()
    with pytest.raises(RuntimeError), conn.transaction():  # a write that fails (a fence) leaves nothing
        conn.execute("UPDATE harvest_runs SET status = 'failed' WHERE partner_id = 'okay'")
        raise RuntimeError("fenced")
    other = connect(db)
    try:  # two writers of one partner: the later commit sees the earlier's rows
        other.execute("UPDATE harvest_runs SET purged = 35 WHERE run_id = 'harvest_spiked/n1'")
        run_row(conn, "spiked", "n2", status="applied", started=NOW - hour, until=NOW - hour, fetched=40)
        conn.commit()
        other.commit()
    finally:
        other.close()
    forget_partner(conn, "silent")
    conn.commit()
    states = _assert_index_agrees(conn, registry, scheduled)
    assert (states["gated"], states["later"], states["slow"], states["okay"], states["silent"]) == (
        partner_state.OK, partner_state.FAILING, partner_state.NEVER_RUN, partner_state.OK, partner_state.NEVER_RUN)
