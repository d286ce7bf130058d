"""Reaching Airflow's metadata database from ``partner-harvest status``, or saying in one line
why not and what to do.

``status`` reads the DAG runs as the health page does (``airflow/health/source.py``); a
wrong environment would otherwise end in a traceback (Airflow's default SQLite database in
a fresh ``AIRFLOW_HOME``) and leave a stray SQLite file behind. Imports Airflow only when
asked. The other commands go through the REST API (``airflow/api.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

LOCAL_UI_HINT = 'for the local UI\'s Airflow run `eval "$(bash scripts/airflow_ui.sh env)"` first'
SYNC_URL_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"


class AirflowUnreachable(Exception):
    """Airflow cannot be used here; the message names the cause and the fix."""


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")


def configured() -> bool:
    """An Airflow is configured in this environment (without importing it: importing writes a
    default airflow.cfg into a fresh AIRFLOW_HOME)."""
    return bool(os.environ.get(SYNC_URL_ENV)) or (airflow_home() / "airflow.cfg").exists()


def admin(purpose: str) -> ModuleType:
    """``partner_harvest.airflow.health.source`` once Airflow's metadata database is known to be usable."""
    try:
        from partner_harvest.airflow.health import source as module
    except ImportError as exc:
        raise AirflowUnreachable(f"{purpose} needs Airflow in this environment ({exc}); run it where the "
                                 f"Airflow CLI runs, or {LOCAL_UI_HINT}") from None
    _check_metadata_database()
    return module


def _check_metadata_database() -> None:
    """A SQLite metadata database that does not exist, or was never migrated, is the wrong Airflow."""
    from airflow.sdk import conf

    url = conf.get("database", "sql_alchemy_conn")
    if not url.startswith("sqlite"):
        return
    path = Path(url.split(":///", 1)[-1].split("?", 1)[0])
    if not path.exists() or path.stat().st_size == 0:
        raise AirflowUnreachable(
            f"Airflow's metadata database here is {url}, which does not exist: AIRFLOW_HOME={airflow_home()} is "
            f"not a configured Airflow (its settings may live only in its services' environment); {LOCAL_UI_HINT}, "
            "elsewhere run where the Airflow CLI runs")
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'slot_pool'").fetchone() is None:
            raise AirflowUnreachable(
                f"Airflow's metadata database {url} has no Airflow tables: run `airflow db migrate` there, or point "
                f"AIRFLOW_HOME at the Airflow you mean ({LOCAL_UI_HINT})")
