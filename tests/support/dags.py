"""What the DAG tests (``dag.test()`` in this process) share: a partner's DAG ready to run,
its task states, its cursor Variables."""

from __future__ import annotations

from datetime import datetime, timedelta
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


def get_cursor(partner_id: str, channel: str | None = None) -> Any:
    """The cursor Variable's JSON (a dict), or None when the partner has none."""
    from airflow.models import Variable

    return Variable.get(cursor_key(partner_id, channel), default_var=None, deserialize_json=True)


def dag_test_as(dag: Any, when: datetime, run_type: str) -> Any:
    """``dag.test()`` creates a manual run; make it a run of ``when`` of another type instead
    (``"scheduled"``: the scheduler's; ``"backfill"``: a backfill's), as the scheduler or
    ``airflow backfill`` would create it."""
    import airflow.models.dagrun as dagrun_module
    import pytest
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    kind = {"scheduled": DagRunType.SCHEDULED, "backfill": DagRunType.BACKFILL_JOB}[run_type]

    def typed_run(*, dag: Any, run_id: str, logical_date: datetime, data_interval: Any, run_after: datetime,
                  conf: Any, triggered_by: Any, triggering_user_name: Any, start_date: Any, session: Any) -> Any:
        from airflow.models import DagRun

        for old in session.query(DagRun).filter(DagRun.dag_id == dag.dag_id, DagRun.logical_date == logical_date):
            session.delete(old)  # an earlier session's run of the same day (as dag.test does)
        session.commit()
        return dag.create_dagrun(
            run_id=f"{kind.value}__{when.isoformat()}", logical_date=logical_date, data_interval=data_interval,
            run_after=run_after, conf=conf, run_type=kind, state=DagRunState.RUNNING,
            triggered_by=triggered_by, triggering_user_name=triggering_user_name, start_date=start_date,
            session=session,
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dagrun_module, "get_or_create_dagrun", typed_run)
        return dag.test(logical_date=when, run_after=when)
