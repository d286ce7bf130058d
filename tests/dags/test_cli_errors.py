"""`partner-harvest` in a wrong Airflow environment: one line naming the cause and the fix,
no traceback, and no stray SQLite file (`AIRFLOW_HOME=.airflow-ui partner-harvest
sync-pools --check` once printed ~40 lines ending in `no such table: slot_pool`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(home: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HARVEST_"))}
    env.update({"AIRFLOW_HOME": str(home), "PYTHONPATH": str(ROOT / "plugins"), **extra})
    return subprocess.run([sys.executable, "-m", "partner_harvest.cli", *argv], env=env, cwd=home,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # runs the airflow command line
def test_an_unreachable_airflow_api_is_named_in_one_line_and_leaves_no_database(tmp_path: Path) -> None:
    """sync-pools goes through Airflow's REST API: with no api-server at the URL, one line names
    the URL, the call and the variable to set; nothing is written into the fresh AIRFLOW_HOME."""
    from tests.support.airflow_stack import free_loopback_port

    url = f"http://127.0.0.1:{free_loopback_port()}"
    done = cli(tmp_path, "sync-pools", "--check", "--registry", str(ROOT / "include" / "partners.yaml"),
               HARVEST_AIRFLOW_API_URL=url)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert f"Airflow's API at {url} is unreachable" in lines[0] and "HARVEST_AIRFLOW_API_URL" in lines[0]
    assert "GET /api/v2/pools" in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "airflow.db").exists()
