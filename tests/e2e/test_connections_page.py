"""The partner connection types on Airflow's own Connections page, in a real headless Chromium.

An api-server alone (no scheduler: nothing runs) with the package's entry points
(tests/support/provider.py): Airflow lists the provider `partner-harvest`, and the
React UI's "Add Connection" offers "OAI-PMH partner" and "Sierra ILS partner" with their
fields (relabelled host, the TLS and proxy fields, for OAI-PMH the credential fields).
A Connection saved from the form is read by the partner hooks into the endpoint the
harvest uses. Screenshots go to a temporary directory the test prints.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from partner_harvest.airflow import hooks
from tests.support.airflow_stack import (
    DISCARD_WAIT,
    AirflowServices,
    Keys,
    airflow_settings,
    create_database,
    drop_database,
    free_loopback_port,
)
from tests.support.browser import launched_chromium
from tests.support.e2e_stack import base_env
from tests.support.provider import package_metadata

pytestmark = pytest.mark.e2e
STARTUP_TIMEOUT = 240
BROWSER_TIMEOUT_MS = 120_000


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
        cleanup.callback(stack.stop, DISCARD_WAIT)
        stack.start()
        stack.wait_healthy(STARTUP_TIMEOUT)
        yield stack


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as chromium:
        yield chromium


def test_airflow_lists_the_provider(api_server: AirflowServices) -> None:
    """What `airflow providers list` prints, from the api-server's ProvidersManager (the REST
    API: no second Airflow process started for it)."""
    listed = {p["package_name"]: p for p in api_server.api("GET", "/providers", params={"limit": 100})["providers"]}
    assert listed["partner-harvest"]["version"] == "0.1.0"
    assert "partner connection types" in listed["partner-harvest"]["description"]


def _choose_type(page: Any, label: str) -> None:  # a playwright Page
    """The Connection Type select (a searchable combobox): type its name, pick the option."""
    page.get_by_role("combobox").first.click()
    page.keyboard.type(label)
    page.get_by_role("option", name=label, exact=True).click()


def _visible_labels(page: Any) -> set[str]:
    return {t.replace("*", "").strip() for t in page.locator("label:visible").all_inner_texts() if t.strip()}


def test_add_connection_offers_both_partner_types_with_their_fields(
        api_server: AirflowServices, browser: Any, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    shots = Path(os.environ.get("HARVEST_SCREENSHOTS") or tmp_path_factory.mktemp("connections_page_screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    print(f"\nconnections page screenshots: {shots}")
    ca = tmp_path / "museum-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    page.set_default_timeout(BROWSER_TIMEOUT_MS)  # the UI's bundle is large; a busy machine is slow
    page.set_default_navigation_timeout(BROWSER_TIMEOUT_MS)
    try:
        # OAI-PMH: the base URL (relabelled host), the credentials, the TLS and proxy fields
        page.goto(f"{api_server.base_url}/connections")
        page.get_by_role("button", name="Add Connection").click()
        _choose_type(page, "OAI-PMH partner")
        base_url = page.get_by_placeholder("https://museum.example/oai (the URL before ?verb=)")
        base_url.wait_for()
        labels = _visible_labels(page)
        assert {"Base URL", "Login (HTTP Basic)", "Secret (password, token or key)"} <= labels, labels
        assert not {"Host", "Login", "Password", "Schema", "Port"} & labels, labels
        page.get_by_role("textbox", name="Connection ID").fill("partner_museum")
        base_url.fill("https://museum.example/oai")
        page.get_by_role("button", name="Extra Fields", exact=True).click()  # the provider's fields
        page.locator("input[name=element_verify]").wait_for()
        assert {"CA bundle", "Client certificate", "Client key file", "Proxy", "Credential form",
                "Credential header", "Credential query parameter"} <= _visible_labels(page)
        assert "system's CAs" in page.get_by_text("Path, on every worker, of the partner's CA bundle").inner_text()
        page.locator("input[name=element_verify]").fill(str(ca))
        page.screenshot(path=str(shots / "oai_pmh_form.png"), full_page=True)
        page.get_by_role("button", name="Save").click()
        saved = api_server.poll(lambda: _connection(api_server, "partner_museum"), 120, "the saved connection")
        assert (saved["conn_type"], saved["host"], saved["login"]) == ("oai_pmh", "https://museum.example/oai", None)
        # The fields left empty are saved as null: the hooks read them as unset (system CAs, no proxy).
        assert hooks.transport_extra(json.loads(saved["extra"])) == {"verify": str(ca)}, saved["extra"]

        # Sierra: the API base URL, the client key and secret
        page.goto(f"{api_server.base_url}/connections")
        page.get_by_role("button", name="Add Connection").click()
        _choose_type(page, "Sierra ILS partner")
        page.get_by_placeholder("https://catalogue.example/iii/sierra-api (before /v6/...)").wait_for()
        labels = _visible_labels(page)
        page.screenshot(path=str(shots / "sierra_form.png"), full_page=True)
        assert {"API base URL", "Client key", "Client secret"} <= labels and "Host" not in labels, labels
    except Exception:
        (shots / "failed.html").write_text(page.content())
        page.screenshot(path=str(shots / "failed.png"), full_page=True)
        raise
    finally:
        context.close()
    assert sorted(p.name for p in shots.iterdir()) == ["oai_pmh_form.png", "sierra_form.png"]


def _connection(stack: AirflowServices, conn_id: str) -> dict | None:
    response = stack.http.get(f"{stack.base_url}/api/v2/connections/{conn_id}", timeout=10)
    return response.json() if response.status_code == 200 else None
