"""The approval gates in a real Airflow (scheduler, api-server,
dag-processor; no triggerer), answered through the REST API v2 like an operator's client.

- a reconcile over its purge limit waits in Required Actions (task ``awaiting_input``, no
  pool slot held) while another partner's harvest runs; Approve applies exactly what it staged;
- a shrinking full harvest waits; Reject leaves records, cursor, ``harvest_runs`` as they were;
- a wait past ``approval_timeout`` alerts (the scheduler's timeout sweep): ``wait`` keeps
  waiting, ``abandon`` abandons the run cleanly.

Its partners (tests/support/approval_partners.py: one simulator each, alerts read back from
a loopback webhook) are in the registry of the stack it shares with test_airflow_services.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import requests

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from partner_harvest.store.db import one, scalar
from tests.support.approval_partners import ABANDON, OTHER, PARTNERS, PURGE, SHRINK, WAIT
from tests.support.e2e_stack import AirflowStack
from tests.support.webhook import WebhookSink

if TYPE_CHECKING:
    from tests.e2e.conftest import SharedStack

pytestmark = pytest.mark.e2e

GATE = "approval_gate"
SCHEDULER_SAW_EXIT = "TaskInstance Finished: dag_id={dag_id}, task_id={task_id}, run_id={run_id},"


@pytest.fixture(scope="module")
def airflow_stack(shared_airflow_stack: SharedStack) -> Iterator[AirflowStack]:
    """The stack this module shares with test_airflow_services.py (tests/e2e/conftest.py), whose
    registry holds this module's partners; their first harvests here."""
    stack = shared_airflow_stack.get()
    # Every partner's first harvest (all at once): nothing held yet, so every gate passes.
    runs = {pid: stack.trigger(f"harvest_{pid}", {"mode": "incremental"})["dag_run_id"] for pid in PARTNERS}
    for pid, run_id in runs.items():
        assert_success(stack, f"harvest_{pid}", run_id)
    yield stack


@pytest.fixture(scope="module")
def repos(airflow_stack: AirflowStack) -> dict[str, tuple[SimulatedRepository, OaiSimulator]]:
    return airflow_stack.approval.repos


@pytest.fixture(scope="module")
def alerts(airflow_stack: AirflowStack) -> WebhookSink:
    return airflow_stack.approval.alerts


# ---------------------------------------------------------------------- helpers
def get(stack: AirflowStack, path: str, **kwargs: Any) -> Any:
    """A GET of the REST API that a busy api-server may answer late (its single worker also
    serves the task runners' Execution API): a read timeout is asked again."""
    for _ in range(3):
        try:
            return stack.api("GET", path, timeout=60, **kwargs)
        except requests.Timeout:
            continue
    return stack.api("GET", path, timeout=60, **kwargs)


def assert_success(stack: AirflowStack, dag_id: str, run_id: str) -> dict[str, str | None]:
    def finished() -> dict[str, Any] | None:
        run = get(stack, f"/dags/{dag_id}/dagRuns/{run_id}")
        return run if run["state"] in ("success", "failed") else None

    done = stack.poll(finished, 300, f"run {dag_id}/{run_id} to finish")
    states = {ti["task_id"]: ti["state"]
              for ti in get(stack, f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]}
    assert done["state"] == "success", states
    return states


def gate_path(dag_id: str, run_id: str) -> str:
    return f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{GATE}/-1"


def wait_awaiting_input(stack: AirflowStack, dag_id: str, run_id: str, parks: int = 1) -> dict[str, Any]:
    """The gate's task instance once it is parked in Required Actions (for the ``parks``-th
    time) and the scheduler has handled the exit of the process that parked it.

    An answer (or a deadline) resumes the gate into a new process of the same try. Had the
    scheduler not yet seen the parking process's exit, it would take that exit for the new
    process's and mark the resumed gate failed ("killed externally"): on a slow host a 2 s
    deadline did just that. The scheduler logs each exit it handled, so the wait is for that line."""

    def parked() -> dict[str, Any] | None:
        ti = get(stack, gate_path(dag_id, run_id))
        if ti["state"] in ("success", "failed", "skipped", "upstream_failed"):
            raise AssertionError(f"the gate finished without waiting: {stack.task_summary(dag_id, run_id)}")
        return ti if ti["state"] == "awaiting_input" else None

    ti = stack.poll(parked, 300, f"{dag_id}/{run_id} to wait at {GATE}")
    seen = re.escape(SCHEDULER_SAW_EXIT.format(dag_id=dag_id, task_id=GATE, run_id=run_id))
    stack.poll(lambda: len(re.findall(seen, stack.logs["scheduler"].read_text(errors="replace"))) >= parks, 120,
               f"the scheduler to handle the exit of {dag_id}/{run_id} {GATE} parking (park {parks})")
    return ti


def pass_deadline(stack: AirflowStack, dag_id: str, run_id: str) -> None:
    """Move the parked gate's response deadline (``approval_timeout`` after it parked) into the
    past: the scheduler's timeout sweep then acts on it as at the real deadline."""
    with psycopg.connect(stack.metadata_db, autocommit=True) as meta:
        moved = meta.execute(
            "UPDATE task_instance SET trigger_timeout = now() - interval '1 second' WHERE dag_id = %s"
            " AND run_id = %s AND task_id = %s AND state = 'awaiting_input' AND trigger_timeout IS NOT NULL",
            (dag_id, run_id, GATE)).rowcount
    assert moved == 1, f"{dag_id}/{run_id}: no parked {GATE} with a deadline"


def answer(stack: AirflowStack, dag_id: str, run_id: str, option: str) -> dict[str, Any]:
    """What an operator's client does: PATCH the HITL detail of the parked gate."""
    return stack.api("PATCH", f"{gate_path(dag_id, run_id)}/hitlDetails",
                     json={"chosen_options": [option], "params_input": {}}, timeout=120)


def records(stack: AirflowStack, partner: str) -> list[tuple]:
    with connect(stack.aggregation_db) as conn:
        return conn.execute("SELECT identifier, content_hash, datestamp, run_id FROM records WHERE partner_id = %s ORDER BY 1",
                            (partner,)).fetchall()


def held(stack: AirflowStack, partner: str) -> set[str]:
    with connect(stack.aggregation_db) as conn:
        ensure_schema(conn)
        return live_identifiers(conn, partner)


def request_row(stack: AirflowStack, dag_id: str, run_id: str) -> tuple:
    with connect(stack.aggregation_db) as conn:
        return one(conn.execute("SELECT state, decided_by, held, removals, absent FROM approval_requests "
                            "WHERE run_id = %s", (f"{dag_id}/{run_id}",)))


def run_statuses(stack: AirflowStack, dag_id: str, run_id: str) -> set[str]:
    with connect(stack.aggregation_db) as conn:
        return {row[0] for row in conn.execute("SELECT status FROM harvest_runs WHERE run_id = %s",
                                               (f"{dag_id}/{run_id}",))}


def staged_rows(stack: AirflowStack, partner: str) -> int:
    with connect(stack.aggregation_db) as conn:
        return scalar(conn.execute("SELECT count(*) FROM staging WHERE partner_id = %s", (partner,)))


def alerts_of(sink: WebhookSink, kind: str, partner: str) -> list[dict[str, Any]]:
    return [b["harvest"] for b in list(sink.bodies) if b["harvest"].get("kind") == kind
            and b["harvest"].get("partner") == partner]


# ---------------------------------------------------------------------- the tests
def test_a_reconcile_over_its_limit_waits_holding_no_slot_and_approve_applies_exactly(
        airflow_stack: AirflowStack, repos: dict[str, tuple[SimulatedRepository, OaiSimulator]], alerts: WebhookSink) -> None:
    stack = airflow_stack
    repo, _ = repos[PURGE]
    gone = set(repo.delete(20))  # 20% vanish: over the 5% max_purge_fraction
    before = held(stack, PURGE)
    dag_id = f"reconcile_{PURGE}"
    run_id = stack.trigger(dag_id, {})["dag_run_id"]
    wait_awaiting_input(stack, dag_id, run_id)

    detail = get(stack, f"{gate_path(dag_id, run_id)}/hitlDetails")
    assert "20 of 100 records (20.0%, limit 5%)" in detail["subject"]
    assert PURGE in detail["body"] and "Required action" in detail["body"]
    assert detail["options"] == ["Approve", "Reject"] and not detail["response_received"]
    assert alerts_of(alerts, "approval_requested", PURGE)
    # Waiting holds no slot: neither the partner's pool nor the default pool (the gate's) counts it.
    for pool in (f"partner_{PURGE}", "default_pool"):
        slots = get(stack, f"/pools/{pool}")
        assert (slots["running_slots"], slots["occupied_slots"], slots["queued_slots"]) == (0, 0, 0), slots
    assert held(stack, PURGE) == before  # nothing applied yet

    # Another partner's night proceeds meanwhile.
    repos[OTHER][0].edit(5)
    other = stack.trigger(f"harvest_{OTHER}", {"mode": "incremental"})["dag_run_id"]
    assert set(assert_success(stack, f"harvest_{OTHER}", other).values()) == {"success"}
    assert get(stack, gate_path(dag_id, run_id))["state"] == "awaiting_input"

    answered = answer(stack, dag_id, run_id, "Approve")
    assert answered["chosen_options"] == ["Approve"]
    states = assert_success(stack, dag_id, run_id)
    assert states == {"reconcile": "success", GATE: "success", "apply_reconcile": "success"}
    assert held(stack, PURGE) == before - gone == repo.live_identifiers()
    state, decided_by, held_n, removals, _ = request_row(stack, dag_id, run_id)
    assert (state, held_n, removals) == ("applied", 100, 20) and decided_by
    assert staged_rows(stack, PURGE) == 0


def test_a_shrinking_full_harvest_waits_and_reject_leaves_mirror_and_cursor(
        airflow_stack: AirflowStack, repos: dict[str, tuple[SimulatedRepository, OaiSimulator]]) -> None:
    stack = airflow_stack
    repo, _ = repos[SHRINK]
    repo.delete(30)  # tombstones for 30%: over the 10% max_shrink_fraction
    dag_id = f"harvest_{SHRINK}"
    mirror, cursor = records(stack, SHRINK), stack.variable(f"harvest_cursor__{SHRINK}")
    assert cursor is not None
    run_id = stack.trigger(dag_id, {"mode": "full"})["dag_run_id"]
    wait_awaiting_input(stack, dag_id, run_id)
    assert "30 of 100 records (30.0%, limit 10%)" in get(stack, f"{gate_path(dag_id, run_id)}/hitlDetails")[
        "subject"]

    answer(stack, dag_id, run_id, "Reject")
    states = assert_success(stack, dag_id, run_id)  # a rejected run ends with its apply skipped, not failed
    assert states[GATE] == "success" and states["apply_changes"] == "skipped"
    assert states["advance_cursor"] == "skipped"
    assert records(stack, SHRINK) == mirror
    assert stack.variable(f"harvest_cursor__{SHRINK}") == cursor
    assert run_statuses(stack, dag_id, run_id) == {"abandoned"}
    state, decided_by, *_ = request_row(stack, dag_id, run_id)
    assert state == "rejected" and decided_by
    assert staged_rows(stack, SHRINK) == 0


def test_a_wait_past_its_deadline_alerts_and_keeps_waiting_or_abandons(airflow_stack: AirflowStack,
                                                                       repos: dict[str, tuple[SimulatedRepository, OaiSimulator]],
                                                                       alerts: WebhookSink) -> None:
    stack = airflow_stack
    runs = {}
    mirrors = {}
    for pid in (WAIT, ABANDON):
        repos[pid][0].delete(30)
        mirrors[pid] = records(stack, pid)
        runs[pid] = stack.trigger(f"harvest_{pid}", {"mode": "incremental"})["dag_run_id"]
    for pid in (WAIT, ABANDON):
        dag_id = f"harvest_{pid}"
        wait_awaiting_input(stack, dag_id, runs[pid])
        assert not alerts_of(alerts, "approval_overdue", pid)  # before its deadline: no overdue alert
        pass_deadline(stack, dag_id, runs[pid])

    # abandon: the scheduler answers Reject at the deadline; the run is abandoned cleanly.
    dag_id = f"harvest_{ABANDON}"
    states = assert_success(stack, dag_id, runs[ABANDON])
    assert states[GATE] == "success" and states["apply_changes"] == "skipped"
    overdue = alerts_of(alerts, "approval_overdue", ABANDON)
    assert len(overdue) == 1 and overdue[0]["action"] == "abandon"
    assert records(stack, ABANDON) == mirrors[ABANDON]
    assert run_statuses(stack, dag_id, runs[ABANDON]) == {"abandoned"}
    assert request_row(stack, dag_id, runs[ABANDON])[:2] == ("abandoned", None)

    # wait: the alert, then the request is still open and the task parked again.
    dag_id = f"harvest_{WAIT}"
    stack.poll(lambda: alerts_of(alerts, "approval_overdue", WAIT), 120, "the overdue alert of the waiting partner")
    wait_awaiting_input(stack, dag_id, runs[WAIT], parks=2)  # parked again, now without a deadline
    detail = get(stack, f"{gate_path(dag_id, runs[WAIT])}/hitlDetails")
    assert not detail["response_received"]
    assert request_row(stack, dag_id, runs[WAIT])[0] == "pending"
    assert len(alerts_of(alerts, "approval_overdue", WAIT)) == 1  # once, not every sweep
    answer(stack, dag_id, runs[WAIT], "Reject")  # still answerable after the deadline
    assert_success(stack, dag_id, runs[WAIT])
    assert records(stack, WAIT) == mirrors[WAIT]
    assert request_row(stack, dag_id, runs[WAIT])[0] == "rejected"
