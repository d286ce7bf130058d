"""A hostile partner through Airflow (dag.test): a slow drip ends at the request deadline,
the task fails with a clear error, and the run leaves no lease behind (I11)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.registry import get_partner
from partner_harvest.store.db import one

pytestmark = pytest.mark.airflow


@pytest.fixture
def dripping_partner(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str,
                     airflow_db: None) -> Iterator[OaiSimulator]:
    registry(
        "partners:\n"
        "  - {id: dripmuseum, protocol: oai-pmh, conn_id: partner_dripmuseum, metadata_prefix: oai_dc,\n"
        "     options: {http: {backoff_factor: 0.01, retries: 3, read_timeout: 30, request_deadline: 1}}}\n"
    )
    with OaiSimulator(SimulatedRepository(records=60, page_size=30, seed=3)) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_DRIPMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        yield sim


def test_a_slow_drip_fails_the_task_at_the_deadline_and_frees_the_partner(dripping_partner: OaiSimulator, db: str) -> None:
    from partner_harvest.airflow.dag_factory import build_harvest_dag

    dag = build_harvest_dag(get_partner("dripmuseum"))
    for task in dag.tasks:
        task.retries = 0
    # One byte every 0.3 s: never a read timeout (30 s), only the 1 s total deadline.
    dripping_partner.attack_next("slow_drip", interval=0.3, verb="ListRecords")
    run = dag.test(run_conf={"mode": "full"})
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states["freeze_window"] == "success" and states["harvest_changes"] == "failed"
    assert states["advance_cursor"] != "success"
    assert [r["verb"] for r in dripping_partner.requests].count("ListRecords") == 1  # no urllib3 retry
    with psycopg.connect(db) as conn:
        leases = conn.execute("SELECT holder FROM partner_leases WHERE partner_id = 'dripmuseum'").fetchall()
        status, error = one(conn.execute(
            "SELECT status, error FROM harvest_runs WHERE partner_id = 'dripmuseum' AND run_id = %s",
            (f"{run.dag_id}/{run.run_id}",)))
    assert leases == []  # released when the task failed: a reconcile is not kept waiting
    assert status == "failed"
    assert "request deadline of 1 s" in error and "verb=ListRecords" in error
