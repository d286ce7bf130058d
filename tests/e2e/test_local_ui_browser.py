"""The local UI as docs/operator/local-ui.md documents it (scripts/airflow_ui.sh), in a real headless Chromium:
it starts with every service healthy, the demo partners' DAGs and pools; its Home page has no
import error and a healthy triggerer; the IIIF stream partner it lists harvests (its simulator
and Connection are started too); a partner whose endpoint is down fails, and the health
page shows it **failing** with the short cause (the full text on its page); `partner-harvest status`, pointed at that
Airflow by `eval "$(bash scripts/airflow_ui.sh env)"`, prints the same; the alert lands in the
local alert inbox; SIGTERM stops everything. Screenshots go to HARVEST_SCREENSHOTS (or a
temporary directory the test prints).

One start of the script serves all of it (a start is most of this module's time).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
import requests
from psycopg import sql

from tests.support.airflow_stack import ROOT, three_free_ports, wait_for
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.e2e
DOWN = "down"
T = TypeVar("T")


def registry(path: Path, closed_port: int) -> Path:
    """The demo partners and one more whose endpoint is a closed port (fails at once, no retries)."""
    text = (ROOT / "include" / "partners.yaml").read_text(encoding="utf-8").rstrip()
    text += (f"\n\n  - id: {DOWN}\n    protocol: oai-pmh\n    conn_id: partner_{DOWN}\n    metadata_prefix: oai_dc\n"
             "    retries: 0\n    options: {http: {backoff_factor: 0.01, retries: 1}}\n")
    path.write_text(text, encoding="utf-8")
    return path


def answer(ask: Callable[[], T]) -> T | None:
    """``ask()``'s answer, or None when the api-server did not answer in time (a loaded host:
    its one worker also serves the task runners): a poll asks again."""
    try:
        return ask()
    except (requests.Timeout, requests.ConnectionError):
        return None


def listed_dags(api: requests.Session, base_url: str) -> set[str] | None:
    """The DAG ids the API lists, once the demo partners' DAGs are among them."""
    response = answer(lambda: api.get(f"{base_url}/api/v2/dags", params={"limit": 100}, timeout=30))
    if response is None or response.status_code != 200:
        return None
    ids = {dag["dag_id"] for dag in response.json()["dags"]}
    return ids if {"harvest_demo", "harvest_demo_library", "harvest_demo_stream", "reconcile_demo"} <= ids else None


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_local_ui_shows_a_failing_partner_with_its_cause_and_status_agrees(
        pg_server: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is pinned in requirements-dev.txt")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/bootstrap.sh installs Debian's chromium (apt-get)")
    shots = Path(os.environ.get("HARVEST_SCREENSHOTS") or tmp_path_factory.mktemp("local_ui_screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    print(f"\nlocal UI screenshots: {shots}")
    port, prefix = three_free_ports(), f"ui_{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HARVEST_"))}
    env.update({
        "HARVEST_DATABASE_URL": pg_server, "HARVEST_SKIP_BOOTSTRAP": "1",
        "HARVEST_PARTNERS_FILE": str(registry(tmp_path / "partners.yaml", closed_port())),
        "HARVEST_UI_EXTRA_CONNECTIONS": json.dumps(
            {f"partner_{DOWN}": {"conn_type": "http", "host": f"http://127.0.0.1:{closed_port()}/oai"}}),
    })
    script = ["bash", str(ROOT / "scripts" / "airflow_ui.sh")]
    where = ["--port", str(port), "--home", str(home), "--db-prefix", prefix]
    log = tmp_path / "airflow_ui.out"
    with log.open("wb") as out:
        proc = subprocess.Popen([*script, *where, "--records", "100"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    api = requests.Session()
    try:
        wait_for(lambda: "Airflow UI ready at" in log.read_text(), 240, "the ready line", proc, log)
        health = api.get(f"{base_url}/api/v2/monitor/health", timeout=60).json()
        assert {health[s]["status"] for s in ("scheduler", "dag_processor", "triggerer")} == {"healthy"}, health
        dag_id = f"harvest_{DOWN}"
        assert dag_id in wait_for(lambda: listed_dags(api, base_url), 180, "the partner DAGs in the API", proc, log)
        pools = api.get(f"{base_url}/api/v2/pools", timeout=60).json()["pools"]
        assert {"partner_demo", "partner_demo_library", "partner_demo_stream"} <= {pool["name"] for pool in pools}
        assert api.get(f"{base_url}/api/v2/plugins/importErrors", timeout=60).json()["total_entries"] == 0
        runs = {}
        for dag in (dag_id, "harvest_demo_stream"):  # the stream: every demo partner it lists is served
            assert api.patch(f"{base_url}/api/v2/dags/{dag}", json={"is_paused": False}, timeout=60).ok
            runs[dag] = f"e2e__{uuid.uuid4().hex[:8]}"
            assert api.post(f"{base_url}/api/v2/dags/{dag}/dagRuns",
                            json={"dag_run_id": runs[dag], "logical_date": None, "conf": {}}, timeout=60).ok

        def finished(dag: str) -> str | None:
            run = answer(lambda: api.get(f"{base_url}/api/v2/dags/{dag}/dagRuns/{runs[dag]}", timeout=30).json())
            return run["state"] if run and run["state"] in ("success", "failed") else None

        assert wait_for(lambda: finished(dag_id), 240, f"run {runs[dag_id]} to end", proc, log) == "failed"
        assert wait_for(lambda: finished("harvest_demo_stream"), 240, "the stream's first harvest", proc,
                        log) == "success"

        def unfinished(dag: str) -> int | None:
            """Unpausing a DAG within a few hours after its cron tick also starts that tick's
            scheduled run (CronTriggerTimetable): the page shows the newest run's state."""
            listed = answer(lambda: api.get(f"{base_url}/api/v2/dags/{dag}/dagRuns", timeout=30,
                                            params={"state": ["queued", "running"]}).json())
            return None if listed is None else int(listed["total_entries"])

        wait_for(lambda: all(unfinished(dag) == 0 for dag in runs), 240, "every run of the two DAGs to end", proc,
                 log)

        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.goto(f"{base_url}/")
            page.get_by_text("Health").first.wait_for(timeout=60_000)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(shots / "local_ui_home.png"), full_page=True)
            assert page.get_by_text("Import Error").count() == 0, "the Home page shows an import error"
            page.goto(f"{base_url}/partner-health/")
            page.wait_for_selector("table#partners")
            row = page.locator(f'tr[data-partner="{DOWN}"]')
            assert row.get_attribute("data-state") == "failing"
            cause = row.locator(".cause").inner_text()
            assert re.fullmatch(r"connection refused at 127\.0\.0\.1:\d+ \(freeze_window, attempt 1 of 1 failed, "
                                r"the last\)", cause), cause
            states = {p: page.locator(f'tr[data-partner="{p}"]').get_attribute("data-state")
                      for p in ("demo", "demo_library", "demo_stream")}
            assert states == {"demo": "never run", "demo_library": "never run", "demo_stream": "ok"}
            page.screenshot(path=str(shots / "local_ui_health_failing.png"), full_page=True)
            page.goto(f"{base_url}/partner-health/partner/{DOWN}")
            assert page.locator("#state").inner_text() == "failing"
            assert "Connection refused" in page.locator("#cause").inner_text()
            page.screenshot(path=str(shots / "local_ui_partner_failing.png"), full_page=True)
            # port + 3, or any free port when that one was taken: the ready lines name it
            inbox_url = re.search(r"^    alerts: (http://\S+/) and ", log.read_text(), re.M)
            assert inbox_url, log.read_text()[-3000:]
            inbox = page.goto(inbox_url.group(1))
            assert inbox.ok and f"{DOWN}: harvest_{DOWN}.freeze_window failed: connection refused at" in page.inner_text(
                "#alerts")
            page.screenshot(path=str(shots / "local_ui_alert_inbox.png"), full_page=True)
            browser.close()

        # The command line, with the one documented line that points it at this Airflow.
        exports = subprocess.run([*script, "env", *where], env=env, cwd=ROOT, capture_output=True, text=True,
                                 timeout=120, check=True).stdout
        cli_env = {k: v for k, v in env.items() if k != "HARVEST_DATABASE_URL"}  # the Connection, as a user has it
        status = subprocess.run(["bash", "-c", f'{exports}\npartner-harvest status'], env=cli_env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=180)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        row_line = next(line for line in lines[2:] if line.startswith(f"{DOWN} "))
        assert " failing " in row_line, status.stdout
        cause_line = next(line for line in lines if line.startswith(f"{DOWN} failing: "))
        assert cause_line.startswith(f"{DOWN} failing: connection refused at 127.0.0.1:"), cause_line
        assert not any("metadata database not read" in line for line in lines), status.stdout
        (shots / "status.txt").write_text(status.stdout, encoding="utf-8")
        # Without HARVEST_PARTNERS_FILE the script serves the demo registry.
        default = {k: v for k, v in env.items() if k != "HARVEST_PARTNERS_FILE"}
        exports = subprocess.run([*script, "env", *where], env=default, cwd=ROOT, capture_output=True, text=True,
                                 timeout=120, check=True).stdout
        assert f"export HARVEST_PARTNERS_FILE={shlex.quote(str(ROOT / 'include' / 'partners.yaml'))}" in exports.splitlines(), exports

        proc.send_signal(signal.SIGTERM)  # the script's own process (bash exec'd python)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base_url}/api/v2/monitor/health", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        with psycopg.connect(pg_server, autocommit=True) as admin:
            for name in (f"{prefix}_meta", f"{prefix}_aggregation"):
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
