"""harvest_<iiif partner> and reconcile_<iiif partner> through Airflow (dag.test): the third
protocol runs in the DAG shape of the other two, and what reads a partner's
state (health rows, ``partner-harvest status``, the change feed, Asset events) covers it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from include.simulators.iiif.museum import Museum
from include.simulators.iiif.server import IiifServer
from partner_harvest.registry import get_partner
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from tests.support import dags

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun

pytestmark = pytest.mark.airflow
PARTNER = "dagrijks"
build_dag = partial(dags.build_dag, PARTNER)
states = dags.task_states


@pytest.fixture
def museum() -> Museum:
    museum = Museum(page_sizes=(7, 4, 9), fractions=True, lido_too=True)
    museum.create(60)
    return museum


@pytest.fixture
def iiif_env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, museum: Museum,
             airflow_db: None) -> Iterator[IiifServer]:
    registry(
        "partners:\n"
        f"  - id: {PARTNER}\n"
        "    protocol: iiif-change-discovery\n"
        f"    conn_id: partner_{PARTNER}\n"
        "    lag: 0s\n"
        "    pool_slots: 2\n"
        "    slicing: {threshold_records: 30, target_records: 20, max_slices: 3}\n"  # a first load in 3 slices
        "    options: {http: {backoff_factor: 0.01, retries: 2}, iiif: {description_concurrency: 4}}\n"
    )
    with IiifServer(museum) as sim:
        monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{PARTNER.upper()}",
                           json.dumps({"conn_type": "http", "host": sim.collection_url}))
        dags.set_cursor(PARTNER, None)
        yield sim
        dags.set_cursor(PARTNER, None)


def live(sim: IiifServer) -> set[str]:
    return {sim.museum.identifier(sim.base_url, slug) for slug in sim.museum.live}


def held(db: str) -> set[str]:
    with connect(db) as conn:
        ensure_schema(conn)
        return live_identifiers(conn, PARTNER)


def succeeded(run: DagRun) -> bool:
    """The run succeeded: every task did, or was skipped (the reconcile's apply when it applied itself)."""
    return str(run.state).endswith("success") and set(states(run).values()) <= {"success", "skipped"}


def asset_events() -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.uri == f"partner-harvest://{PARTNER}/records").order_by(AssetEvent.id).all())
        return [dict(row.extra) for row in rows]


@pytest.mark.slow  # three DAG runs
@pytest.mark.timeout(600)  # three dag.test() runs, the first paying the in-process API's start
def test_iiif_partner_harvests_first_a_quiet_night_and_a_night_of_changes_through_its_dag(
        iiif_env: IiifServer, museum: Museum, db: str) -> None:
    sim = iiif_env
    dag = build_dag()
    assert {"freeze_window", "plan_slices", "harvest_changes", "approval_gate", "apply_changes", "advance_cursor",
            "check_quality"} == set(dag.task_ids)  # the OAI shape: no deletions channel

    first = dag.test()  # the first load: three slices of the page chain, mapped, one apply
    assert succeeded(first), states(first)
    assert held(db) == live(sim) and len(live(sim)) == 60
    assert dags.get_cursor(PARTNER)["until"] == museum.events[-1].when.strftime("%Y-%m-%dT%H:%M:%SZ")
    mapped = [ti for ti in first.get_task_instances() if ti.task_id == "harvest_changes"]
    assert len(mapped) == 3
    with connect(db) as conn:
        checks = conn.execute("SELECT channel, check_kind, check_ok, check_expected, check_found, status"
                              " FROM harvest_runs WHERE partner_id = %s AND channel LIKE 'changes/%%'"
                              " ORDER BY channel", (PARTNER,)).fetchall()
    assert [c[0] for c in checks] == ["changes/001", "changes/002", "changes/003"]
    assert all(c[1:3] == ("iiif-slice-pages", True) and c[3] == c[4] and c[5] == "applied" for c in checks)
    assert sum(c[3] for c in checks) == 60

    sim.clear_requests()
    quiet = dag.test()
    assert succeeded(quiet), states(quiet)
    assert len(sim.requests) <= 2, sim.requests  # the collection and its last page
    assert held(db) == live(sim)

    museum.update("o3")
    museum.update("o40", same_time=True)
    museum.delete("o7")
    moved = museum.move("o11")
    museum.delete("o20")
    museum.recreate("o20")
    museum.create(3)
    sim.clear_requests()
    busy = dag.test()
    assert succeeded(busy), states(busy)
    assert held(db) == live(sim)
    assert sim.count("/objects/") == 2 + 1 + 1 + 3  # edits, the Move's target, the re-Create, the new ones
    assert museum.identifier(sim.base_url, moved) in held(db)
    assert dags.get_cursor(PARTNER)["until"] == museum.events[-1].when.strftime("%Y-%m-%dT%H:%M:%SZ")

    # The change feed and Asset events cover it like the other protocols.
    from partner_harvest.store import feed

    with connect(db) as conn:
        changes = {(c["identifier"], c["op"] if "op" in c else c.get("kind")) for c in
                   feed.changes(conn, PARTNER, 0, feed.high_water(conn, PARTNER))}
    gone = {museum.identifier(sim.base_url, s) for s in ("o7", "o11")}
    assert gone <= {identifier for identifier, _ in changes}
    events = asset_events()
    assert len(events) >= 2  # the first harvest and the busy night (the quiet one may say nothing)

    # The health rows and `partner-harvest status` read it as any partner.
    from partner_harvest.cli.status import partner_overview

    with connect(db) as conn:
        rows, _ = partner_overview(conn, [get_partner(PARTNER)], datetime.now(timezone.utc))
    [row] = rows
    assert row["protocol"] == "iiif-change-discovery" and row["records"] == len(live(sim))
    assert row["last_run"] == "applied" and row["cursor"]


def test_iiif_reconcile_dag_restores_the_live_set(iiif_env: IiifServer, museum: Museum, db: str) -> None:
    from partner_harvest.airflow.dag_factory import build_reconcile_dag

    sim = iiif_env
    assert succeeded(build_dag().test())
    museum.delete("o5")
    museum.refresh(truncate=True)  # the rebuilt stream has lost that Delete: only the sweep sees it
    assert museum.identifier(sim.base_url, "o5") in held(db)
    reconcile = build_reconcile_dag(get_partner(PARTNER))
    for task in reconcile.tasks:
        task.retries = 0
    run = reconcile.test()
    assert succeeded(run), states(run)
    assert held(db) == live(sim)
