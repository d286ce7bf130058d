"""The sliced reconcile through Airflow (dag.test, issue 28 item 6): plan_sweep, a mapped
sweep_ids per slice in the partner's pool, apply_reconcile; a slice that fails is retried
on its own and the reconcile converges exactly. A small partner's reconcile stays one task."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.registry import get_partner
from partner_harvest.run import run_partner
from partner_harvest.store import connect, ensure_schema
from tests.support.db import held

pytestmark = pytest.mark.airflow

SLICING = "slicing: {threshold_records: 300, target_records: 150, reconcile_slices: 4}"


@pytest.fixture
def museum(registry, monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, airflow_db):
    registry(
        "partners:\n"
        "  - {id: bigmuseum, protocol: oai-pmh, conn_id: partner_bigmuseum, metadata_prefix: oai_dc,\n"
        f"     options: {{http: {{backoff_factor: 0.01, retries: 0}}}}, {SLICING}}}\n"
        "  - {id: smallmuseum, protocol: oai-pmh, conn_id: partner_smallmuseum, metadata_prefix: oai_dc}\n"
    )
    repo = SimulatedRepository(records=800, page_size=50, seed=14, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_BIGMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        yield sim, repo


def test_a_small_partners_reconcile_stays_one_task(museum) -> None:
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    # one task's sweep and apply, behind the approval gate (airflow/gates.py) that passes unless over the limit
    assert [t.task_id for t in build_reconcile_dag(get_partner("smallmuseum")).tasks] == [
        "reconcile", "approval_gate", "apply_reconcile"]
    big = build_reconcile_dag(get_partner("bigmuseum"))
    assert [t.task_id for t in big.tasks] == ["plan_sweep", "sweep_ids", "apply_reconcile"]


@pytest.mark.slow  # a dag.test() of 6 tasks, 800 records
def test_a_sliced_reconcile_retries_only_the_slice_that_failed_and_converges(museum, db, monkeypatch) -> None:
    sim, repo = museum
    partner = get_partner("bigmuseum")
    with connect(db) as conn:
        ensure_schema(conn)
        run_partner(partner, build_adapter(partner, Endpoint(sim.base_url)), conn, "first")
    vanished, added = set(repo.delete(12)), set(repo.add(5))
    original, lists = sim.handle_oai, {"n": 0, "sweeping": False}

    def fail_once(pairs):  # a list page inside a slice's sweep (not the plan's probes) answers 503 once
        if (lists["sweeping"] and any(k == "verb" and v == "ListIdentifiers" for k, v in pairs)
                and any(k == "resumptionToken" for k, _ in pairs)):
            lists["n"] += 1
            if lists["n"] == 3:
                sim.fail_next(1, status=503)
        return original(pairs)

    sim.handle_oai = fail_once
    from partner_harvest.airflow import tasks as task_bodies
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    sweep_slice = task_bodies.sweep_reconcile_slice

    def sweeping(*args, **kwargs):  # the plan's probes are done once the first slice starts
        lists["sweeping"] = True
        return sweep_slice(*args, **kwargs)

    monkeypatch.setattr(task_bodies, "sweep_reconcile_slice", sweeping)

    dag = build_reconcile_dag(partner)
    for task in dag.tasks:
        task.retries = 0
    mapped = dag.get_task("sweep_ids")
    mapped.partial_kwargs.update(retries=1, retry_delay=timedelta(0), retry_exponential_backoff=0)
    run = dag.test()
    tis = sorted((ti.task_id, ti.map_index, str(getattr(ti.state, "value", ti.state)), ti.try_number)
                 for ti in run.get_task_instances())
    sweeps = [t for t in tis if t[0] == "sweep_ids"]
    assert len(sweeps) == 4 and {t[2] for t in tis} == {"success"}, tis
    assert sorted(t[3] for t in sweeps) == [1, 1, 1, 2]  # one slice ran twice, alone
    assert held(db, "bigmuseum") == repo.live_identifiers()
    with connect(db) as conn:
        purged = conn.execute("SELECT count(*) FROM deletions WHERE partner_id = 'bigmuseum' AND reason = 'reconcile'"
                              ).fetchone()[0]
        lease = conn.execute("SELECT count(*) FROM partner_leases WHERE partner_id = 'bigmuseum'").fetchone()[0]
    assert purged == len(vanished) and added <= held(db, "bigmuseum") and lease == 0  # the apply released it
