"""The mirror cannot silently diverge, through Airflow (dag.test).

A crash that empties UNLOGGED staging between harvest and apply, a reconcile that shares
the harvest's run id, an aggregation database restored from a backup behind the cursor,
and a partner clock that moves backwards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from include import embedded_pg
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.registry import get_partner
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from partner_harvest.store.db import one, scalar
from tests.support.dags import task_states
from tests.support.webhook import WebhookSink

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = pytest.mark.airflow
PID = "mirrormuseum"
CURSOR = f"harvest_cursor__{PID}"
LOGICAL = datetime(2026, 6, 1, tzinfo=timezone.utc)


@pytest.fixture
def repo() -> SimulatedRepository:
    return SimulatedRepository(records=300, page_size=100, seed=5)


@pytest.fixture
def env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, repo: SimulatedRepository,
        webhook: WebhookSink, airflow_db: None) -> Iterator[OaiSimulator]:
    registry(
        "partners:\n"
        f"  - {{id: {PID}, protocol: oai-pmh, conn_id: partner_{PID}, metadata_prefix: oai_dc, retries: 0,\n"
        "     lag: 5m, options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
    )
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    from airflow.models import Variable

    with OaiSimulator(repo) as sim:
        monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{PID.upper()}", json.dumps({"conn_type": "http", "host": sim.base_url}))
        Variable.delete(CURSOR)
        yield sim
        Variable.delete(CURSOR)


def harvest_dag() -> DAG:
    from partner_harvest.airflow.dag_factory import build_harvest_dag

    dag = build_harvest_dag(get_partner(PID))
    for task in dag.tasks:
        task.retries = 0
    return dag


def reconcile_dag() -> DAG:
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    dag = build_reconcile_dag(get_partner(PID))
    for task in dag.tasks:
        task.retries = 0
    return dag


states = task_states


def cursor() -> Any:  # the cursor Variable's JSON, or None
    from airflow.models import Variable

    return Variable.get(CURSOR, default_var=None, deserialize_json=True)


def crash_postgres(label: str, conninfo: str) -> None:
    """An immediate restart of the embedded server (crash recovery empties UNLOGGED
    staging), then wait until it answers again."""
    embedded_pg.restart_immediately(label, conninfo)


@pytest.mark.skipif(bool(os.environ.get(embedded_pg.DATABASE_URL_ENV)), reason="needs the embedded server to crash it")
def test_staging_lost_to_a_crash_between_harvest_and_apply_is_harvested_again(env: OaiSimulator, repo: SimulatedRepository, db: str,
                                                                              after_task: Callable[[str, Callable[[], object]], None],
                                                                              pg_label: str) -> None:
    after_task("harvest_changes", lambda: crash_postgres(pg_label, db))
    run = harvest_dag().test()
    assert set(states(run).values()) == {"success"}, states(run)
    with connect(db) as conn:
        ensure_schema(conn)
        assert live_identifiers(conn, PID) == repo.live_identifiers()
        row = one(conn.execute("SELECT status, fetched, upserted, unchanged, purged, quarantined, attempts"
                               " FROM harvest_runs WHERE partner_id = %s", (PID,)))
    status, fetched, upserted, unchanged, purged, quarantined, attempts = row
    assert status == "applied" and attempts == 2  # harvested, lost, harvested again
    assert upserted + unchanged + purged + quarantined == fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())
    assert cursor()["until"] == repo.clock.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_reconcile_sharing_the_harvest_run_id_neither_takes_its_lease_nor_its_staging(
        env: OaiSimulator, repo: SimulatedRepository, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both DAGs name a run after its time; keyed by run id alone they shared lease and staging."""
    import threading
    from datetime import timedelta

    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    from partner_harvest.store import leases

    monkeypatch.setattr(leases, "MIN_WAIT", timedelta(seconds=1))
    monkeypatch.setattr(leases, "RECHECK_AFTER", timedelta(seconds=1))

    def reschedules() -> int:
        with create_session() as session:
            return session.query(TaskReschedule).count()

    def end_the_harvest_lease_once_the_reconcile_waits(before: int, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            if reschedules() > before:
                with connect(db) as conn:
                    conn.execute("UPDATE partner_leases SET expires_at = now() - interval '1 second'")
                    conn.commit()
                return

    skip_apply = "apply_changes|advance_cursor|check_quality"  # the harvest waits for its apply
    harvested = harvest_dag().test(run_after=LOGICAL, logical_date=LOGICAL, mark_success_pattern=skip_apply)
    before, stop = reschedules(), threading.Event()
    watcher = threading.Thread(target=end_the_harvest_lease_once_the_reconcile_waits, args=(before, stop), daemon=True)
    watcher.start()
    try:
        waited = reconcile_dag().test(run_after=LOGICAL, logical_date=LOGICAL)
    finally:
        stop.set()
        watcher.join()
    assert harvested.run_id == waited.run_id  # the collision this guards against
    assert reschedules() > before  # the harvest held the partner: the reconcile waited (rescheduled) for it
    # then it ran once the harvest's lease ended
    assert states(waited) == {"reconcile": "success", "approval_gate": "success", "apply_reconcile": "skipped"}

    later = LOGICAL.replace(day=2)
    harvested = harvest_dag().test(run_after=later, logical_date=later, mark_success_pattern=skip_apply)
    with connect(db) as conn:  # the harvest's lease runs out (its task ended long ago)
        conn.execute("UPDATE partner_leases SET expires_at = now() - interval '1 second'")
        conn.commit()
    reconciled = reconcile_dag().test(run_after=later, logical_date=later)
    assert states(reconciled) == {"reconcile": "success", "approval_gate": "success", "apply_reconcile": "skipped"}
    with connect(db) as conn:
        ensure_schema(conn)
        rows: dict[str, str] = dict(conn.execute("SELECT run_id || ' ' || channel, status FROM harvest_runs WHERE partner_id = %s",
                                 (PID,)).fetchall())
        staged: dict[str, int] = dict(conn.execute("SELECT run_id, count(*) FROM staging WHERE partner_id = %s GROUP BY run_id",
                                   (PID,)).fetchall())
    key = f"harvest_{PID}/{harvested.run_id}"
    assert rows[f"{key} changes"] == "harvested"  # still waiting for its own apply
    assert rows[f"reconcile_{PID}/{reconciled.run_id} reconcile"] == "applied"
    assert staged[key] == len(repo.live_identifiers()) + len(repo.deleted_identifiers())


def test_a_restored_aggregation_database_is_harvested_from_its_last_applied_window(env: OaiSimulator, repo: SimulatedRepository, db: str,
                                                                                   caplog: pytest.LogCaptureFixture) -> None:
    dag = harvest_dag()
    assert set(states(dag.test()).values()) == {"success"}
    first_until = cursor()["until"]
    edited_early = repo.edit(5)
    repo.advance_clock(3600)
    assert set(states(dag.test()).values()) == {"success"}
    # Restore yesterday's backup: the second run's changes and audit vanish from the database.
    with connect(db) as conn:
        conn.execute("DELETE FROM harvest_runs WHERE partner_id = %s AND window_from IS NOT NULL", (PID,))
        conn.execute("DELETE FROM records WHERE partner_id = %s AND identifier = ANY(%s)", (PID, edited_early))
        conn.commit()
    repo.advance_clock(3600)
    third = dag.test()
    assert set(states(third).values()) == {"success"}
    with connect(db) as conn:
        window_from = scalar(conn.execute(
            "SELECT window_from FROM harvest_runs WHERE partner_id = %s AND run_id = %s",
            (PID, f"{third.dag_id}/{third.run_id}")))
        assert live_identifiers(conn, PID) == repo.live_identifiers()
    assert window_from.strftime("%Y-%m-%dT%H:%M:%SZ") < first_until  # from the earlier bound, minus the lag
    assert "covers the partner only up to" in caplog.text


def test_a_partner_clock_behind_the_cursor_alerts_and_skips_nothing(env: OaiSimulator, repo: SimulatedRepository, db: str,
                                                                    webhook: WebhookSink) -> None:
    dag = harvest_dag()
    assert set(states(dag.test()).values()) == {"success"}
    before = cursor()["until"]
    repo.rewind_clock(6 * 3600)  # more than the 5 minute lag
    run = dag.test()
    assert set(states(run).values()) == {"success"}
    assert cursor()["until"] == before  # never backwards
    alerts = [b["harvest"] for b in webhook.bodies if b["harvest"]["kind"] == "clock_behind"]
    assert len(alerts) == 1 and alerts[0]["partner"] == PID
    with connect(db) as conn:
        assert live_identifiers(conn, PID) == repo.live_identifiers()


def test_a_cleared_apply_of_an_older_run_never_resurrects_a_purged_record(env: OaiSimulator, repo: SimulatedRepository, db: str) -> None:
    """Item 3 through Airflow: run A's apply fails, run B purges X, the operator then reruns A's
    apply (``airflow tasks test``, as a clear from the UI would): X stays purged."""
    import subprocess
    import sys

    dag = harvest_dag()
    assert set(states(dag.test()).values()) == {"success"}
    (x,) = repo.edit(1)
    stale = dag.test(mark_success_pattern="apply_changes|advance_cursor|check_quality")  # A: staged, not applied
    repo.delete_ids([x])
    assert x in repo.deleted_identifiers()
    assert set(states(dag.test()).values()) == {"success"}  # B: purges x
    with connect(db) as conn:
        assert x not in live_identifiers(conn, PID)
    rerun = subprocess.run(
        [sys.executable, "-m", "airflow", "tasks", "test", stale.dag_id, "apply_changes", stale.run_id],
        capture_output=True, text=True, timeout=300,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    with connect(db) as conn:
        assert live_identifiers(conn, PID) == repo.live_identifiers()
        assert x not in live_identifiers(conn, PID)
