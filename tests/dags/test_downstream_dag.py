"""The apply's Asset event and the example downstream DAG, through Airflow itself (dag.test)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from airflow.sdk import Asset, AssetAny

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.registry import get_partner
from partner_harvest.store import connect

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = pytest.mark.airflow

PARTNER = f"feed{uuid.uuid4().hex[:8]}"  # its own Asset in the session's metadata DB


@pytest.fixture
def repo() -> SimulatedRepository:
    return SimulatedRepository(records=120, page_size=50, seed=7)


@pytest.fixture
def partner_env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, repo: SimulatedRepository,
                airflow_db: None) -> Iterator[OaiSimulator]:
    registry(
        "partners:\n"
        f"  - {{id: {PARTNER}, protocol: oai-pmh, conn_id: partner_feed, metadata_prefix: auto,\n"
        "     lag: 5m, options: {http: {backoff_factor: 0.01, retries: 2}}}\n"
    )
    from airflow.models import Variable

    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_FEED", json.dumps({"conn_type": "http", "host": sim.base_url}))
        Variable.delete(f"harvest_cursor__{PARTNER}")
        yield sim
        Variable.delete(f"harvest_cursor__{PARTNER}")


def harvest_dag() -> DAG:
    from partner_harvest.airflow.dag_factory import build_harvest_dag

    dag = build_harvest_dag(get_partner(PARTNER))
    for task in dag.tasks:
        task.retries = 0
    return dag


def downstream_dag() -> DAG:
    from partner_harvest.airflow.downstream import build_jsonl_export_dag

    dag = build_jsonl_export_dag()
    for task in dag.tasks:
        task.retries = 0
    return dag


def asset_events() -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.uri == f"partner-harvest://{PARTNER}/records")
                .order_by(AssetEvent.id).all())
        return [dict(row.extra) | {"_source_task": row.source_task_id} for row in rows]


def exported(directory: Path) -> list[list[dict]]:
    files = sorted((directory / PARTNER).glob("changes_*.jsonl"))
    return [[json.loads(text) for text in f.read_text().splitlines()] for f in files]


def test_each_apply_emits_its_range_and_the_downstream_dag_exports_exactly_it(
    partner_env: OaiSimulator, repo: SimulatedRepository, db: str, tmp_path: Path,
) -> None:
    first = harvest_dag().test()
    assert str(first.state).endswith("success")
    [event] = asset_events()
    assert event["_source_task"] == "apply_changes" and event["partner_id"] == PARTNER
    assert event["mode"] == "incremental" and event["changed"] is True
    live = repo.live_identifiers()
    assert event["counts"]["upserted"] == len(live) and event["dag_run_id"] == first.run_id
    assert event["window_until"] is not None

    run = downstream_dag().test(run_conf={"output_dir": str(tmp_path)})
    assert str(run.state).endswith("success")
    [batch] = exported(tmp_path)
    assert {line["identifier"] for line in batch} == live and {line["op"] for line in batch} == {"upsert"}
    assert len(batch) == len(live)
    assert (batch[0]["seq"] > event["change_seq_after"]) and batch[-1]["seq"] <= event["change_seq_until"]

    edited, deleted, added = repo.edit(6), repo.delete(3), repo.add(2)
    second = harvest_dag().test()
    assert str(second.state).endswith("success")
    event2 = asset_events()[-1]
    assert event2["change_seq_after"] == event["change_seq_until"]
    assert (event2["counts"]["upserted"], event2["counts"]["purged"]) == (8, 3)

    assert str(downstream_dag().test(run_conf={"output_dir": str(tmp_path)}).state).endswith("success")
    files = exported(tmp_path)
    assert len(files) == 2
    changes = {(line["op"], line["identifier"]) for line in files[1]}
    assert changes == ({("upsert", i) for i in [*edited, *added]} | {("delete", i) for i in deleted})
    assert all(event2["change_seq_after"] < line["seq"] <= event2["change_seq_until"] for line in files[1])

    # Nothing new: the run succeeds, writes nothing, and an unchanged harvest still emits.
    assert str(downstream_dag().test(run_conf={"output_dir": str(tmp_path)}).state).endswith("success")
    assert len(exported(tmp_path)) == 2
    assert str(harvest_dag().test().state).endswith("success")
    event3 = asset_events()[-1]
    assert event3["changed"] is False and event3["change_seq_after"] == event3["change_seq_until"]
    with connect(db) as conn:
        assert conn.execute("SELECT position FROM feed_positions WHERE partner_id = %s",
                            (PARTNER,)).fetchone() == (event2["change_seq_until"],)


def test_the_reconcile_emits_its_range_too(partner_env: OaiSimulator, repo: SimulatedRepository, tmp_path: Path) -> None:
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    assert str(harvest_dag().test().state).endswith("success")
    assert str(downstream_dag().test(run_conf={"output_dir": str(tmp_path)}).state).endswith("success")
    gone = repo.delete(2)
    dag = build_reconcile_dag(get_partner(PARTNER))
    for task in dag.tasks:
        task.retries = 0
    assert str(dag.test().state).endswith("success")
    event = asset_events()[-1]
    assert event["_source_task"] == "reconcile" and event["counts"]["purged"] == 2
    assert str(downstream_dag().test(run_conf={"output_dir": str(tmp_path)}).state).endswith("success")
    last = exported(tmp_path)[-1]
    assert {(line["op"], line["identifier"], line["reason"]) for line in last} == {
        ("delete", i, "reconcile") for i in gone}


def test_the_downstream_dag_is_scheduled_on_every_partners_asset(registry: Callable[[str], Path], airflow_db: None) -> None:
    from partner_harvest.airflow.assets import partner_asset, partner_of

    registry("partners:\n"
             "  - {id: alpha, protocol: oai-pmh, conn_id: partner_alpha}\n"
             "  - {id: beta, protocol: oai-pmh, conn_id: partner_beta}\n")
    dag = downstream_dag()
    assert isinstance(dag.schedule, AssetAny)
    assets = list(dag.schedule.objects)
    assert all(isinstance(a, Asset) for a in assets)
    assert {a.uri for a in assets if isinstance(a, Asset)} == {
        partner_asset("alpha").uri, partner_asset("beta").uri}
    assert partner_of(partner_asset("alpha").uri) == "alpha"
    assert partner_of("partner-harvest://alpha/other") is None and partner_of("s3://alpha/records") is None
