"""Work-arounds for known bugs of the Airflow releases we support, each with its upstream link.

apache/airflow#73428 (3.3.2): ``dag.test()`` / ``airflow dags test`` of a DAG that has a
deadline crashes after a successful run: its in-memory serialized DAG holds the encoded
alerts where the scheduler's copy holds their ids, and the deadline lookup then queries
the database with a dict. Operators run ``airflow dags test`` on partner DAGs (and the demo
does), so every partner DAG, which carries a run deadline, would end in a traceback. The
patch answers such a lookup the way the fix proposed upstream (apache/airflow#73430) does,
and leaves every other lookup (the scheduler's, by id) to Airflow.

Airflow 3.3.2 on psycopg 3: ``airflow.utils.sqlalchemy.is_lock_not_available_error`` tells a
row lock another process holds (``SELECT ... FOR UPDATE NOWAIT``, e.g. the scheduler's
``slot_pool`` rows) by psycopg 2's ``pgcode`` or the error's first argument. psycopg 3 puts
the code in ``sqlstate`` and its first argument is the message, so a busy lock is not
recognised and the scheduler (or dag processor) exits with ``LockNotAvailable`` instead of
skipping one loop. ``recognise_psycopg3_lock_errors`` teaches the check ``sqlstate``; it is
installed from ``airflow_local_settings.py`` (config/ in this repository), since the
scheduler never imports a DAG file, and only while Airflow's own check misses the code.
"""

from __future__ import annotations

import functools
import sys
from types import SimpleNamespace
from typing import Any

_FIXED_IN = (3, 3, 3)  # assumed: the first release that may carry the upstream fix


def _version() -> tuple[int, ...]:
    import airflow

    return tuple(int(p) for p in airflow.__version__.split(".")[:3] if p.isdigit())


def tolerate_encoded_deadline_alerts() -> bool:
    """Install the patch once, only on affected releases; True when it is installed."""
    from airflow.models.deadline_alert import DeadlineAlert as DeadlineAlertModel

    if _version() >= _FIXED_IN:
        return False
    if getattr(DeadlineAlertModel.get_by_id, "_partner_harvest_compat", False):
        return True
    original = DeadlineAlertModel.get_by_id

    def get_by_id(deadline_alert_id: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(deadline_alert_id, dict):  # only dag.test's in-memory DAG passes these
            data = deadline_alert_id.get("__var", deadline_alert_id)
            reference = SimpleNamespace(reference=data["reference"])
            reference_class = DeadlineAlertModel.__dict__["reference_class"]  # the property itself
            return SimpleNamespace(reference_class=reference_class.__get__(reference))
        return original(deadline_alert_id, *args, **kwargs)

    get_by_id._partner_harvest_compat = True  # type: ignore[attr-defined]
    DeadlineAlertModel.get_by_id = get_by_id  # type: ignore[method-assign]
    return True


_LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a NOWAIT lock another session holds


def recognise_psycopg3_lock_errors() -> bool:
    """Make Airflow's lock check read psycopg 3's ``sqlstate`` too; True when installed.

    Checks Airflow's own answer first (with the error psycopg 3 raises, wrapped as SQLAlchemy
    wraps it), so a release that reads ``sqlstate`` itself is left alone. Modules that
    imported the function by name (the scheduler, the dag processor, backfills) are rebound.
    """
    import airflow.utils.sqlalchemy as airflow_sqlalchemy
    import psycopg
    from sqlalchemy.exc import OperationalError

    current = airflow_sqlalchemy.is_lock_not_available_error
    if getattr(current, "_partner_harvest_compat", False):
        return True
    busy = OperationalError("SELECT ... FOR UPDATE NOWAIT", None,
                            psycopg.errors.LockNotAvailable("could not obtain lock on row"))
    if current(busy):
        return False

    @functools.wraps(current)  # __wrapped__: Airflow's own check
    def is_lock_not_available_error(error: Any) -> bool:
        if getattr(getattr(error, "orig", None), "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            return True
        return current(error)

    is_lock_not_available_error._partner_harvest_compat = True  # type: ignore[attr-defined]
    airflow_sqlalchemy.is_lock_not_available_error = is_lock_not_available_error
    for name, module in list(sys.modules.items()):
        # The module's own namespace, not getattr: a module's __getattr__ (Airflow's deprecation
        # shims) may import or warn. A None entry (a blocked import) has none.
        namespace = getattr(module, "__dict__", None) or {}
        if name.startswith("airflow.") and namespace.get("is_lock_not_available_error") is current:
            module.is_lock_not_available_error = is_lock_not_available_error  # type: ignore[attr-defined]
    return True
