"""Airflow for DAG tests: a private AIRFLOW_HOME with a migrated metadata DB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the (SQLite) metadata DB once per session; idempotent and a few seconds."""
    env = dict(os.environ)
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


@pytest.fixture(scope="session")
def dagbag(airflow_db: None):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))
