"""The one work-around for an Airflow bug this project still needs (docs/design/airflow-surface.md).

apache/airflow#73428 (3.3.x): ``dag.test()`` / ``airflow dags test`` of a DAG that has a
deadline crashes after a successful run: its in-memory serialized DAG holds the encoded
alerts where the scheduler's copy holds their ids, and the deadline lookup then queries
the database with a dict. Operators run ``airflow dags test`` on partner DAGs (and the demo
does), so every partner DAG, which carries a run deadline, would end in a traceback. The
patch answers such a lookup the way the fix proposed upstream (apache/airflow#73430) does.

Guarded by the behaviour itself, not by a version: it acts only on an argument Airflow's own
lookup cannot take (a dict), and hands every other lookup (the scheduler's, by id) to
Airflow unchanged. tests/dags/test_run_deadline.py has the test that fails once Airflow's
``dag.test()`` stops passing encoded alerts: then this module goes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def tolerate_encoded_deadline_alerts() -> bool:
    """Install the patch once; True when it is (or already was) installed."""
    from airflow.models.deadline_alert import DeadlineAlert as DeadlineAlertModel

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
