"""An OAI-PMH partner behind a query credential whose ListRecords always fails, through Airflow
(dag.test): harvested with ListIdentifiers + GetRecord, exactly, and its secret nowhere: not in
a log line, an XCom, a rendered field, a table or an alert."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from tests.support import dags
from tests.support.checks import present
from tests.support.dags import task_states
from tests.support.db import held as support_held
from tests.support.webhook import WebhookSink

pytestmark = pytest.mark.airflow
SECRET = "dag+oai/secret=never&logged"  # URL-encoded in every request URL
build_dag = partial(dags.build_dag, "keymuseum")
held = partial(support_held, partner_id="keymuseum")


@pytest.fixture
def museum(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, webhook: WebhookSink,
           airflow_db: None) -> Iterator[tuple[OaiSimulator, SimulatedRepository]]:
    from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository

    registry(
        "partners:\n"
        "  - {id: keymuseum, protocol: oai-pmh, conn_id: partner_keymuseum, metadata_prefix: auto, lag: 5m,\n"
        "     pool_slots: 2, options: {http: {backoff_factor: 0.01, retries: 1}, oai: {method: identifiers_then_get}}}\n"
    )
    repo = SimulatedRepository(records=150, page_size=50, deleted_fraction=0.05, seed=61)
    with OaiSimulator(repo) as sim:
        sim.require_credentials("query", SECRET, name="apikey")
        sim.break_verb("ListRecords", 500)
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_KEYMUSEUM", json.dumps(
            {"conn_type": "oai_pmh", "host": sim.base_url, "password": SECRET,
             "extra": {"auth": "query", "auth_param": "apikey"}}))
        monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
        dags.set_cursor("keymuseum", None)
        yield sim, repo
        dags.set_cursor("keymuseum", None)


def stored_text(dag_id: str) -> str:
    """Every XCom and rendered field of the DAG's runs, as text."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        xcoms = session.query(XComModel).filter(XComModel.dag_id == dag_id).all()
        fields = session.query(RenderedTaskInstanceFields).filter(RenderedTaskInstanceFields.dag_id == dag_id).all()
        return " ".join([json.dumps(x.value, default=str) for x in xcoms]
                        + [json.dumps(f.rendered_fields, default=str) for f in fields])


def test_a_keyed_partner_with_broken_list_records_through_the_dag(museum: tuple[OaiSimulator, SimulatedRepository], db: str,
                                                                  webhook: WebhookSink, capfd: pytest.CaptureFixture[str],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    sim, repo = museum
    caplog.set_level(logging.DEBUG)
    dag = build_dag()
    first = dag.test()
    assert set(task_states(first).values()) == {"success"}, task_states(first)
    assert held(db) == repo.live_identifiers()
    repo.advance_clock(3600)
    repo.edit(6)
    repo.delete(3)
    repo.add(4)
    second = dag.test()
    assert set(task_states(second).values()) == {"success"}, task_states(second)
    assert held(db) == repo.live_identifiers()
    verbs = {r["verb"] for r in sim.requests}
    assert "ListRecords" not in verbs and {"ListIdentifiers", "GetRecord"} <= verbs
    assert sim.refused_credentials == 0

    sim.require_credentials("query", "rotated", name="apikey")  # the partner rotated the key: the run fails
    repo.advance_clock(3600)
    failed = dag.test()
    assert task_states(failed)["freeze_window"] == "failed"
    alerts = json.dumps(webhook.bodies)
    assert "keymuseum" in alerts and "HTTP 401" in alerts

    output = capfd.readouterr()
    logged = output.out + output.err + caplog.text
    assert "GetRecord" in logged or "ListIdentifiers" in logged  # the task logs were captured
    from psycopg import sql

    from partner_harvest.store import connect

    with connect(db) as conn:
        tables = [t for (t,) in conn.execute("SELECT table_name FROM information_schema.tables "
                                             "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'")]
        in_tables = [t for t in tables if present(conn.execute(
            sql.SQL("SELECT count(*) FROM {} t WHERE t::text LIKE '%%secret=never%%' OR t::text LIKE '%%secret%%3Dnever%%'")
            .format(sql.Identifier(t))).fetchone())[0]]
    for form in ("secret=never", "secret%3Dnever"):  # the secret as given and as a URL carries it
        assert form not in logged and form not in stored_text("harvest_keymuseum") and form not in alerts
    assert in_tables == []
