"""Move at the harvest DAG's approval gate, through Airflow (dag.test(), answered as the REST API
does): a partner renaming every identifier waits at the gate with Move beside Approve and
Reject; Move applies the run with the records moved to their new identifiers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect, feed
from tests.support.dags import build_dag, task_states
from tests.support.db import held
from tests.support.hitl import Responder

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]


def test_a_renamed_partner_is_offered_move_and_move_keeps_the_records(
        registry: Any, monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, webhook: Any, airflow_db: None) -> None:
    registry(
        "partners:\n"
        "  - {id: movemuseum, protocol: oai-pmh, conn_id: partner_movemuseum, metadata_prefix: oai_dc, lag: 0s,\n"
        "     options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
    )
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    from airflow.models import Variable

    Variable.delete("harvest_cursor__movemuseum")
    repo = SimulatedRepository(records=120, page_size=100, deleted_record="persistent", deleted_fraction=0.0, seed=44)
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_MOVEMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        assert set(task_states(build_dag("movemuseum").test()).values()) == {"success"}
        with connect(aggregation_conn) as conn:
            first: dict[str, Any] = dict(conn.execute("SELECT identifier, first_harvested_at FROM records").fetchall())
            seen = feed.high_water(conn, "movemuseum")
        pairs = dict(repo.rename("oai:new.example:object-"))
        with Responder("approval_gate", "Move") as answer:
            run = build_dag("movemuseum").test()
    assert answer.seen["options"] == ["Approve", "Reject", "Move"]
    assert "120 reappear under new identifiers" in answer.seen["subject"]
    states = task_states(run)
    assert states["approval_gate"] == "success" and states["apply_changes"] == "success"
    assert held(aggregation_conn, "movemuseum") == set(pairs.values()) == repo.live_identifiers()
    with connect(aggregation_conn) as conn:
        now_first: dict[str, Any] = dict(conn.execute("SELECT identifier, first_harvested_at FROM records").fetchall())
        events = list(feed.changes(conn, "movemuseum", seen, feed.high_water(conn, "movemuseum")))
        request = conn.execute("SELECT state, decided_by, movable, move FROM approval_requests").fetchone()
    assert all(now_first[new] == first[old] for old, new in pairs.items())
    assert [e["op"] for e in events] == ["moved"] * 120
    assert request == ("applied", "ada", 120, True)
