"""Airflow's side of the ``partner-harvest`` command line: Variables, pools, the Connection.

It uses Airflow's core models in-process, as ``airflow variables`` and ``airflow pools``
do, so it runs where the Airflow CLI runs (same ``AIRFLOW_HOME``/configuration, access to
the metadata database and the secrets backend). Never imported by tasks or DAG files.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.models.connection import Connection
from airflow.models.pool import Pool
from airflow.models.variable import Variable

from partner_harvest.airflow.connections import AGGREGATION_CONN_ID, conninfo_from_connection


def aggregation_conninfo(conn_id: str = AGGREGATION_CONN_ID) -> str:
    """The aggregation database from the Connection (environment, secrets backend or metastore)."""
    return conninfo_from_connection(Connection.get_connection_from_secrets(conn_id))


def read_variable(key: str) -> Any | None:
    """The Variable's value (JSON decoded when it is JSON), or None when it does not exist."""
    raw = Variable.get(key, default_var=None)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def write_variable(key: str, value: dict[str, Any], description: str) -> None:
    Variable.set(key, value, description=description, serialize_json=True)


def delete_variable(key: str) -> bool:
    """Delete from the metadata database; True when a row was removed."""
    return bool(Variable.delete(key))


def pool_exists(name: str) -> bool:
    return Pool.get_pool(name) is not None


def delete_pool(name: str) -> bool:
    if not pool_exists(name):
        return False
    Pool.delete_pool(name)
    return True


# Task states of a run that has not finished: working, waiting between tries, or queued.
_NOT_DONE = ("running", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "deferred", "restarting")


def unfinished_dag_runs(dag_ids: list[str]) -> list[dict[str, Any]]:
    """The DAG runs of ``dag_ids`` that are queued or running: their state, whether their
    window was frozen (``freeze_window`` succeeded: planned at the epoch before a command's
    bump) and their unfinished tasks with states (what ``forget``/``reset-cursor`` report)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    found: list[dict[str, Any]] = []
    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id.in_(dag_ids),
                                                    DagRun.state.in_(("queued", "running")))).all()
        for run in runs:
            tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == run.dag_id,
                                                             TaskInstance.run_id == run.run_id)).all()
            states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in tis}
            waiting = sorted(f"{ti.task_id}{'' if ti.map_index < 0 else f'[{ti.map_index}]'} "
                             f"{getattr(ti.state, 'value', ti.state)}"
                             for ti in tis if str(getattr(ti.state, "value", ti.state)) in _NOT_DONE)
            found.append({"dag_id": run.dag_id, "run_id": run.run_id, "state": str(getattr(run.state, "value", run.state)),
                          "frozen": states.get("freeze_window") == "success", "tasks": waiting})
    return found


def connection_base_url(conn_id: str) -> str | None:
    """The partner Connection's base URL as ``connections.partner_endpoint`` builds it (core
    models: the CLI and the api-server are not tasks); None when it cannot be read. Only
    the URL: the login, password and extras stay in the Connection."""
    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except Exception:  # AirflowNotFoundException, a secrets backend down: the report goes without it
        return None
    host = (conn.host or "").strip()
    if not host:
        return None
    if "://" in host:
        return host
    return f"{conn.schema or 'https'}://{host}{':' + str(conn.port) if conn.port else ''}"


def pause_dags(dag_ids: list[str]) -> list[str]:
    """Pause those of ``dag_ids`` that run; returns the ones paused now."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select, update

    with create_session() as session:
        running = list(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids),
                                                                     DagModel.is_paused.is_(False))))
        if running:
            session.execute(update(DagModel).where(DagModel.dag_id.in_(running)).values(is_paused=True))
    return sorted(running)
