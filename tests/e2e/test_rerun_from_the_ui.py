"""Rerunning a failed night the way the docs say (operating.md): clear the failed task, or
the failed run, and the rerun applies. Over the REST API and in a real Chromium on the
Airflow UI, on the shared stack (tests/support/e2e_stack.py, partner ``FLAKY``).

A failed run keeps its run deadline (Airflow prunes deadlines only on success), so every
clear of a failed night goes through Airflow's deadline recalculation: with a deadline
anchored on the run's queued-at time, Airflow 3.3 answers that clear with a 500
(docs/design/airflow-surface.md).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.browser import launched_chromium
from tests.support.db import held
from tests.support.e2e_stack import FLAKY, AirflowStack

if TYPE_CHECKING:
    from tests.e2e.conftest import SharedStack

pytestmark = pytest.mark.e2e
DAG_ID = f"harvest_{FLAKY}"
DOWN = 10_000  # answers of 503: more than any run asks while the server is "down"


@pytest.fixture(scope="module")
def airflow_stack(shared_airflow_stack: SharedStack) -> AirflowStack:
    return shared_airflow_stack.get()


@pytest.fixture
def stack(airflow_stack: AirflowStack) -> Iterator[AirflowStack]:
    """The stack with FLAKY's server up again after the test, whatever it left behind."""
    yield airflow_stack
    assert airflow_stack.flaky is not None
    airflow_stack.flaky.fail_next(0)
    airflow_stack.flaky.set_response_delay(0)


def failed_night(stack: AirflowStack, break_server: Callable[[], object]) -> str:
    """A run of FLAKY that failed while ``break_server`` held; the server is mended after."""
    break_server()
    run_id = stack.trigger(DAG_ID, {"mode": "full"})["dag_run_id"]
    assert stack.wait_for_run(DAG_ID, run_id, timeout=180)["state"] == "failed", stack.task_summary(DAG_ID, run_id)
    assert stack.flaky is not None
    stack.flaky.fail_next(0)
    stack.flaky.set_response_delay(0)
    return run_id


def task_try(stack: AirflowStack, run_id: str) -> tuple[str | None, int]:
    """freeze_window's state and try number in the run."""
    ti = stack.task_instance(DAG_ID, run_id, "freeze_window")
    return ti["state"], ti["try_number"]


def applied(stack: AirflowStack, run_id: str) -> None:
    done = stack.wait_for_run(DAG_ID, run_id, timeout=180)
    assert done["state"] == "success", stack.task_summary(DAG_ID, run_id)
    assert stack.flaky is not None
    assert held(stack.aggregation_db, FLAKY) == stack.flaky.repo.live_identifiers()


def test_clearing_the_failed_task_of_a_failed_run_over_rest_reruns_it_and_applies(stack: AirflowStack) -> None:
    flaky = stack.flaky
    assert flaky is not None
    run_id = failed_night(stack, lambda: flaky.fail_next(DOWN, status=503))
    assert stack.task_states(DAG_ID, run_id)["freeze_window"] == "failed"
    cleared = stack.api("POST", f"/dags/{DAG_ID}/clearTaskInstances", json={
        "dag_run_id": run_id, "task_ids": ["freeze_window"], "include_downstream": True,
        "only_failed": False, "dry_run": False, "reset_dag_runs": True,
    })
    assert cleared["total_entries"] >= 1
    applied(stack, run_id)


def test_clearing_a_whole_run_that_failed_by_timeout_reruns_it_and_applies(stack: AirflowStack) -> None:
    flaky = stack.flaky
    assert flaky is not None
    # Every answer takes 40 s: freeze_window outlives FLAKY's 20 s execution_timeout.
    run_id = failed_night(stack, lambda: flaky.set_response_delay(40_000))
    stack.api("POST", f"/dags/{DAG_ID}/dagRuns/{run_id}/clear", json={"dry_run": False, "only_failed": True})
    applied(stack, run_id)


def test_clearing_the_failed_task_in_the_ui_reruns_it_and_applies(stack: AirflowStack) -> None:
    """An operator's night: the partner's server goes down, the run fails, the alert arrives;
    the server is back, the failed task is cleared in the UI (Clear, Confirm), the rerun
    applies and the aggregation equals the partner."""
    flaky = stack.flaky
    assert flaky is not None
    run_id = failed_night(stack, lambda: flaky.fail_next(DOWN, status=503))
    alert = stack.sink.wait_for(lambda mail: run_id in mail.text and "freeze_window" in mail.subject, timeout=120)
    assert alert is not None, f"no alert for {run_id}: {[mail.subject for mail in stack.sink.messages]}"
    failed_at = datetime.fromisoformat(stack.task_instance(DAG_ID, run_id, "freeze_window")["end_date"])
    # The task's own failure handling sends it: it is in the inbox before Airflow records the task's end (< 0).
    print(f"the alert arrived {alert.received_at - failed_at.timestamp():+.1f} s from the task's recorded end: "
          f"{alert.subject}")
    failed_try = task_try(stack, run_id)
    shots = Path(os.environ.get("HARVEST_SCREENSHOTS") or tempfile.mkdtemp(prefix="rerun-ui-"))
    shots.mkdir(parents=True, exist_ok=True)
    with launched_chromium() as chromium:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        authorization = stack.http.headers.get("Authorization", "")
        token = authorization.removeprefix("Bearer ") if isinstance(authorization, str) else ""
        if token:  # a stack with real users: the UI reads the token from its cookie
            page.context.add_cookies([{"name": "_token", "value": token, "url": stack.base_url}])
        page.goto(f"{stack.base_url}/dags/{DAG_ID}/runs/{run_id}/tasks/freeze_window")
        # At 1280 px the task instance's Clear is an icon button, named by its shortcut.
        clear = page.get_by_role("button", name="Press shift+c to clear")
        clear.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "rerun_failed_task.png"), full_page=True)
        clear.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Clear Task Instance").first.wait_for(timeout=30_000)
        page.screenshot(path=str(shots / "rerun_clear_dialog.png"), full_page=True)
        dialog.get_by_role("button", name="Confirm").click()
        dialog.wait_for(state="hidden", timeout=30_000)
        assert page.get_by_text("Failed to clear").count() == 0
        # The dialog may close before the clear reaches the database: wait for the task to leave its failed try.
        stack.poll(lambda: task_try(stack, run_id) != failed_try, 60, "the UI's clear to reset freeze_window")
        applied(stack, run_id)
        page.reload()  # the run as the operator then sees it: every task succeeded
        page.get_by_text("Success").first.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "rerun_applied.png"), full_page=True)
        assert page.get_by_text("Failed", exact=True).count() == 0
    print(f"screenshots: {shots}")
