"""The harvest DAG's approval gate through Airflow (dag.test(), answered like the REST API does):
a quiet night passes the gate at once; a shrinking run waits and applies exactly when
approved; an operator's command during the wait makes the approved apply refuse."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect, fences
from partner_harvest.store.db import one
from tests.support.dags import build_dag, get_cursor, task_states
from tests.support.db import held
from tests.support.hitl import Responder
from tests.support.webhook import WebhookSink

# The first test of a session also pays the session's Airflow set-up (airflow db migrate, the
# first DAG parse) inside its time limit: on a loaded 2-core machine that alone came near the
# default 120 s (pytest.ini), so this module allows more.
pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]


@pytest.fixture
def museum(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, webhook: WebhookSink,
           airflow_db: None) -> Iterator[SimulatedRepository]:
    registry(
        "partners:\n"
        "  - {id: gatemuseum, protocol: oai-pmh, conn_id: partner_gatemuseum, metadata_prefix: oai_dc, lag: 0s,\n"
        "     max_shrink_fraction: 0.1, options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
    )
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    from airflow.models import Variable

    Variable.delete("harvest_cursor__gatemuseum")
    repo = SimulatedRepository(records=200, page_size=100, deleted_record="persistent", deleted_fraction=0.0, seed=71)
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_GATEMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        first = build_dag("gatemuseum").test()
        assert set(task_states(first).values()) == {"success"}  # a first load shrinks nothing: the gate passes
        yield repo


def test_a_quiet_night_passes_then_a_shrinking_harvest_waits_and_approve_applies_exactly(
        museum: SimulatedRepository, aggregation_conn: str, webhook: WebhookSink) -> None:
    """One partner, two nights (sharing the fixture's first load): a quiet night passes the
    gate and applies with no request; a shrinking one waits and applies what it staged."""
    museum.edit(3)
    quiet = build_dag("gatemuseum").test()
    assert set(task_states(quiet).values()) == {"success"}
    with connect(aggregation_conn) as conn:
        assert conn.execute("SELECT count(*) FROM approval_requests").fetchone() == (0,)
    assert held(aggregation_conn, "gatemuseum") == museum.live_identifiers()

    cursor = get_cursor("gatemuseum")
    gone = set(museum.delete(40))  # 20% deleted with tombstones: over 10%
    before = held(aggregation_conn, "gatemuseum")
    with Responder("approval_gate", "Approve") as answer:
        run = build_dag("gatemuseum").test()
    assert "40 of 200 records (20.0%, limit 10%)" in answer.seen["subject"]
    assert str(getattr(answer.seen["state"], "value", answer.seen["state"])) == "awaiting_input"
    states = task_states(run)
    assert states["approval_gate"] == "success" and states["apply_changes"] == "success"
    assert held(aggregation_conn, "gatemuseum") == before - gone == museum.live_identifiers()
    assert get_cursor("gatemuseum") != cursor  # the approved incremental moved the cursor
    with connect(aggregation_conn) as conn:
        assert conn.execute("SELECT state, decided_by, removals FROM approval_requests").fetchall() == [
            ("applied", "ada", 40)]
    assert any(b["harvest"]["kind"] == "approval_requested" for b in webhook.bodies)


def test_an_operator_command_during_the_wait_makes_the_approved_apply_refuse(museum: SimulatedRepository, aggregation_conn: str) -> None:
    cursor = get_cursor("gatemuseum")
    museum.delete(40)
    before = held(aggregation_conn, "gatemuseum")

    def reset_cursor() -> None:  # what `partner-harvest reset-cursor` does to the fence
        with connect(aggregation_conn) as conn, conn.transaction():
            fences.bump_epoch(conn, "gatemuseum", "reset-cursor")

    with Responder("approval_gate", "Approve", before=reset_cursor):
        run = build_dag("gatemuseum").test()
    states = task_states(run)
    assert states["approval_gate"] == "success" and states["apply_changes"] == "failed"
    assert states["advance_cursor"] in ("upstream_failed", "skipped")
    assert held(aggregation_conn, "gatemuseum") == before and get_cursor("gatemuseum") == cursor
    with connect(aggregation_conn) as conn:
        state, note = one(conn.execute("SELECT state, note FROM approval_requests"))
        assert state == "refused" and "reset-cursor" in note
        assert conn.execute("SELECT count(*) FROM staging").fetchone() == (0,)
