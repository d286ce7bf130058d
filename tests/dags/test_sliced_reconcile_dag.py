"""The sliced reconcile through Airflow (dag.test): plan_sweep, a mapped
sweep_ids per lane in the partner's pool (each sweeping slice after slice), reconcile (the
settle), approval_gate, apply_reconcile; a lane that fails is retried on its own, resumes at
its slice, and the reconcile converges exactly. Over its purge limit it waits at the approval gate as the unsliced one does:
Approve applies exactly what it staged (with its metrics), Reject leaves
mirror and cursor as they were. A small partner's reconcile stays one task."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.definitions.mappedoperator import MappedOperator

from include.simulators.loopback import Response
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.registry import get_partner
from partner_harvest.run import run_partner
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.db import one, scalar
from tests.support.dags import get_cursor, set_cursor, task_states
from tests.support.db import held
from tests.support.hitl import Responder
from tests.support.statsd import StatsdListener, parse, stats_sent_to
from tests.support.webhook import WebhookSink

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = pytest.mark.airflow

SLICING = "slicing: {threshold_records: 300, target_records: 150, reconcile_slices: 4}"


@pytest.fixture
def museum(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str,
           airflow_db: None) -> Iterator[tuple[OaiSimulator, SimulatedRepository]]:
    registry(
        "partners:\n"
        "  - {id: bigmuseum, protocol: oai-pmh, conn_id: partner_bigmuseum, metadata_prefix: oai_dc, pool_slots: 4,\n"
        f"     options: {{http: {{backoff_factor: 0.01, retries: 0}}}}, {SLICING}}}\n"
        "  - {id: smallmuseum, protocol: oai-pmh, conn_id: partner_smallmuseum, metadata_prefix: oai_dc}\n"
    )
    repo = SimulatedRepository(records=400, page_size=50, seed=14, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_BIGMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        yield sim, repo


def test_a_small_partners_reconcile_stays_one_task(museum: tuple[OaiSimulator, SimulatedRepository]) -> None:
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    # one task's sweep and apply, behind the approval gate (airflow/gates.py) that passes unless over the limit
    assert [t.task_id for t in build_reconcile_dag(get_partner("smallmuseum")).tasks] == [
        "reconcile", "approval_gate", "apply_reconcile"]
    big = build_reconcile_dag(get_partner("bigmuseum"))
    assert [t.task_id for t in big.tasks] == ["plan_sweep", "sweep_ids", "reconcile", "approval_gate",
                                              "apply_reconcile"]
    assert big.get_task("apply_reconcile").upstream_task_ids == {"reconcile", "approval_gate"}
    assert "every slice of `sweep_ids`" in (big.get_task("reconcile").doc_md or "")  # the settle's own doc


@pytest.mark.slow  # a dag.test() of 6 tasks, 800 records
def test_a_sliced_reconcile_retries_only_the_slice_that_failed_and_converges(museum: tuple[OaiSimulator, SimulatedRepository], db: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    sim, repo = museum
    partner = get_partner("bigmuseum")
    with connect(db) as conn:
        ensure_schema(conn)
        run_partner(partner, build_adapter(partner, Endpoint(sim.base_url)), conn, "first")
    vanished, added = set(repo.delete(12)), set(repo.add(5))
    original, lists = sim.handle_oai, {"n": 0, "sweeping": False}

    def fail_once(pairs: list[tuple[str, str]]) -> Response:  # a list page inside a slice's sweep (not the plan's probes) answers 503 once
        if (lists["sweeping"] and any(k == "verb" and v == "ListIdentifiers" for k, v in pairs)
                and any(k == "resumptionToken" for k, _ in pairs)):
            lists["n"] += 1
            if lists["n"] == 3:
                sim.fail_next(1, status=503)
        return original(pairs)

    monkeypatch.setattr(sim, "handle_oai", fail_once)
    from partner_harvest.airflow import tasks as task_bodies
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    sweep_lane = task_bodies.sweep_reconcile_lane

    def sweeping(*args: Any, **kwargs: Any) -> Any:  # the plan's probes are done once the first slice starts
        lists["sweeping"] = True
        return sweep_lane(*args, **kwargs)

    monkeypatch.setattr(task_bodies, "sweep_reconcile_lane", sweeping)

    dag = build_reconcile_dag(partner)
    for task in dag.tasks:
        task.retries = 0
    mapped = dag.get_task("sweep_ids")
    assert isinstance(mapped, MappedOperator)
    mapped.partial_kwargs.update(retries=1, retry_delay=timedelta(0), retry_exponential_backoff=0)
    run = dag.test()
    tis = sorted((ti.task_id, ti.map_index, str(getattr(ti.state, "value", ti.state)), ti.try_number)
                 for ti in run.get_task_instances())
    sweeps = [t for t in tis if t[0] == "sweep_ids"]
    assert len(sweeps) == 4 and {t[2] for t in tis if t[0] != "apply_reconcile"} == {"success"}, tis
    assert [t[2] for t in tis if t[0] == "apply_reconcile"] == ["skipped"]  # within its limit: applied by the settle
    assert sorted(t[3] for t in sweeps) == [1, 1, 1, 2]  # one slice ran twice, alone
    assert held(db, "bigmuseum") == repo.live_identifiers()
    with connect(db) as conn:
        purged = scalar(conn.execute("SELECT count(*) FROM deletions WHERE partner_id = 'bigmuseum' AND reason = 'reconcile'"
                              ))
        lease = scalar(conn.execute("SELECT count(*) FROM partner_leases WHERE partner_id = 'bigmuseum'"))
    assert purged == len(vanished) and added <= held(db, "bigmuseum") and lease == 0  # the apply released it


# -- over the purge limit: the approval gate (airflow/gates.py), as for an unsliced reconcile

GATED = "slicing: {threshold_records: 100, target_records: 50, reconcile_slices: 2}"
CURSOR = {"until": "2026-01-02T03:04:05Z", "run_id": "scheduled__2026-01-02"}  # a reconcile never moves it


@pytest.fixture
def gated(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, airflow_db: None,
          webhook: WebhookSink) -> Iterator[tuple[SimulatedRepository, set[str], set[str], set[str]]]:
    """A partner of 200 records swept in 2 slices, harvested once; 30 of them (15%, over the 5%
    ``max_purge_fraction``) vanish upstream without a deletion notice, 3 are added."""
    registry(
        "partners:\n"
        "  - {id: gatedmuseum, protocol: oai-pmh, conn_id: partner_gatedmuseum, metadata_prefix: oai_dc,\n"
        f"     options: {{http: {{backoff_factor: 0.01, retries: 0}}}}, {GATED}}}\n"
    )
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    repo = SimulatedRepository(records=200, page_size=50, seed=23, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_GATEDMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        partner = get_partner("gatedmuseum")
        with connect(aggregation_conn) as conn:
            ensure_schema(conn)
            run_partner(partner, build_adapter(partner, Endpoint(sim.base_url)), conn, "first")
        set_cursor("gatedmuseum", CURSOR)
        before = held(aggregation_conn, "gatedmuseum")
        gone, added = set(repo.delete(30)), set(repo.add(3))
        yield repo, before, gone, added
    set_cursor("gatedmuseum", None)


def _reconcile_dag() -> DAG:
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    dag = build_reconcile_dag(get_partner("gatedmuseum"))
    for task in dag.tasks:
        task.retries = 0
    return dag


def test_a_sliced_reconcile_over_its_limit_waits_at_the_gate_and_approve_applies_exactly(
        gated: tuple[SimulatedRepository, set[str], set[str], set[str]], aggregation_conn: str, webhook: WebhookSink,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the sliced reconcile's apply failed with MassPurgeRefused."""
    repo, before, gone, added = gated
    statsd = StatsdListener()
    try:
        with stats_sent_to(statsd, monkeypatch), Responder("approval_gate", "Approve") as answer:
            run = _reconcile_dag().test()
        received = parse(statsd.lines(), "airflow.partner_harvest.")
    finally:
        statsd.close()
    assert task_states(run) == dict.fromkeys(
        ("plan_sweep", "sweep_ids", "reconcile", "approval_gate", "apply_reconcile"), "success")
    assert str(getattr(answer.seen["state"], "value", answer.seen["state"])) == "awaiting_input"
    assert "gatedmuseum: approve a reconcile purge? 30 of 200 records (15.0%, limit 5%)" == answer.seen["subject"]
    shown = {line.split("`")[1] for line in answer.seen["body"].splitlines() if line.startswith("- `")}
    assert len(shown) == 10 and shown <= gone  # a sample of what would go
    assert "/partner/gatedmuseum" in answer.seen["body"] and "Required action" in answer.seen["body"]
    assert held(aggregation_conn, "gatedmuseum") == (before - gone) | added == repo.live_identifiers()
    assert get_cursor("gatedmuseum") == CURSOR
    with connect(aggregation_conn) as conn:
        assert conn.execute("SELECT kind, state, decided_by, held, removals FROM approval_requests").fetchall() == [
            ("purge", "applied", "ada", 200, 30)]
        assert conn.execute("SELECT status, purged, upserted FROM harvest_runs WHERE run_id LIKE 'reconcile_%'"
                            ).fetchall() == [("applied", 30, 3)]
        assert conn.execute("SELECT count(*) FROM reconcile_slices").fetchone() == (0,)
    # the approved apply's metrics, sent once (the settle that staged it sent none of these)
    for key, value in (("purged", 30), ("upserted", 3), ("runs_applied", 1)):
        assert [v for v, _ in received[f"{key}.gatedmuseum"]] == [value], key
    assert sum(v for v, _ in received["requests.gatedmuseum"]) > 0  # the plan's and slices' requests
    assert [b["harvest"]["kind"] for b in webhook.bodies] == ["approval_requested"]


def test_a_rejected_sliced_reconcile_leaves_mirror_and_cursor_untouched(gated: tuple[SimulatedRepository, set[str], set[str], set[str]],
                                                                        aggregation_conn: str) -> None:
    repo, before, gone, added = gated
    with connect(aggregation_conn) as conn:
        feed = conn.execute("SELECT high_water FROM partner_feed WHERE partner_id = 'gatedmuseum'").fetchone()
    with Responder("approval_gate", "Reject", user="grace"):
        run = _reconcile_dag().test()
    states = task_states(run)
    assert {k: states[k] for k in ("plan_sweep", "sweep_ids", "reconcile", "approval_gate")} == dict.fromkeys(
        ("plan_sweep", "sweep_ids", "reconcile", "approval_gate"), "success")
    assert states["apply_reconcile"] == "skipped"
    assert held(aggregation_conn, "gatedmuseum") == before and get_cursor("gatedmuseum") == CURSOR
    with connect(aggregation_conn) as conn:
        assert conn.execute("SELECT state, decided_by FROM approval_requests").fetchall() == [("rejected", "grace")]
        status, error = one(conn.execute("SELECT status, error FROM harvest_runs WHERE run_id LIKE 'reconcile_%'"))
        assert status == "abandoned" and "rejected at the approval gate by grace" in error
        for table in ("staging", "reconcile_slices", "reconcile_ids", "deletions"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
        assert conn.execute("SELECT high_water FROM partner_feed WHERE partner_id = 'gatedmuseum'").fetchone() == feed
