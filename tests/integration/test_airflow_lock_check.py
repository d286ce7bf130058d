"""Airflow's check for a busy row lock, against a lock PostgreSQL really holds, under the
metadata driver Airflow documents (psycopg2, ``postgresql+psycopg2://``).

The scheduler skips one loop when another process holds a ``slot_pool`` row (``SELECT ...
FOR UPDATE NOWAIT``) and exits on any other error. Airflow 3.3.2 tells the two apart by
psycopg2's ``pgcode``: with the metastore as Airflow documents it no shim is needed (under
psycopg 3 the check misses the code and the scheduler exits; docs/design/airflow-surface.md).
"""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy
from airflow.utils.sqlalchemy import is_lock_not_available_error
from sqlalchemy.exc import OperationalError

from tests.support.airflow_stack import sqlalchemy_url


def error_of(db: str, statement: str, *, hold_lock: bool) -> OperationalError:
    """The error SQLAlchemy raises, over psycopg2, for ``statement`` on row 1 of a table
    another session has locked (``hold_lock``) or not."""
    engine = sqlalchemy.create_engine(sqlalchemy_url(db))
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


def test_airflow_recognises_a_busy_row_lock_under_the_documented_driver(db: str) -> None:
    busy = error_of(db, "SELECT id FROM lock_probe WHERE id = 1 FOR UPDATE NOWAIT", hold_lock=True)
    assert getattr(busy.orig, "pgcode", None) == "55P03"  # psycopg2's error code
    assert is_lock_not_available_error(busy)  # the scheduler skips a loop instead of exiting


def test_other_operational_errors_are_still_errors(db: str) -> None:
    cancelled = error_of(db, "SET statement_timeout = 1; SELECT pg_sleep(1)", hold_lock=False)
    assert getattr(cancelled.orig, "pgcode", None) == "57014"  # query_canceled: an OperationalError too
    assert not is_lock_not_available_error(cancelled)
