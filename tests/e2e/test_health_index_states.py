"""The health index at 1280 px with a failing, a retrying and an awaiting-approval partner, from a
real Airflow (the shared e2e stack) in Debian's Chromium.

- `e2ebroken` (a closed port, `retries: 0`) fails: `failing`, with its short cause;
- `e2eretrier` (a closed port, `retries: 2`, `retry_delay: 10m`) fails its first try: the alert
  comes at once ("retrying ... attempt 1 of 3 failed", next try in 10 minutes) and the index says
  `retrying` with that cause while Airflow waits;
- `gask` stages a harvest that would shrink it by 30 %: its gate waits, the index says
  `awaiting approval` with a link that opens the request in Airflow's Required Actions.

The index fits the window (no horizontal scroll at 1280 px). The screenshots go to
HARVEST_SCREENSHOTS when set, else a temporary directory the test prints.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.approval_partners import ASK
from tests.support.browser import launched_chromium
from tests.support.e2e_stack import RETRIER, AirflowStack

pytestmark = pytest.mark.e2e
GATE = "approval_gate"
WIDTH = 1280


@pytest.fixture(scope="module")
def airflow_stack(shared_airflow_stack: Any) -> Iterator[AirflowStack]:
    """The stack this module shares with test_airflow_services.py and test_approval_gates_e2e.py."""
    yield shared_airflow_stack.get()


def run_state(stack: AirflowStack, dag_id: str, run_id: str) -> str:
    return stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}", timeout=60)["state"]


def task_state(stack: AirflowStack, dag_id: str, run_id: str, task_id: str) -> str | None:
    return stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}", timeout=60)["state"]


def ended(stack: AirflowStack, dag_id: str, run_id: str) -> str | None:
    state = run_state(stack, dag_id, run_id)
    return state if state in ("success", "failed") else None


def test_the_index_shows_failing_retrying_and_awaiting_approval_at_1280px(airflow_stack: AirflowStack) -> None:
    stack = airflow_stack
    alerts = stack.approval.alerts
    repo, _ = stack.approval.repos[ASK]
    broken, retrier, ask = f"harvest_{stack.broken}", f"harvest_{RETRIER}", f"harvest_{ASK}"
    first = stack.trigger(ask, {"mode": "incremental"})["dag_run_id"]  # its baseline (nothing held: no gate)
    failed = stack.trigger(broken, {"mode": "incremental"})["dag_run_id"]
    triggered = time.monotonic()
    retried = stack.trigger(retrier, {"mode": "incremental"})["dag_run_id"]

    def retry_alert() -> dict[str, Any] | None:
        return next((b for b in list(alerts.bodies) if b["harvest"].get("kind") == "retrying"
                     and b["harvest"].get("partner") == RETRIER), None)

    alert = stack.poll(retry_alert, 180, f"the retry alert of {RETRIER}")
    first_alert_s = time.monotonic() - triggered
    assert alert["text"].startswith(f"[partner harvest] {RETRIER}: {retrier}.freeze_window retrying: connection "
                                    "refused at 127.0.0.1:"), alert["text"]
    assert "(attempt 1 of 3 failed)" in alert["text"] and "next try in 10m" in alert["text"]
    print(f"\nfirst alert of {RETRIER} (options.http.retries 0): {first_alert_s:.1f} s after the trigger")
    assert stack.poll(lambda: task_state(stack, retrier, retried, "freeze_window") == "up_for_retry", 120,
                      f"{retrier} to wait for its retry")
    assert stack.poll(lambda: ended(stack, broken, failed), 180, f"{broken} to fail") == "failed"
    assert stack.poll(lambda: ended(stack, ask, first), 300, f"{ask}'s first harvest") == "success"

    repo.delete(30)  # tombstones for 30 %: over its 10 % max_shrink_fraction
    waiting = stack.trigger(ask, {"mode": "incremental"})["dag_run_id"]
    stack.poll(lambda: task_state(stack, ask, waiting, GATE) == "awaiting_input", 300, f"{ask} to wait at its gate")

    shots = Path(os.environ.get("HARVEST_SCREENSHOTS") or stack.workdir / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    print(f"health index screenshots: {shots}")
    try:
        with launched_chromium() as chromium:
            page = chromium.new_context(viewport={"width": WIDTH, "height": 900}).new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{stack.base_url}/partner-health/")
            page.wait_for_selector("table#partners")

            def row(partner: str) -> Any:
                return page.locator(f'tr[data-partner="{partner}"]')

            assert {p: row(p).get_attribute("data-state") for p in (stack.broken, RETRIER, ASK)} == {
                stack.broken: "failing", RETRIER: "retrying", ASK: "awaiting approval"}
            assert row(stack.broken).locator(".cause").inner_text().startswith("connection refused at 127.0.0.1:")
            cause = row(RETRIER).locator(".cause").inner_text()
            assert cause.startswith("connection refused at 127.0.0.1:") and \
                "(freeze_window, attempt 1 of 3 failed; next try in 10m" in cause, cause
            assert "approve a shrinking harvest? 30 of 100 records" in row(ASK).locator(".cause").inner_text()
            link = row(ASK).locator("a.approval-link")
            assert link.get_attribute("href") == f"/dags/{ask}/runs/{waiting}/tasks/{GATE}/required_actions"
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= WIDTH, f"the index is {width} px wide in a {WIDTH} px window"
            page.screenshot(path=str(shots / "index-1280.png"))

            link.click()  # the request itself in Airflow's Required Actions, not a 404 page
            page.get_by_text("approve a shrinking harvest?").first.wait_for()
            page.screenshot(path=str(shots / "required-action.png"))
    finally:  # leave the shared stack's runs ended: the gate rejected, the retries stopped
        stack.api("PATCH", f"/dags/{ask}/dagRuns/{waiting}/taskInstances/{GATE}/-1/hitlDetails",
                  json={"chosen_options": ["Reject"], "params_input": {}}, timeout=120)
        stack.api("PATCH", f"/dags/{retrier}/dagRuns/{retried}", json={"state": "failed"}, timeout=60)
        stack.poll(lambda: ended(stack, ask, waiting), 300, f"{ask}'s rejected run to end")
