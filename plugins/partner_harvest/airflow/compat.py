"""Work-arounds for known bugs of the Airflow releases we support, each with its upstream link.

apache/airflow#73428 (3.3.2): ``dag.test()`` / ``airflow dags test`` of a DAG that has a
deadline crashes after a successful run: its in-memory serialized DAG holds the encoded
alerts where the scheduler's copy holds their ids, and the deadline lookup then queries
the database with a dict. Operators run ``airflow dags test`` on partner DAGs (and the demo
does), so every partner DAG, which carries a run deadline, would end in a traceback. The
patch answers such a lookup the way the fix proposed upstream (apache/airflow#73430) does,
and leaves every other lookup (the scheduler's, by id) to Airflow.
"""

from __future__ import annotations

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
            return SimpleNamespace(reference_class=DeadlineAlertModel.reference_class.fget(reference))
        return original(deadline_alert_id, *args, **kwargs)

    get_by_id._partner_harvest_compat = True  # type: ignore[attr-defined]
    DeadlineAlertModel.get_by_id = get_by_id  # type: ignore[method-assign]
    return True
