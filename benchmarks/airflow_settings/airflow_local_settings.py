"""Airflow local settings of the slice_pool benchmark's stack (its services get this folder on PYTHONPATH).

Airflow 3.3.2 tells a lock it could not take (``SELECT ... FROM slot_pool ... NOWAIT`` in
the scheduler's critical section) by ``error.orig.pgcode == "55P03"``, psycopg 2's
attribute. Under psycopg 3 (``postgresql+psycopg://``, what this project runs) ``pgcode``
is None and the code is ``sqlstate``, so a busy pool row is not recognised and the
scheduler exits with ``LockNotAvailable`` instead of skipping one loop (it did once, in
an early run of this benchmark). This shim recognises ``sqlstate`` too, and says so in
the service's log each time it does.
"""

from __future__ import annotations

import logging
import sys

import airflow.utils.sqlalchemy as _sqlalchemy_utils

_log = logging.getLogger("slice_pool.lock_shim")
_original = _sqlalchemy_utils.is_lock_not_available_error


def is_lock_not_available_error(error):  # type: ignore[no-untyped-def]
    if getattr(getattr(error, "orig", None), "sqlstate", None) == "55P03":
        _log.warning("slice_pool lock shim: psycopg 3 LockNotAvailable recognised (%s)", str(error.orig)[:120])
        return True
    return _original(error)


_sqlalchemy_utils.is_lock_not_available_error = is_lock_not_available_error
for _name in ("airflow.jobs.scheduler_job_runner", "airflow.dag_processing.manager", "airflow.models.backfill"):
    if _name in sys.modules:  # imported before these settings: rebind their own name too
        sys.modules[_name].is_lock_not_available_error = is_lock_not_available_error
