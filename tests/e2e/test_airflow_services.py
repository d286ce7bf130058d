"""Harvest DAGs run by a real scheduler, dag-processor and api-server (REST API v2 only).

What ``dag.test()`` cannot show: the scheduler's run types (a backfill's data intervals
become windows), task processes talking to the Execution API (the cursor Variable), a
failed task's alert leaving the worker as real mail, and a run whose pool was never
created alerting at its deadline instead of waiting silently.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

from partner_harvest.store import connect, ensure_schema
from tests.support.e2e_stack import POOLLESS

if TYPE_CHECKING:
    from tests.e2e.conftest import SharedStack
    from tests.support.e2e_stack import AirflowStack
    from tests.support.smtp_sink import ReceivedMail

# The stack starts in the first test's setup and runs wait up to 180 s each: above pytest.ini's 120 s.
from partner_harvest.store.db import one
from tests.support.db import held as held_in

pytestmark = pytest.mark.e2e

OAI_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
ROOT = Path(__file__).resolve().parents[2]
NOTIFIERS = ROOT / "plugins" / "partner_harvest" / "airflow" / "notifiers.py"


@pytest.fixture(scope="module")
def airflow_stack(shared_airflow_stack: SharedStack) -> AirflowStack:
    """The stack this module shares with test_approval_gates_e2e.py (tests/e2e/conftest.py):
    its partners are this module's, ``POOLLESS`` among them from the first parse."""
    return shared_airflow_stack.get()


@pytest.fixture(scope="module", autouse=True)
def poolless_run(airflow_stack: AirflowStack) -> Iterator[dict]:
    """Trigger partner ``POOLLESS``'s DAG from a thread as soon as the module starts (once the
    API lists it), so its one-minute deadline runs out while the other tests run (its test
    checks the alert last). The thread uses a session of its own: ``requests.Session`` is not
    shared across threads."""
    stack = airflow_stack
    dag_id = f"harvest_{POOLLESS}"
    outcome: dict = {"dag_id": dag_id}
    session = requests.Session()
    session.headers.update(stack.http.headers)

    def parsed() -> bool:
        try:
            return session.get(f"{stack.base_url}/api/v2/dags/{dag_id}", timeout=30).status_code == 200
        except requests.RequestException:  # a busy api-server: ask again
            return False

    def trigger_once_parsed() -> None:
        try:
            deadline = time.monotonic() + 180
            while not parsed():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"timed out after 180s waiting for DAG {dag_id} to be parsed")
                time.sleep(0.5)
            outcome["pool_status"] = session.get(
                f"{stack.base_url}/api/v2/pools/partner_{POOLLESS}", timeout=30).status_code
            response = session.post(f"{stack.base_url}/api/v2/dags/{dag_id}/dagRuns", timeout=30, json={
                "dag_run_id": f"e2e__poolless_{uuid.uuid4().hex[:10]}",
                "logical_date": datetime.now(timezone.utc).isoformat(), "conf": {"mode": "incremental"}})
            response.raise_for_status()
            outcome["run"] = response.json()
        except Exception as exc:  # the test reports it
            outcome["error"] = exc

    thread = threading.Thread(target=trigger_once_parsed, name="poolless-trigger", daemon=True)
    thread.start()
    outcome["thread"] = thread
    yield outcome
    thread.join(timeout=30)
    session.close()


def held(stack: AirflowStack) -> set[str]:
    return held_in(stack.aggregation_db, stack.museum)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def test_triggered_incremental_run_lands_the_partner_and_moves_the_cursor(airflow_stack: AirflowStack) -> None:
    stack = airflow_stack
    dag_id, cursor_key = f"harvest_{stack.museum}", f"harvest_cursor__{stack.museum}"
    run = stack.trigger(dag_id, {"mode": "incremental"})
    done = stack.wait_for_run(dag_id, run["dag_run_id"], timeout=180)
    assert done["state"] == "success", stack.task_summary(dag_id, run["dag_run_id"])
    assert done["run_type"] == "manual"

    assert held(stack) == stack.repo.live_identifiers()
    cursor = stack.variable(cursor_key)
    assert cursor is not None, f"Variable {cursor_key} was not written"
    assert cursor["until"] == stack.repo.clock.strftime(OAI_SECONDS)
    assert cursor["run_id"] == run["dag_run_id"]


def test_backfill_harvests_the_day_of_each_run_as_a_window_and_keeps_the_cursor(
    airflow_stack: AirflowStack,
) -> None:
    stack = airflow_stack
    dag_id, cursor_key = f"harvest_{stack.museum}", f"harvest_cursor__{stack.museum}"
    cursor_before = stack.variable(cursor_key)
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    # Daily 02:00 ticks in [today-3d, today-1d]: two or three runs, all in the past.
    backfill = stack.api("POST", "/backfills", json={
        "dag_id": dag_id,
        "from_date": (today - timedelta(days=3)).isoformat(),
        "to_date": (today - timedelta(days=1)).isoformat(),
        "max_active_runs": 1,
        "reprocess_behavior": "none",
        "run_backwards": False,
    })

    def completed() -> dict | None:
        state = stack.api("GET", f"/backfills/{backfill['id']}")
        return state if state["completed_at"] else None

    stack.poll(completed, 240, f"backfill {backfill['id']} to complete")

    runs = stack.api("GET", f"/dags/{dag_id}/dagRuns", params={"run_type": "backfill"})["dag_runs"]
    assert 2 <= len(runs) <= 3, runs
    assert {r["state"] for r in runs} == {"success"}, [
        (r["dag_run_id"], r["state"], stack.task_summary(dag_id, r["dag_run_id"])) for r in runs]
    intervals = {r["dag_run_id"]: (instant(r["data_interval_start"]), instant(r["data_interval_end"]))
                 for r in runs}
    assert all(end - start == timedelta(days=1) for start, end in intervals.values()), intervals

    with connect(stack.aggregation_db) as conn:
        rows = conn.execute(
            "SELECT split_part(run_id, '/', 2), mode, window_from, window_until, status FROM harvest_runs"
            " WHERE partner_id = %s AND channel = 'changes' AND run_id = ANY(%s)",
            (stack.museum, [f"{dag_id}/{run_id}" for run_id in intervals]),
        ).fetchall()
    harvested = {run_id: (mode, start, until, status) for run_id, mode, start, until, status in rows}
    # Each run harvests the UTC day of its date (the end of its data interval: its 02:00 tick), not the
    # data interval itself (the day before the date in its name).
    days = {run_id: end.replace(hour=0, minute=0, second=0, microsecond=0) for run_id, (_, end) in intervals.items()}
    assert harvested == {run_id: ("window", day, day + timedelta(days=1), "applied") for run_id, day in days.items()}
    assert stack.variable(cursor_key) == cursor_before


def test_failed_harvest_task_sends_an_alert_email(airflow_stack: AirflowStack) -> None:
    stack = airflow_stack
    partner, dag_id = stack.broken, f"harvest_{stack.broken}"
    task = stack.api("GET", f"/dags/{dag_id}/tasks/freeze_window")
    assert task["retries"] == 0, (
        f"the registry's 'retries: 0' for {partner} is not honoured by the DAG factory "
        f"(freeze_window has retries={task['retries']}); the run would wait out retry delays")

    run = stack.trigger(dag_id, {"mode": "incremental"})
    done = stack.wait_for_run(dag_id, run["dag_run_id"], timeout=120)
    assert done["state"] == "failed"
    assert stack.task_states(dag_id, run["dag_run_id"])["freeze_window"] == "failed"

    def names_the_failure(mail: ReceivedMail) -> bool:
        return all(word in mail.text for word in (partner, dag_id, "freeze_window"))

    mail = stack.sink.wait_for(names_the_failure, timeout=60)
    assert mail is not None, (
        f"no alert naming {partner}, {dag_id} and freeze_window reached the SMTP sink; "
        f"received subjects: {[m.subject for m in stack.sink.messages]}; "
        f"{NOTIFIERS.relative_to(ROOT)} {'exists' if NOTIFIERS.exists() else 'does not exist yet'}")
    assert "ops@example.org" in mail.rcpt_tos
    assert mail.mail_from == "airflow@harvest.example"
    assert re.search(r"(try|attempt)\D{0,20}\b1\b", mail.text, re.IGNORECASE), (
        f"the alert does not name the try number:\n{mail.text}")


def test_clearing_a_task_reruns_it_with_the_same_frozen_window(airflow_stack: AirflowStack) -> None:
    stack = airflow_stack
    dag_id = f"harvest_{stack.museum}"
    run_id = stack.trigger(dag_id, {"mode": "window", "from": "2000-01-01T00:00:00Z"})["dag_run_id"]
    assert stack.wait_for_run(dag_id, run_id, timeout=180)["state"] == "success"

    def audit() -> tuple:
        with connect(stack.aggregation_db) as conn:
            return one(conn.execute(
                "SELECT window_from, window_until, attempts, fetched FROM harvest_runs"
                " WHERE partner_id = %s AND run_id = %s AND channel = 'changes'",
                (stack.museum, f"{dag_id}/{run_id}")))

    window_from, window_until, attempts, fetched = audit()
    stack.repo.advance_clock(3600)  # the partner's clock moves on; the frozen window must not
    moved = stack.repo.edit(3)  # re-stamped after the frozen until: outside the window now
    stack.api("POST", f"/dags/{dag_id}/clearTaskInstances", json={
        "dag_run_id": run_id, "task_ids": ["harvest_changes"], "include_downstream": True,
        "only_failed": False, "dry_run": False, "reset_dag_runs": True,
    })

    def rerun_finished() -> tuple | None:
        row = audit()
        return row if row[2] == attempts + 1 and stack.api(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"] in ("success", "failed") else None

    again = stack.poll(rerun_finished, 180, f"cleared harvest_changes of {run_id} to run again")
    assert stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"] == "success"
    assert again == (window_from, window_until, attempts + 1, fetched - len(moved))  # same frozen bounds


def _process_of(ti_id: str) -> int | None:
    """The PID of the task runner Airflow titled ``airflow worker -- <ti id>``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"airflow worker -- {ti_id}" in cmdline:
            return int(proc.name)
    return None


def test_a_task_killed_with_sigkill_frees_its_partner_within_the_lease_ttl(airflow_stack: AirflowStack) -> None:
    """No failure callback runs after SIGKILL (the task goes up for retry);
    the lease still ends within its TTL, and the weekly reconcile then runs."""
    import os
    import signal
    import time

    from tests.support.e2e_stack import LEASE_TTL_SECONDS

    stack = airflow_stack
    dag_id = f"harvest_{stack.museum}"
    # The next request waits 55 s inside the task: under options.http.max_wait_in_task (60 s),
    # so it is slept in the worker slot (a longer wait would reschedule the task instead).
    stack.simulator.fail_next(1, status=503, retry_after=55)
    run_id = stack.trigger(dag_id, {"mode": "full"})["dag_run_id"]

    def lease_holders() -> list[str]:
        with connect(stack.aggregation_db) as conn:
            ensure_schema(conn)
            return [r[0] for r in conn.execute(
                "SELECT holder FROM partner_leases WHERE partner_id = %s AND expires_at > now()",
                (stack.museum,)).fetchall()]

    def stalled_task() -> tuple[str, int] | None:
        try:
            tis = stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        except AssertionError:  # the API server may answer 500 while the run is being created
            return None
        for ti in tis:
            if ti["state"] == "running" and lease_holders():
                pid = _process_of(ti["id"])
                if pid:
                    return ti["task_id"], pid
        return None

    task_id, pid = stack.poll(stalled_task, 120, f"a task of {run_id} to run and hold the lease")
    assert lease_holders() == [f"{dag_id}/{run_id}"]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    stack.poll(lambda: not lease_holders() or None, LEASE_TTL_SECONDS + 20, "the dead task's lease to end")
    freed_after = time.monotonic() - killed
    assert freed_after <= LEASE_TTL_SECONDS + 3, freed_after

    reconcile = f"reconcile_{stack.museum}"
    rec_id = stack.trigger(reconcile, {})["dag_run_id"]
    assert stack.wait_for_run(reconcile, rec_id, timeout=180)["state"] == "success", \
        stack.task_summary(reconcile, rec_id)
    state = stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")["state"]
    assert state in ("up_for_retry", "failed", "scheduled", "queued", "running"), state
    stack.api("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": "failed"})  # leave no run behind


def test_a_run_whose_pool_is_missing_alerts_at_its_deadline(airflow_stack: AirflowStack, poolless_run: dict) -> None:
    """A partner whose pool was never created does not wait silently: its run deadline sends
    an alert email. Its run was triggered by ``poolless_run`` when the module started."""
    stack = airflow_stack
    dag_id = poolless_run["dag_id"]
    poolless_run["thread"].join(timeout=200)
    assert not poolless_run["thread"].is_alive(), f"DAG {dag_id} was not triggered\n{stack.diagnostics()}"
    if "error" in poolless_run:
        raise AssertionError(f"triggering {dag_id} failed\n{stack.diagnostics()}") from poolless_run["error"]
    assert poolless_run["pool_status"] == 404
    assert stack.http.get(f"{stack.base_url}/api/v2/pools/partner_{POOLLESS}", timeout=30).status_code == 404
    run = poolless_run["run"]

    def overdue(mail: ReceivedMail) -> bool:
        return "not finished" in mail.subject and run["dag_run_id"] in mail.text

    mail = stack.sink.wait_for(overdue, timeout=240)
    assert mail is not None, (f"no overdue alert; received {[m.subject for m in stack.sink.messages]}\n"
                              f"{stack.diagnostics()}")
    assert f"pool partner_{POOLLESS} exists" in mail.text and dag_id in mail.subject
    # Nothing ran: the tasks still wait for the pool.
    states = stack.task_states(dag_id, run["dag_run_id"])
    assert states.get("freeze_window") in (None, "scheduled"), states
