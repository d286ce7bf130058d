"""The health index with 10,000 partners in a real headless Chromium.

The health app served by uvicorn on loopback against a real PostgreSQL holding one night of
10,000 partners (tests/support/fleet.py); Airflow's login is left out here (the login is
tested in test_health_page.py). The browser pages forward, sorts by name both ways, filters
by state through the form and by text, and each time reads what the page shows. The
screenshot goes to HARVEST_SCREENSHOT_DIR when set (the branch note's picture), else a
temporary directory.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import fleet
from tests.support.airflow_stack import free_loopback_port
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
N = 10_000


@pytest.fixture
def served(conn: psycopg.Connection, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import uvicorn

    app = fleet.serve_health_app(conn, db, tmp_path, N, monkeypatch)
    port = free_loopback_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()
    while not server.started and thread.is_alive():
        started.wait(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)
    from partner_harvest.airflow.health import app as health_app

    health_app._index_cache.clear()


def _ids(page: Any) -> list[str]:
    return page.eval_on_selector_all("#partners tbody tr", "rows => rows.map(r => r.dataset.partner)")


def _states(page: Any) -> set[str]:
    return set(page.eval_on_selector_all("#partners tbody tr", "rows => rows.map(r => r.dataset.state)"))


def _pager(page: Any) -> str:
    return " ".join(page.inner_text("#pager-top").split())


def test_the_index_pages_sorts_and_filters_10000_partners_in_a_browser(served: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is pinned in requirements-dev.txt")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/bootstrap.sh installs Debian's chromium (apt-get)")
    shots = Path(os.environ.get("HARVEST_SCREENSHOT_DIR") or Path(__import__("tempfile").mkdtemp()))
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(120_000)
        response = page.goto(served + "/")
        assert response is not None and response.ok
        assert len(_ids(page)) == 50 and _states(page) == {"failing"}
        assert _pager(page).startswith("1–50 of 10,000 · page 1 of 200")
        assert "10,000 partners" in page.inner_text("#summary") and "failing 1,000" in page.inner_text("#summary")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # fits the window
        page.screenshot(path=str(shots / "ops-index.png"), full_page=False)
        print(f"\nhealth index screenshot: {shots / 'ops-index.png'}")

        first = _ids(page)
        page.click("#pager-top a.next")
        page.wait_for_url(re.compile(r"page=2"))
        assert _pager(page).startswith("51–100 of 10,000 · page 2 of 200")
        assert not set(_ids(page)) & set(first)

        page.click("#partners th a.sort-name")  # by name, ascending, from page 1
        page.wait_for_url(re.compile(r"sort=name"))
        assert _ids(page)[:2] == ["p00001", "p00002"] and _pager(page).startswith("1–50 of 10,000")
        page.click("#partners th a.sort-name")  # again: descending
        page.wait_for_url(re.compile(r"order=desc"))
        assert _ids(page)[:2] == ["p10000", "p09999"]

        page.select_option("#filters select[name=state]", "failing")
        page.fill("#filters input[name=q]", "p001")
        page.click("#filters button[type=submit]")
        page.wait_for_url(re.compile(r"state=failing"))
        assert _states(page) == {"failing"}
        # failing and "p001" in the id (p00100..p00190), by name descending still
        assert _ids(page) == [fleet.partner_id(i) for i in range(190, 99, -10)]
        assert _pager(page).startswith("1–10 of 10 matching · page 1 of 1")

        page.select_option("#filters select[name=protocol]", "sierra")
        page.select_option("#filters select[name=state]", "")
        page.fill("#filters input[name=q]", "")
        page.click("#filters button[type=submit]")
        page.wait_for_url(re.compile(r"protocol=sierra"))
        assert _pager(page).startswith("1–50 of 2,000 matching")
        assert all(int(p[1:]) % 5 == 0 for p in _ids(page))
        browser.close()
