"""Airflow's check for a busy row lock, under psycopg 3, against a lock PostgreSQL really holds.

Airflow 3.3.2 reads psycopg 2's ``pgcode``: under psycopg 3 (``postgresql+psycopg://``, as in
airflow.cfg.example) its scheduler exits with ``LockNotAvailable`` where it should skip one
loop. ``config/airflow_local_settings.py`` installs ``compat.recognise_psycopg3_lock_errors``.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import airflow.jobs.scheduler_job_runner as scheduler_job_runner
import airflow.utils.sqlalchemy as airflow_sqlalchemy
import psycopg
import pytest
import sqlalchemy
from sqlalchemy.exc import OperationalError

from partner_harvest.airflow import compat

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SETTINGS = ROOT / "config" / "airflow_local_settings.py"


def error_of(db: str, statement: str, *, hold_lock: bool) -> OperationalError:
    """The error SQLAlchemy raises, over psycopg 3, for ``statement`` on row 1 of a table
    another session has locked (``hold_lock``) or not."""
    engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(db))
    try:
        with psycopg.connect(db, autocommit=True) as holder:
            holder.execute("CREATE TABLE IF NOT EXISTS lock_probe (id int PRIMARY KEY)")
            holder.execute("INSERT INTO lock_probe VALUES (1) ON CONFLICT DO NOTHING")
            with holder.transaction():
                if hold_lock:
                    holder.execute("SELECT id FROM lock_probe WHERE id = 1 FOR UPDATE")
                with engine.connect() as other, pytest.raises(OperationalError) as caught:
                    other.execute(sqlalchemy.text(statement))
    finally:
        engine.dispose()
    return caught.value


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> Callable[[BaseException], bool]:
    """Airflow's own check, bound where the scheduler reads it; both restored afterwards."""
    original = inspect.unwrap(airflow_sqlalchemy.is_lock_not_available_error)  # installed earlier in this process?
    monkeypatch.setattr(airflow_sqlalchemy, "is_lock_not_available_error", original)
    monkeypatch.setattr(scheduler_job_runner, "is_lock_not_available_error", original)
    return original


def test_a_busy_row_lock_is_recognised_under_psycopg3_once_installed(db: str, unpatched: Callable[[BaseException], bool]) -> None:
    busy = error_of(db, "SELECT id FROM lock_probe WHERE id = 1 FOR UPDATE NOWAIT", hold_lock=True)
    assert getattr(busy.orig, "sqlstate", None) == "55P03"
    assert not unpatched(busy)  # Airflow 3.3.2's own check misses it: the scheduler would exit
    assert compat.recognise_psycopg3_lock_errors() is True
    assert airflow_sqlalchemy.is_lock_not_available_error(busy)
    assert scheduler_job_runner.is_lock_not_available_error(busy)  # the name the scheduler imported
    installed = airflow_sqlalchemy.is_lock_not_available_error
    assert compat.recognise_psycopg3_lock_errors() is True and airflow_sqlalchemy.is_lock_not_available_error is installed


def test_a_blocked_import_in_sys_modules_does_not_stop_the_install(
        unpatched: Callable[[BaseException], bool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "airflow.partner_harvest_blocked", None)  # how an import is blocked
    assert compat.recognise_psycopg3_lock_errors() is True


def test_other_operational_errors_are_still_errors(db: str, unpatched: Callable[[BaseException], bool]) -> None:
    compat.recognise_psycopg3_lock_errors()
    cancelled = error_of(db, "SET statement_timeout = 1; SELECT pg_sleep(1)", hold_lock=False)
    assert getattr(cancelled.orig, "sqlstate", None) == "57014"  # query_canceled: an OperationalError too
    assert not airflow_sqlalchemy.is_lock_not_available_error(cancelled)


def test_an_airflow_that_reads_sqlstate_itself_is_left_alone(
        unpatched: Callable[[BaseException], bool], monkeypatch: pytest.MonkeyPatch) -> None:
    def fixed_upstream(error: BaseException) -> bool:
        return getattr(getattr(error, "orig", None), "sqlstate", None) == "55P03" or unpatched(error)

    monkeypatch.setattr(airflow_sqlalchemy, "is_lock_not_available_error", fixed_upstream)
    assert compat.recognise_psycopg3_lock_errors() is False
    assert airflow_sqlalchemy.is_lock_not_available_error is fixed_upstream


@pytest.mark.slow  # starts each Airflow process once
def test_every_airflow_process_installs_it_from_airflow_home_config(tmp_path: Path) -> None:
    """The deployment route: the shipped file in $AIRFLOW_HOME/config, imported by Airflow at start."""
    (tmp_path / "config").mkdir()
    shutil.copy(LOCAL_SETTINGS, tmp_path / "config" / "airflow_local_settings.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))}
    env.update(AIRFLOW_HOME=str(tmp_path), PYTHONPATH=str(ROOT / "plugins"))
    env.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
    probe = ("import airflow.settings, airflow.utils.sqlalchemy as u, airflow.jobs.scheduler_job_runner as s;"
             "print(getattr(u.is_lock_not_available_error, '_partner_harvest_compat', False),"
             " getattr(s.is_lock_not_available_error, '_partner_harvest_compat', False),"
             " 'recognise_psycopg3_lock_errors' in vars(airflow.settings))")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "False"]  # installed; no name copied into Airflow's settings
