"""Figure 3: a harvest's Asset event triggers the example downstream DAG, on a real scheduler.

The downstream export holds exactly the run's changes; a second harvest applying while
the export runs is neither missed nor exported twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
import requests

from partner_harvest.store import connect, ensure_schema, feed

if TYPE_CHECKING:
    from tests.support.e2e_stack import AirflowStack

pytestmark = pytest.mark.e2e

DOWNSTREAM = "example_downstream_jsonl"


@pytest.fixture(scope="module")
def airflow_env_overrides() -> dict[str, str]:
    """Asset-triggered runs are created by the scheduler's DAG-run loop, which the shared
    fixture turns off (no cron runs racing the tests); this module needs it on."""
    return {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True"}


@pytest.fixture(scope="module")
def settled(airflow_stack: AirflowStack) -> AirflowStack:
    """With the DAG-run loop on, the unpaused harvest and reconcile DAGs run their latest
    past cron tick at once (their next ticks are tomorrow 02:00 and Sunday 04:00 UTC), and
    their events trigger the downstream DAG. Wait until all of that is done and exported."""
    stack = airflow_stack
    museum = (f"harvest_{stack.museum}", f"reconcile_{stack.museum}")

    def quiet() -> bool:
        try:
            for dag_id in (*museum, f"harvest_{stack.broken}", DOWNSTREAM):
                busy = stack.api("GET", f"/dags/{dag_id}/dagRuns", params={"state": ["queued", "running"]})
                if busy["total_entries"]:
                    return False
            for dag_id in museum:
                if not stack.api("GET", f"/dags/{dag_id}/dagRuns", params={"run_type": "scheduled"})["total_entries"]:
                    return False
        except requests.Timeout:  # a loaded api-server (its one worker also serves the task runners): ask again
            return False
        with connect(stack.aggregation_db) as conn:
            ensure_schema(conn)
            return feed.position(conn, DOWNSTREAM, stack.museum) == feed.high_water(conn, stack.museum) > 0

    stack.poll(quiet, 300, "the cron runs of the museum's DAGs and their exports to finish", interval=1)
    return stack


def run_key(dag_id: str, run_id: str) -> str:
    return f"{dag_id}/{run_id}"


def harvest(stack: AirflowStack) -> dict:
    dag_id = f"harvest_{stack.museum}"
    run = stack.trigger(dag_id, {"mode": "incremental"})
    return run


def wait_success(stack: AirflowStack, dag_id: str, run_id: str) -> None:
    done = stack.wait_for_run(dag_id, run_id, timeout=180)
    assert done["state"] == "success", stack.task_summary(dag_id, run_id)


def downstream_run_of(stack: AirflowStack, harvest_run_id: str) -> dict:
    """The asset-triggered downstream run whose triggering events include the harvest run's."""

    def found() -> dict | None:
        runs = stack.api("GET", f"/dags/{DOWNSTREAM}/dagRuns", params={"run_type": "asset_triggered"})["dag_runs"]
        for run in runs:
            events = stack.api("GET", f"/dags/{DOWNSTREAM}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents")
            if any(e["source_run_id"] == harvest_run_id for e in events["asset_events"]):
                return run
        return None

    run = stack.poll(found, 120, f"a {DOWNSTREAM} run triggered by harvest run {harvest_run_id}", interval=1)
    wait_success(stack, DOWNSTREAM, run["dag_run_id"])
    return run


def harvest_event(stack: AirflowStack, harvest_run_id: str) -> dict:
    events = stack.api("GET", "/assets/events", params={"source_run_id": harvest_run_id})["asset_events"]
    [event] = [e for e in events if e["source_task_id"] == "apply_changes"]
    assert event["uri"] == f"partner-harvest://{stack.museum}/records"
    return event["extra"]


def export_files(stack: AirflowStack) -> list[Path]:
    return sorted((stack.home / "exports" / "jsonl" / stack.museum).glob("changes_*.jsonl"))


def file_changes(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines()]


def run_changes(stack: AirflowStack, key: str) -> set[tuple[str, str]]:
    """Ground truth from the tables' run_id columns, not from change_seq."""
    with connect(stack.aggregation_db) as conn:
        upserts = conn.execute("SELECT identifier FROM records WHERE partner_id = %s AND run_id = %s",
                               (stack.museum, key)).fetchall()
        deletes = conn.execute("SELECT identifier FROM deletions WHERE partner_id = %s AND run_id = %s",
                               (stack.museum, key)).fetchall()
    return {("upsert", r[0]) for r in upserts} | {("delete", r[0]) for r in deletes}


def range_of(path: Path) -> tuple[int, int]:
    _, after, until = path.stem.split("_")
    return int(after), int(until)


def test_a_harvest_event_triggers_an_export_of_exactly_its_changes(settled: AirflowStack) -> None:
    stack = settled
    dag_id = f"harvest_{stack.museum}"
    before = export_files(stack)
    edited, deleted, added = stack.repo.edit(6), stack.repo.delete(3), stack.repo.add(2)
    run = harvest(stack)
    wait_success(stack, dag_id, run["dag_run_id"])
    extra = harvest_event(stack, run["dag_run_id"])
    assert extra["changed"] is True and extra["mode"] == "incremental"
    assert (extra["counts"]["upserted"], extra["counts"]["purged"]) == (8, 3)

    downstream_run_of(stack, run["dag_run_id"])
    [path] = [p for p in export_files(stack) if p not in before]
    assert range_of(path) == (extra["change_seq_after"], extra["change_seq_until"])
    changes = {(line["op"], line["identifier"]) for line in file_changes(path)}
    assert changes == run_changes(stack, run_key(dag_id, run["dag_run_id"]))
    assert changes == {("upsert", i) for i in [*edited, *added]} | {("delete", i) for i in deleted}


def _wait_blocked(stack: AirflowStack, table: str) -> int:
    """The backend of an Airflow task waiting for a row lock on ``table`` (we hold it)."""

    def blocked() -> int | None:
        with psycopg.connect(stack.aggregation_db, autocommit=True) as probe:
            row = probe.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND query LIKE %s AND pid <> pg_backend_pid()", (f"%FROM {table}%",)).fetchone()
        return row[0] if row else None

    return stack.poll(blocked, 120, f"a task to wait for our lock on {table}", interval=0.3)


def test_a_harvest_applying_during_the_export_is_neither_missed_nor_repeated(settled: AirflowStack) -> None:
    stack = settled
    dag_id = f"harvest_{stack.museum}"
    with connect(stack.aggregation_db) as conn:
        ensure_schema(conn)
    before = export_files(stack)
    consumer_lock = connect(stack.aggregation_db)
    feed_lock = connect(stack.aggregation_db)
    try:
        # Run A lands; its export waits for us before it reads anything.
        consumer_lock.execute("SELECT 1 FROM feed_positions WHERE consumer = %s AND partner_id = %s FOR UPDATE",
                              (DOWNSTREAM, stack.museum))
        edited_a, deleted_a = stack.repo.edit(5), stack.repo.delete(2)
        run_a = harvest(stack)
        wait_success(stack, dag_id, run_a["dag_run_id"])
        _wait_blocked(stack, "feed_positions")

        # Run B applies meanwhile: its changes are written, numbered, but held uncommitted.
        feed_lock.execute("SELECT 1 FROM partner_feed WHERE partner_id = %s FOR UPDATE", (stack.museum,))
        edited_b, added_b = stack.repo.edit(4), stack.repo.add(3)
        run_b = harvest(stack)
        _wait_blocked(stack, "partner_feed")

        consumer_lock.commit()  # A's export runs now, while B's apply is in flight
        downstream_run_of(stack, run_a["dag_run_id"])
        feed_lock.commit()  # B commits
        wait_success(stack, dag_id, run_b["dag_run_id"])
        downstream_run_of(stack, run_b["dag_run_id"])
    finally:
        consumer_lock.close()
        feed_lock.close()

    new = [p for p in export_files(stack) if p not in before]
    extra_a, extra_b = harvest_event(stack, run_a["dag_run_id"]), harvest_event(stack, run_b["dag_run_id"])
    assert [range_of(p) for p in new] == [
        (extra_a["change_seq_after"], extra_a["change_seq_until"]),
        (extra_b["change_seq_after"], extra_b["change_seq_until"]),
    ]
    file_a, file_b = ({(line["op"], line["identifier"]) for line in file_changes(p)} for p in new)
    assert file_a == run_changes(stack, run_key(dag_id, run_a["dag_run_id"]))
    assert file_a == {("upsert", i) for i in edited_a} | {("delete", i) for i in deleted_a}
    assert file_b == run_changes(stack, run_key(dag_id, run_b["dag_run_id"]))
    assert file_b == {("upsert", i) for i in [*edited_b, *added_b]}
    seqs = [line["seq"] for p in export_files(stack) for line in file_changes(p)]
    assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)
