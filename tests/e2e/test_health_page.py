"""The partner health page in a real headless Chromium against a real api-server.

This module's Airflow runs SimpleAuthManager with a real user and password (not the
all-admins mode of the other e2e modules): the browser is sent to Airflow's login form,
logs in, and lands on the page; then it reads what the page shows for a healthy, a
failing and a behind partner, and opens a partner page with its chart. Screenshots land
in a temporary directory the test prints.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.e2e_stack import AirflowStack

from collections.abc import Iterator
from typing import Any

from tests.support.browser import launched_chromium

pytestmark = pytest.mark.e2e



OPERATOR, PASSWORD = "operator", "harvest-e2e-operator-pw"


@pytest.fixture(scope="module")
def airflow_env_overrides(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A real login: one admin user with a known password, no all-admins middleware."""
    passwords = tmp_path_factory.mktemp("auth") / "passwords.json"
    passwords.write_text(json.dumps({OPERATOR: PASSWORD}))
    return {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{OPERATOR}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("health_page_screenshots")
    print(f"\nhealth page screenshots: {folder}")
    return folder


def runs_to_end(stack: AirflowStack, expected: dict[str, str]) -> dict[str, str]:
    """One incremental run of each partner, all triggered at once (the partners share
    nothing), each ending as expected; their run ids."""
    runs = {partner_id: stack.trigger(f"harvest_{partner_id}", {"mode": "incremental"})["dag_run_id"]
            for partner_id in expected}
    for partner_id, run_id in runs.items():
        dag_id = f"harvest_{partner_id}"
        done = stack.wait_for_run(dag_id, run_id, timeout=180)
        assert done["state"] == expected[partner_id], stack.task_summary(dag_id, run_id)
    return runs


def test_health_page_shows_healthy_failing_and_behind_partners_and_a_partner_chart(
    airflow_stack: AirflowStack, browser: Any, shots: Path,
) -> None:
    stack = airflow_stack
    broken_run = runs_to_end(stack, {stack.museum: "success", stack.lagging: "success",
                                     stack.broken: "failed"})[stack.broken]
    stack.repo.edit_ids(sorted(stack.repo.live_identifiers())[:20])  # then the partner changes
    stack.repo.add(7)
    stack.repo.advance_clock(timedelta(minutes=10))  # past the partner's lag
    museum_run = runs_to_end(stack, {stack.museum: "success"})[stack.museum]

    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    # Not logged in: Airflow's login form first, then back to the page.
    page.goto(f"{stack.base_url}/partner-health/")
    page.wait_for_url("**/auth/login**")
    page.locator("input[name=username]").fill(OPERATOR)
    page.locator("input[name=password]").fill(PASSWORD)
    page.screenshot(path=str(shots / "login.png"))
    page.locator("button[type=submit]").click()
    page.wait_for_url(f"{stack.base_url}/partner-health/**")
    page.wait_for_selector("table#partners")
    page.screenshot(path=str(shots / "health.png"), full_page=True)

    def row(partner_id: str) -> Any:  # a playwright Locator
        return page.locator(f'tr[data-partner="{partner_id}"]')

    states = {p: row(p).get_attribute("data-state") for p in (stack.museum, stack.broken, stack.lagging)}
    # The lagging partner's clock is ten days back: its cursor keeps up with that clock (not
    # "behind"); the page says where its clock stands, and its quarantine rate is a warning.
    assert states == {stack.museum: "ok", stack.broken: "failing", stack.lagging: "warning"}

    museum = row(stack.museum)
    held = len(stack.repo.live_identifiers())
    assert museum.locator("td.held").inner_text() == f"{held:,}"
    assert museum.locator("td.last-night").inner_text() == "27 / 0 / 0"  # 20 edited, 7 added
    assert museum.locator("td.quarantined-now").inner_text() == "0"
    link = museum.locator("td.last-run a.run-link")
    assert link.inner_text() == "applied" and link.get_attribute("title") == f"run {museum_run}"
    assert link.get_attribute("href") == f"/dags/harvest_{stack.museum}/runs/{museum_run}"
    assert museum.locator("td.alerts").inner_text() == "0"

    broken = row(stack.broken)
    assert broken.locator("td.last-run a.run-link").get_attribute("title") == f"run {broken_run}"
    assert "failed" in broken.locator("td.last-run").inner_text()
    cause = broken.locator("td.state-cell .cause").inner_text()  # the task's short cause
    assert cause.startswith("connection refused at 127.0.0.1:") and "(freeze_window, attempt 1 of 1" in cause, cause
    assert broken.locator("td.last-success").inner_text().strip() == "none"

    lagging = row(stack.lagging)
    lag = lagging.locator("td.cursor .lag").inner_text()
    assert re.fullmatch(r"\d+m \d+s|\d+s", lag), lag  # trails its own clock by the run's age only
    assert re.search(r"partner clock .*: (9d 23h|10d) behind ours", lagging.locator("td.cursor").inner_text())
    assert lagging.locator("td.quarantined-now").inner_text() == "4"  # every tenth of 40 is invalid
    assert lagging.locator("td.alerts").inner_text() == "1"  # counted; the finding is in its title
    assert "quarantine rate 10.0%" in lagging.locator("td.alerts span").get_attribute("title")

    # The run link opens the run in the Airflow UI.
    link.click()
    page.wait_for_url(f"**/dags/harvest_{stack.museum}/runs/{museum_run}**")
    page.go_back()

    # The partner page: its summary, the chart of its runs, today's quarantine.
    row(stack.museum).locator("a.partner-link").click()
    page.wait_for_selector("svg.runs-chart")
    assert page.locator("#state").inner_text() == "ok"
    chart = page.locator("svg.runs-chart")
    assert chart.locator("rect.upserted").count() == 2 and chart.locator("rect.duration").count() == 2
    first_held = held - 7
    assert [t.text_content().rsplit(": ", 1)[1] for t in chart.locator("circle title").all()] == [
        f"{first_held} held", f"{held} held"]
    assert page.locator("#quarantine-none").count() == 1
    page.screenshot(path=str(shots / "partner.png"), full_page=True)

    # The lagging partner's page lists today's quarantine with its reasons.
    page.goto(f"{stack.base_url}/partner-health/partner/{stack.lagging}")
    reasons = page.locator("#quarantine-reasons tbody tr")
    assert reasons.count() >= 1
    assert sum(int(n) for n in page.locator("#quarantine-reasons td.num").all_inner_texts()) == 4
    assert page.locator("#quarantine-entries tbody tr").count() == 4
    page.screenshot(path=str(shots / "partner_quarantine.png"), full_page=True)

    # And the page is in Airflow's own navigation (an external view, shown in an iframe).
    page.goto(f"{stack.base_url}/plugin/partner-health")
    frame = page.frame_locator("iframe").first
    frame.locator("table#partners").wait_for()
    page.screenshot(path=str(shots / "in_airflow_ui.png"))
    context.close()
    assert sorted(p.name for p in shots.iterdir()) == ["health.png", "in_airflow_ui.png", "login.png", "partner.png",
                                                           "partner_quarantine.png"]

