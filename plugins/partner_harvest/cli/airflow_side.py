"""Reaching Airflow from the command line, or saying in one line why not and what to do.

The commands that need Variables, pools or the Connection run Airflow's models in-process;
a wrong environment would otherwise end in a traceback (Airflow's default SQLite database
in a fresh ``AIRFLOW_HOME``, an asyncpg URL Airflow derives from a psycopg one) and leave a
stray SQLite file behind. Imports Airflow only when a command asks for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

LOCAL_UI_HINT = 'for the local UI\'s Airflow run `eval "$(bash scripts/airflow_ui.sh env)"` first'
SYNC_URL_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
ASYNC_URL_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"


class AirflowUnreachable(Exception):
    """Airflow cannot be used here; the message names the cause and the fix."""


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")


def configured() -> bool:
    """An Airflow is configured in this environment (without importing it: importing writes a
    default airflow.cfg into a fresh AIRFLOW_HOME)."""
    return bool(os.environ.get(SYNC_URL_ENV)) or (airflow_home() / "airflow.cfg").exists()


def admin(purpose: str) -> ModuleType:
    """``partner_harvest.airflow.admin`` once Airflow's metadata database is known to be usable."""
    _check_async_twin()
    try:
        from partner_harvest.airflow import admin as module
    except ImportError as exc:
        if getattr(exc, "name", None) == "asyncpg":
            raise AirflowUnreachable(_async_message()) from None
        raise AirflowUnreachable(f"{purpose} needs Airflow in this environment ({exc}); run it where the "
                                 f"Airflow CLI runs, or {LOCAL_UI_HINT}") from None
    _check_metadata_database()
    return module


def _async_message() -> str:
    return (f"Airflow derives its async metadata URL as postgresql+asyncpg from {SYNC_URL_ENV}, and asyncpg is "
            f"not installed: set {ASYNC_URL_ENV} to the same postgresql+psycopg URL ({LOCAL_UI_HINT})")


def _check_async_twin() -> None:
    url = os.environ.get(SYNC_URL_ENV, "")
    if url.startswith(("postgresql+psycopg:", "postgresql+psycopg2:", "postgresql:")) and not os.environ.get(ASYNC_URL_ENV):
        from importlib.util import find_spec

        if find_spec("asyncpg") is None:  # what Airflow would import for the derived URL
            raise AirflowUnreachable(_async_message())


def _check_metadata_database() -> None:
    """A SQLite metadata database that does not exist, or was never migrated, is the wrong Airflow."""
    from airflow.configuration import conf

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
