"""What the DAG tests (``dag.test()`` in this process) share: a partner's DAG ready to run,
its task states, its cursor Variables."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from partner_harvest.registry import cursor_key


def build_dag(partner_id: str, retries: int | None = 0, *, harvest_retries: int | None = None,
              retry_delay: timedelta | None = None) -> Any:
    """The partner's harvest DAG from the registry; ``retries`` on every task (None: the
    registry's; 0 by default: dag.test() would otherwise wait out the retry delay),
    ``harvest_retries`` on harvest_changes."""
    from partner_harvest.airflow.dag_factory import build_harvest_dag
    from partner_harvest.registry import get_partner

    dag = build_harvest_dag(get_partner(partner_id))
    for task in dag.tasks:
        if retries is not None:
            task.retries = retries
        if harvest_retries is not None and task.task_id == "harvest_changes":
            task.retries = harvest_retries
        if retry_delay is not None:
            task.retry_delay = retry_delay
    return dag


def task_states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}


def set_cursor(partner_id: str, value: dict | None, channel: str | None = None) -> None:
    """Write (or, with None, delete) the partner's cursor Variable."""
    from airflow.models import Variable

    if value is None:
        Variable.delete(cursor_key(partner_id, channel))
    else:
        Variable.set(cursor_key(partner_id, channel), value, serialize_json=True)


def get_cursor(partner_id: str, channel: str | None = None) -> dict | None:
    from airflow.models import Variable

    return Variable.get(cursor_key(partner_id, channel), default_var=None, deserialize_json=True)
