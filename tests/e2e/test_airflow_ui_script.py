"""scripts/airflow_ui.sh, the recipe of docs/operator/local-ui.md for a local Airflow with its UI: it starts,
the API answers, the partner DAGs are listed, and it stops everything on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
import requests
from psycopg import sql

from tests.support.airflow_stack import ROOT, three_free_ports, wait_for

pytestmark = pytest.mark.e2e


def listed_dags(base_url: str) -> set[str] | None:
    try:
        response = requests.get(f"{base_url}/api/v2/dags", params={"limit": 100}, timeout=10)
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    ids = {dag["dag_id"] for dag in response.json()["dags"]}
    return ids if {"harvest_demo", "harvest_demo_library", "reconcile_demo"} <= ids else None


def test_the_ui_script_serves_the_partner_dags_and_stops(pg_server: str, tmp_path: Path) -> None:
    port, prefix = three_free_ports(), f"ui_{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HARVEST_"))}
    env.update({"HARVEST_DATABASE_URL": pg_server, "HARVEST_SKIP_BOOTSTRAP": "1"})
    log = tmp_path / "airflow_ui.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "airflow_ui.sh"), "--port", str(port), "--home", str(tmp_path / "home"),
             "--records", "100", "--db-prefix", prefix],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: "Airflow UI ready at" in log.read_text(), 240, "the ready line", proc, log)
        health = requests.get(f"{base_url}/api/v2/monitor/health", timeout=10).json()
        assert health["scheduler"]["status"] == "healthy" and health["dag_processor"]["status"] == "healthy"
        wait_for(lambda: listed_dags(base_url), 180, "the partner DAGs in the API", proc, log)
        pools = requests.get(f"{base_url}/api/v2/pools", timeout=10).json()["pools"]
        assert {"partner_demo", "partner_demo_library"} <= {pool["name"] for pool in pools}

        proc.send_signal(signal.SIGTERM)  # the script's own process (bash exec'd python)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base_url}/api/v2/monitor/health", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
            proc.wait(timeout=30)
        with psycopg.connect(pg_server, autocommit=True) as admin:
            for name in (f"{prefix}_meta", f"{prefix}_aggregation"):
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
