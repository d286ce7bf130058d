"""``airflow dags test <dag_id>`` with the workaround for apache/airflow#73428 (3.3.2).

``dag.test()`` of a DAG with a deadline crashes after a *successful* run (its in-memory
serialized DAG holds the encoded alerts where the scheduler's holds their ids), leaving the
run "running" and the command failing. Decode them the way the scheduler's lookup answers
(the fix proposed upstream in apache/airflow#73430; tests/dags/conftest.py does the same),
then run Airflow's own CLI. Drop this file when Airflow ships the fix.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace


def patch_deadline_lookup() -> None:
    from airflow.models.deadline_alert import DeadlineAlert as DeadlineAlertModel

    original = DeadlineAlertModel.get_by_id

    def get_by_id(deadline_alert_id, *args, **kwargs):
        if isinstance(deadline_alert_id, dict):
            data = deadline_alert_id.get("__var", deadline_alert_id)
            reference = SimpleNamespace(reference=data["reference"])
            return SimpleNamespace(reference_class=DeadlineAlertModel.reference_class.fget(reference))
        return original(deadline_alert_id, *args, **kwargs)

    DeadlineAlertModel.get_by_id = get_by_id


if __name__ == "__main__":
    patch_deadline_lookup()
    from airflow.__main__ import main

    sys.argv = ["airflow", "dags", "test", *sys.argv[1:]]
    main()
