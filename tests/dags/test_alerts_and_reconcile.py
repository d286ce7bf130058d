"""Alerts and the reconcile DAG through Airflow (dag.test), with a webhook sink on loopback."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.registry import get_partner
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from tests.support.dags import task_states
from tests.support.webhook import WebhookSink

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = pytest.mark.airflow


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, webhook: WebhookSink,
        airflow_db: None) -> Iterator[pytest.MonkeyPatch]:
    registry(
        "partners:\n"
        "  - {id: alertmuseum, protocol: oai-pmh, conn_id: partner_alertmuseum, metadata_prefix: oai_dc,\n"
        "     retries: 0, options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
        "  - {id: deadmuseum, protocol: oai-pmh, conn_id: partner_deadmuseum, retries: 0,\n"
        "     options: {http: {retries: 0, connect_timeout: 2}}}\n"
    )
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    monkeypatch.setenv("AIRFLOW_CONN_PARTNER_DEADMUSEUM", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{closed_port()}/oai"}))
    from airflow.models import Variable

    Variable.delete("harvest_cursor__alertmuseum")
    yield monkeypatch
    Variable.delete("harvest_cursor__alertmuseum")


def dag_for(kind: str, partner_id: str) -> DAG:
    from partner_harvest.airflow.dag_factory import build_harvest_dag, build_reconcile_dag

    partner = get_partner(partner_id)
    return build_harvest_dag(partner) if kind == "harvest" else build_reconcile_dag(partner)


states = task_states


def test_a_failing_partner_alerts_with_partner_dag_task_try_and_cause(env: pytest.MonkeyPatch, webhook: WebhookSink) -> None:
    run = dag_for("harvest", "deadmuseum").test()
    assert states(run)["freeze_window"] == "failed"
    failures = [b["harvest"] for b in webhook.bodies if b["harvest"]["kind"] == "failure"]
    assert len(failures) == 1
    alert = failures[0]
    assert alert["partner"] == "deadmuseum" and alert["dag_id"] == "harvest_deadmuseum"
    assert alert["task_id"] == "freeze_window" and alert["try_number"] == 1
    assert alert["cause"].startswith("connection refused at 127.0.0.1:"), alert["cause"]  # the short cause
    assert "partner 'deadmuseum'" in alert["details"] and "verb=Identify" in alert["details"]  # and in full
    assert "\n" not in alert["cause"] and alert["log_url"]
    assert "harvest_deadmuseum.freeze_window failed" in webhook.bodies[0]["text"]


def test_reconcile_over_its_purge_limit_waits_at_the_gate_and_a_reject_leaves_records(env: pytest.MonkeyPatch, webhook: WebhookSink,
                                                                                      db: str) -> None:
    """The refusal became a request in Required Actions; Reject leaves everything as it
    was, and allow_mass_purge (scripts) still applies at once."""
    from tests.support.hitl import Responder

    repo = SimulatedRepository(records=500, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=41)
    with OaiSimulator(repo) as sim:
        env.setenv("AIRFLOW_CONN_PARTNER_ALERTMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        from airflow.models import Variable

        from partner_harvest.factory import Endpoint, build_adapter
        from partner_harvest.run import run_partner

        with connect(db) as conn:  # the first harvest through the library: the DAG's is tested elsewhere
            ensure_schema(conn)
            partner = get_partner("alertmuseum")
            run_partner(partner, build_adapter(partner, Endpoint(sim.base_url)), conn, "first")
            before = conn.execute("SELECT identifier, content_hash FROM records ORDER BY 1").fetchall()
        cursor = {"until": "2026-01-02T03:04:05Z", "run_id": "first"}
        Variable.set("harvest_cursor__alertmuseum", cursor, serialize_json=True)
        repo.delete(100)  # 20% vanish without tombstones
        webhook.bodies.clear()
        with Responder("approval_gate", "Reject") as answer:
            rejected = dag_for("reconcile", "alertmuseum").test()
        assert states(rejected) == {"reconcile": "success", "approval_gate": "success", "apply_reconcile": "skipped"}
        assert "100 of 500 records (20.0%, limit 5%)" in answer.seen["subject"]
        assert "alertmuseum" in answer.seen["body"] and "Required action" in answer.seen["body"]
        asked = next(b["harvest"] for b in webhook.bodies if b["harvest"]["kind"] == "approval_requested")
        assert asked["dag_id"] == "reconcile_alertmuseum" and asked["removals"] == 100
        with connect(db) as conn:
            assert conn.execute("SELECT identifier, content_hash FROM records ORDER BY 1").fetchall() == before
            assert conn.execute("SELECT state, decided_by FROM approval_requests").fetchall() == [("rejected", "ada")]
            assert conn.execute("SELECT count(*) FROM staging").fetchone() == (0,)
        allowed = dag_for("reconcile", "alertmuseum").test(run_conf={"allow_mass_purge": True})
        # applied in the reconcile task itself: nothing waits, the apply task is skipped (one Asset event)
        assert states(allowed) == {"reconcile": "success", "approval_gate": "success", "apply_reconcile": "skipped"}
        with connect(db) as conn:
            ensure_schema(conn)
            assert live_identifiers(conn, "alertmuseum") == repo.live_identifiers()
        assert Variable.get("harvest_cursor__alertmuseum", deserialize_json=True) == cursor  # never moved


def test_quality_alert_on_a_successful_run_with_many_rejects(env: pytest.MonkeyPatch, webhook: WebhookSink) -> None:
    repo = SimulatedRepository(records=300, page_size=100, invalid_every=10, deleted_fraction=0.0, seed=42)
    with OaiSimulator(repo) as sim:
        env.setenv("AIRFLOW_CONN_PARTNER_ALERTMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        run = dag_for("harvest", "alertmuseum").test()
        assert set(states(run).values()) == {"success"}
    quality = [b["harvest"] for b in webhook.bodies if b["harvest"]["kind"] == "quality"]
    assert len(quality) == 1 and quality[0]["partner"] == "alertmuseum"
    assert any("quarantine rate 10.0% (30 of 300 fetched)" in f for f in quality[0]["findings"])


def test_reconcile_waits_while_a_harvest_holds_the_partner(env: pytest.MonkeyPatch, webhook: WebhookSink, db: str) -> None:
    """Waiting for another run's lease gives the worker slot back: a reschedule at
    the lease's end, no retry used (the registry allows none) and no failure alert; then it runs."""
    import threading
    from datetime import timedelta

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    from partner_harvest.store import leases

    env.setattr(leases, "MIN_WAIT", timedelta(seconds=1))
    env.setattr(leases, "RECHECK_AFTER", timedelta(seconds=1))

    def reschedules() -> int:
        with create_session() as session:
            return session.query(TaskReschedule).count()

    def end_the_harvest_once_the_reconcile_waits() -> None:
        while not stop.wait(0.2):
            if reschedules() > before:
                with connect(db) as conn:
                    leases.release(conn, "alertmuseum", "nightly-run")
                return

    stop = threading.Event()
    before = reschedules()

    repo = SimulatedRepository(records=200, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=43)
    with OaiSimulator(repo) as sim:
        env.setenv("AIRFLOW_CONN_PARTNER_ALERTMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        with connect(db) as conn:
            ensure_schema(conn)
            leases.acquire(conn, "alertmuseum", "nightly-run", leases.HARVEST, timedelta(hours=1))
        watcher = threading.Thread(target=end_the_harvest_once_the_reconcile_waits, daemon=True)
        watcher.start()
        try:
            run = dag_for("reconcile", "alertmuseum").test()
        finally:
            stop.set()
            watcher.join()
        assert states(run) == {"reconcile": "success", "approval_gate": "success", "apply_reconcile": "skipped"}
        with create_session() as session:
            ti = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id="reconcile").one()
            assert ti.try_number == 1  # a wait is not a retry
            waits = session.query(TaskReschedule).filter(TaskReschedule.ti_id == ti.id).all()
        assert len(waits) == 1 and (waits[0].end_date - waits[0].start_date).total_seconds() < 30
        assert not [b for b in webhook.bodies if b["harvest"]["kind"] == "failure"]
        with connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM partner_leases").fetchone() == (0,)  # released
