"""`partner-harvest onboard`: Airflow in line with the registry, idempotent.

A real metadata database with the partners' DAGs serialized into it (as the dag-processor
leaves them: paused at creation), a real aggregation database. A dry run changes nothing;
the first pass creates the pools and a Connection from a file, finds the other in a secrets
backend (the environment), unpauses the DAGs and triggers one first harvest (the other
partner has a cursor); the second pass changes nothing at all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.models.pool import Pool

from partner_harvest.airflow import admin
from partner_harvest.cli import main
from partner_harvest.registry import cursor_key, load_registry
from partner_harvest.store import connect, ensure_schema
from tests.support.checks import present

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _state(dag_ids: list[str]) -> dict:
    from airflow.models.connection import Connection
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return {
            "paused": dict(session.execute(select(DagModel.dag_id, DagModel.is_paused)
                                           .where(DagModel.dag_id.in_(dag_ids))).all()),
            "runs": sorted(session.execute(select(DagRun.dag_id, DagRun.run_id)
                                           .where(DagRun.dag_id.in_(dag_ids))).all()),
            "conns": sorted((c.conn_id, c.host, c.password) for c in session.scalars(select(Connection))),
            "pools": sorted((p.pool, p.slots, p.description) for p in Pool.get_pools()),
        }


@pytest.fixture
def fleet(airflow_api: str, aggregation_conn: str, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, list[str], Path]]:
    """Two new partners whose DAGs the dag-processor has parsed (serialized, paused)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    monkeypatch.delenv("HARVEST_DATABASE_URL", raising=False)
    a, b = (f"onb{uuid.uuid4().hex[:8]}" for _ in range(2))
    path = tmp_path / "partners.yaml"
    path.write_text(f"partners:\n  - id: {a}\n    protocol: oai-pmh\n    conn_id: partner_{a}\n    pool_slots: 2\n"
                    f"  - id: {b}\n    protocol: sierra\n    conn_id: partner_{b}\n")
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(path))
    monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{b.upper()}", json.dumps({"conn_type": "http", "host": "https://lib.example"}))
    with connect(aggregation_conn) as conn:
        ensure_schema(conn)
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    ours = [d for d in bag.dags if a in d or b in d]
    assert len(ours) == 4, (sorted(bag.dags)[:8], bag.import_errors)
    bag.dags = {d: bag.dags[d] for d in ours}
    sync_bag_to_db(bag, "dags-folder", None)
    admin.write_variable(cursor_key(b), {"until": "2026-06-01T00:00:00Z", "granularity": "seconds"}, "t")
    yield a, b, ours, path
    from airflow.api.common.delete_dag import delete_dag

    for dag_id in ours:
        delete_dag(dag_id)
    for pid in (a, b):
        admin.delete_pool(f"partner_{pid}")
        admin.delete_variable(cursor_key(pid))
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(Connection).where(Connection.conn_id.in_([f"partner_{a}", f"partner_{b}"])))


def test_onboard_brings_airflow_in_line_once_and_a_second_pass_changes_nothing(fleet: tuple[str, str, list[str], Path], tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    a, b, dag_ids, registry = fleet
    file = tmp_path / "connections.yaml"
    file.write_text(f"partner_{a}:\n  conn_type: http\n  host: https://museum.example/oai\n  password: s3cret-pw\n"
                    "  extra: {verify: /etc/ssl/partner-ca.pem}\n")
    before = _state(dag_ids)
    assert set(before["paused"].values()) == {True}

    assert main(["onboard", "--connections", str(file), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"pool       partner_{a}: would create (2 slot(s))" in out
    assert f"connection partner_{a}: would create (http, from the file)" in out
    assert f"trigger    harvest_{a}: would trigger" in out and f"trigger    harvest_{b}" not in out
    assert "s3cret-pw" not in out
    assert _state(dag_ids) == before  # a dry run writes nothing

    assert main(["onboard", "--connections", str(file), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert f"connection partner_{b}: ok (in a secrets backend)" in out
    assert "s3cret-pw" not in out
    after = _state(dag_ids)
    assert set(after["paused"].values()) == {False}
    assert [dag for dag, _ in after["runs"]] == [f"harvest_{a}"]  # b has a cursor: no first harvest
    assert present(Pool.get_pool(f"partner_{a}")).slots == 2 and present(Pool.get_pool(f"partner_{b}")).slots == 1
    from airflow.models.connection import Connection

    stored = Connection.get_connection_from_secrets(f"partner_{a}")
    assert stored.password == "s3cret-pw" and stored.extra_dejson == {"verify": "/etc/ssl/partner-ca.pem"}

    assert main(["onboard", "--connections", str(file)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("2 partner(s): nothing to change"), out
    assert _state(dag_ids) == after  # idempotent: the second pass changed nothing

    file.write_text(f"partner_{a}:\n  conn_type: http\n  host: https://museum.example/oai2\n  password: s3cret-pw\n"
                    "  extra: {verify: /etc/ssl/partner-ca.pem}\n")
    assert main(["onboard", "--connections", str(file)]) == 0
    assert f"connection partner_{a}: updated (fields host)" in capsys.readouterr().out

    registry.write_text(registry.read_text() + "  - id: onbmissing\n    protocol: oai-pmh\n    conn_id: partner_nowhere\n")
    assert load_registry(registry).errors == []
    assert main(["onboard", "--dry-run"]) == 1  # a Connection nowhere: named, exit 1
    captured = capsys.readouterr()
    assert "Connection partner_nowhere is missing" in captured.err
    assert "unpause    harvest_onbmissing: wait (not parsed by the dag-processor yet" in captured.out
