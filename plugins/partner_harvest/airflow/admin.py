"""Airflow's side of the ``partner-harvest`` command line: Variables, pools, DAG runs, the
aggregation's Connection.

Variables, pools and DAG runs go through Airflow's stable REST API (``api.py``); the
Connections through the Task SDK, which outside a task reads the environment and the
configured secrets backends. Never imported by tasks or DAG files.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_client import client as airflow_client
from airflow_client.client.exceptions import ApiException

from partner_harvest.airflow import api
from partner_harvest.airflow.connections import AGGREGATION_CONN_ID, conninfo_from_connection
from partner_harvest.factory import Endpoint


def aggregation_conninfo(conn_id: str = AGGREGATION_CONN_ID) -> str:
    """The aggregation database from the Connection (the environment or a secrets backend: the
    REST API never returns a Connection's password)."""
    from airflow.sdk import BaseHook

    return conninfo_from_connection(BaseHook.get_connection(conn_id))


def read_variable(key: str) -> Any | None:
    """The Variable's value (JSON decoded when it is JSON), or None when it does not exist."""
    with api.calling(f"GET /api/v2/variables/{key}"):
        try:
            raw = api.variables().get_variable(key).value
        except ApiException as exc:
            if api.absent(exc):
                return None
            raise
    return _decoded(raw)


def _decoded(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def defined_outside_the_metastore(key: str) -> bool:
    """An ``AIRFLOW_VAR_*`` or a secrets backend defines the Variable (the API cannot delete it)."""
    from airflow.sdk import Variable

    return Variable.get(key, default=None) is not None


def write_variable(key: str, value: dict[str, Any], description: str) -> None:
    body = airflow_client.VariableBody(key=key, value=json.dumps(value), description=description)
    with api.calling(f"PATCH /api/v2/variables/{key}"):
        if read_variable(key) is None:
            api.variables().post_variable(body)
        else:
            api.variables().patch_variable(key, body)


def delete_variable(key: str) -> bool:
    """Delete from the metadata database; True when a row was removed."""
    if read_variable(key) is None:
        return False
    with api.calling(f"DELETE /api/v2/variables/{key}"):
        api.variables().delete_variable(key)
    return True


def pool_exists(name: str) -> bool:
    return name in {p.name for p in api.all_pools()}


def delete_pool(name: str) -> bool:
    if not pool_exists(name):
        return False
    with api.calling(f"DELETE /api/v2/pools/{name}"):
        api.pools().delete_pool(name)
    return True


# Task states of a run that has not finished: working, waiting between tries, or queued.
_NOT_DONE = ("running", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "deferred", "restarting")


def unfinished_dag_runs(dag_ids: list[str]) -> list[dict[str, Any]]:
    """The DAG runs of ``dag_ids`` that are queued or running: their state, whether their
    window was frozen (``freeze_window`` succeeded: planned at the epoch before a command's
    bump) and their unfinished tasks with states (what ``forget``/``reset-cursor`` report)."""
    found: list[dict[str, Any]] = []
    for dag_id in dag_ids:
        with api.calling(f"GET /api/v2/dags/{dag_id}/dagRuns"):
            try:
                runs = api.dag_runs().get_dag_runs(dag_id, state=["queued", "running"], limit=api.PAGE).dag_runs
            except ApiException as exc:
                if not api.absent(exc):  # a DAG not parsed (yet, or any more) has no runs
                    raise
                runs = []
        for run in runs:
            with api.calling(f"GET /api/v2/dags/{dag_id}/dagRuns/{run.dag_run_id}/taskInstances"):
                tis = api.task_instances().get_task_instances(dag_id, run.dag_run_id, limit=api.PAGE).task_instances
            states = {ti.task_id: _state(ti.state) for ti in tis}
            waiting = sorted(f"{ti.task_id}{'' if (ti.map_index or -1) < 0 else f'[{ti.map_index}]'} {_state(ti.state)}"
                             for ti in tis if _state(ti.state) in _NOT_DONE)
            found.append({"dag_id": dag_id, "run_id": run.dag_run_id, "state": _state(run.state),
                          "frozen": states.get("freeze_window") == "success", "tasks": waiting})
    return found


def _state(value: Any) -> str:
    return str(getattr(value, "value", value))


def partner_endpoint(conn_id: str) -> Endpoint:
    """The partner's endpoint with its credentials, as a worker reads it (the environment or a
    secrets backend: the REST API never returns a Connection's password)."""
    from partner_harvest.airflow.connections import partner_endpoint as endpoint

    return endpoint(conn_id)


def connection_base_url(conn_id: str) -> str | None:
    """The partner Connection's base URL as ``connections.partner_endpoint`` builds it, from the
    environment, a secrets backend or (through the API) the metastore; None when it cannot be
    read. Only the URL: the login, password and extras stay in the Connection."""
    from airflow.sdk import BaseHook

    try:
        conn: Any = BaseHook.get_connection(conn_id)
    except Exception:  # not in the environment nor a backend: the metastore, through the API
        try:
            with api.calling(f"GET /api/v2/connections/{conn_id}"):
                conn = api.connections().get_connection(conn_id)
        except Exception:  # a 404, an API down: the report goes without it
            return None
    host = (conn.host or "").strip()
    if not host:
        return None
    if "://" in host:
        return host
    schema = getattr(conn, "schema", None) or getattr(conn, "var_schema", None)
    return f"{schema or 'https'}://{host}{':' + str(conn.port) if conn.port else ''}"


def pause_dags(dag_ids: list[str]) -> list[str]:
    """Pause those of ``dag_ids`` that are unpaused (PATCH /api/v2/dags/{dag_id}); returns them.
    A DAG Airflow has not parsed (yet, or any more) is left out."""
    paused = []
    for dag_id in dag_ids:
        with api.calling(f"GET /api/v2/dags/{dag_id}"):
            try:
                if api.dags().get_dag(dag_id).is_paused:
                    continue
            except ApiException as exc:
                if api.absent(exc):
                    continue
                raise
        with api.calling(f"PATCH /api/v2/dags/{dag_id}"):
            api.dags().patch_dag(dag_id, airflow_client.DAGPatchBody(is_paused=True))
        paused.append(dag_id)
    return paused
