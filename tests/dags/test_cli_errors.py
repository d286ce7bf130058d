"""`partner-harvest` in a wrong Airflow environment: one line naming the cause and the fix,
no traceback, and no stray SQLite file (`AIRFLOW_HOME=.airflow-ui partner-harvest
sync-pools --check` printed ~40 lines ending in `no such table: slot_pool`; with the metadata
URL set but not its async twin it blamed a missing Airflow for `No module named 'asyncpg'`)."""

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
def test_a_fresh_airflow_home_is_named_in_one_line_and_left_without_a_database(tmp_path: Path) -> None:
    done = cli(tmp_path, "sync-pools", "--check", "--registry", str(ROOT / "include" / "partners.yaml"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "does not exist" in lines[0] and 'eval "$(bash scripts/airflow_ui.sh env)"' in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "airflow.db").exists()


@pytest.mark.slow  # runs the airflow command line
def test_a_psycopg_metadata_url_without_its_async_twin_says_so(tmp_path: Path) -> None:
    done = cli(tmp_path, "sync-pools", "--check", "--registry", str(ROOT / "include" / "partners.yaml"),
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg://nobody@127.0.0.1:9/none")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC" in lines[0] and "asyncpg is not installed" in lines[0]
