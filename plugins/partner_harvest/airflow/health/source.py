"""Where the health pages read from: the registry file and the ``aggregation_db`` Connection.

The api-server is not a task: it resolves the Connection through Airflow's core secrets
backends (environment, metastore, configured backends), not the Task SDK.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from partner_harvest.airflow.connections import AGGREGATION_CONN_ID
from partner_harvest.registry import Partner, Registry, load_registry, partners_file
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.health import SchedulerRun

_lock = threading.Lock()
_cached: tuple[Path, float, Registry] | None = None
_migrated: set[str] = set()


def registry() -> Registry:
    """The registry, parsed again only when the file changed (500 entries take a while to validate)."""
    global _cached
    path = partners_file()
    mtime = path.stat().st_mtime
    with _lock:
        if _cached and _cached[0] == path and _cached[1] == mtime:
            return _cached[2]
        loaded = load_registry(path)
        _cached = (path, mtime, loaded)
        return loaded


def conninfo(conn_id: str = AGGREGATION_CONN_ID) -> str:
    """libpq conninfo of the Connection (the same fields the harvest tasks use)."""
    from airflow.models.connection import Connection

    conn = Connection.get_connection_from_secrets(conn_id)
    params = {"host": conn.host or None, "port": conn.port or None, "user": conn.login or None,
              "password": conn.password or None, "dbname": conn.schema or None}
    params.update({k: v for k, v in conn.extra_dejson.items() if k in {"sslmode", "options", "connect_timeout"}})
    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


def partner_base_url(conn_id: str) -> str | None:
    """The partner's endpoint for its report (its Connection's host only; None when unreadable)."""
    from partner_harvest.airflow.admin import connection_base_url

    return connection_base_url(conn_id)


def connection() -> psycopg.Connection:
    """A short-lived read connection (used in a ``with`` block, closed after the page)."""
    target = conninfo()
    conn = connect(target)
    if target not in _migrated:  # a page opened before any harvest ran since an upgrade
        ensure_schema(conn)
        _migrated.add(target)
    conn.execute("SET statement_timeout = '30s'")
    return conn


def latest_harvest_runs(partners: list[Partner]) -> dict[str, SchedulerRun]:
    """Each partner's newest harvest DAG run from Airflow's own database (the api-server's,
    or the command line's), with the tasks waiting between tries (up_for_retry,
    up_for_reschedule) and those whose later try is on its way: only the scheduler knows a run
    is between tries."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    by_dag = {p.dag_id: p.id for p in partners}
    if not by_dag:
        return {}
    newest = (select(func.max(DagRun.id)).where(DagRun.dag_id.in_(list(by_dag))).group_by(DagRun.dag_id)
              .scalar_subquery())
    query = select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date).where(
        DagRun.id.in_(newest))
    with create_session() as session:
        rows = session.execute(query).all()
        waiting: dict[tuple[str, str], list[str]] = {}
        retried: dict[tuple[str, str], list[str]] = {}
        unfinished = [(dag_id, run_id) for dag_id, run_id, state, *_ in rows
                      if str(getattr(state, "value", state)) in ("running", "queued")]
        if unfinished:
            tasks = select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.state,
                           TaskInstance.try_number).where(
                TaskInstance.state.in_((*WAITING_STATES, *RETRY_UNDER_WAY)),
                TaskInstance.dag_id.in_([d for d, _ in unfinished]),
                TaskInstance.run_id.in_([r for _, r in unfinished]),
            )
            for dag_id, run_id, task_id, state, try_number in session.execute(tasks).all():
                if str(getattr(state, "value", state)) in WAITING_STATES:
                    waiting.setdefault((dag_id, run_id), []).append(task_id)
                elif (try_number or 0) > 1:
                    retried.setdefault((dag_id, run_id), []).append(task_id)
    return {by_dag[dag_id]: SchedulerRun(dag_id, run_id, str(getattr(state, "value", state)), start, end,
                                         tuple(sorted(set(waiting.get((dag_id, run_id), ())))),
                                         tuple(sorted(set(retried.get((dag_id, run_id), ())))))
            for dag_id, run_id, state, start, end in rows}


WAITING_STATES = ("up_for_retry", "up_for_reschedule")  # between tries (Airflow's TaskInstanceState values)
RETRY_UNDER_WAY = ("scheduled", "queued", "running")  # a later try on its way (try_number > 1)


class ServerSide:
    """Airflow as the api-server reaches it in-process (its own models, its metadata database):
    what a rollback confirmed on the health page needs (rollback.AirflowSide)."""

    @staticmethod
    def read_variable(key: str) -> object | None:
        import json

        from airflow.models.variable import Variable

        raw = Variable.get(key, default_var=None)
        try:
            return json.loads(raw) if raw is not None else None
        except (TypeError, ValueError):
            return raw

    @staticmethod
    def write_variable(key: str, value: dict[str, object], description: str) -> None:
        from airflow.models.variable import Variable

        Variable.set(key, value, description=description, serialize_json=True)

    @staticmethod
    def delete_variable(key: str) -> bool:
        from airflow.models.variable import Variable

        return bool(Variable.delete(key))

    @staticmethod
    def pause_dags(dag_ids: list[str]) -> list[str]:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select, update

        with create_session() as session:
            running = list(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids),
                                                                         DagModel.is_paused.is_(False))))
            if running:
                session.execute(update(DagModel).where(DagModel.dag_id.in_(running)).values(is_paused=True))
        return sorted(running)


def may_edit_dag(user: object, dag_id: str) -> bool:
    """The user may change the DAG (what pausing it in Airflow's UI takes)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return bool(get_auth_manager().is_authorized_dag(method="PUT", details=DagDetails(id=dag_id), user=user))
