"""Bring Airflow in line with the registry in one idempotent pass:
``partner-harvest onboard [--connections FILE] [--dry-run]``.

For every valid partner: its pool (``pools.pool_specs``, written only when it differs),
its Connection (from a JSON/YAML file in the shape ``airflow connections export`` writes,
or found in a secrets backend: the environment, the metastore or a configured backend),
its two DAGs unpaused, and a first harvest triggered when it has no cursor, no row in the
aggregation's ``harvest_runs`` and no DAG run at all. Each step decides from what is there
now, so a second pass finds nothing to do and changes nothing. Through Airflow's stable REST
API (``api.py``); a Connection defined in the environment or a secrets backend is found with
the Task SDK. The API never returns a password or a secret extra: a Connection in the
metastore is compared, and updated, by the fields it shows (a changed password alone is
written only with the Connection's next other change, or after deleting it). Never prints a
password or an extra: a Connection is named by id and fields changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from partner_harvest.airflow import api
from partner_harvest.airflow.pools import existing_pools, pool_specs, write_pool
from partner_harvest.registry import Partner, cursor_key

CONNECTION_FIELDS = ("conn_type", "host", "login", "password", "schema", "port", "extra")
SECRET_FIELDS = ("password", "extra")  # changed, not shown


@dataclass
class Step:
    """One thing onboarding did (or, in a dry run, would do), or found already in line."""

    kind: str  # pool | connection | unpause | trigger
    subject: str
    action: str  # create | update | unpause | trigger | ok | missing | wait
    detail: str = ""

    @property
    def changes(self) -> bool:
        return self.action in ("create", "update", "unpause", "trigger")

    def line(self, dry_run: bool) -> str:
        verb = {"create": "create", "update": "update", "unpause": "unpause", "trigger": "trigger"}.get(self.action)
        head = (f"would {verb}" if dry_run else {"create": "created", "update": "updated", "unpause": "unpaused",
                                                 "trigger": "triggered"}[self.action]) if verb else self.action
        return f"{self.kind:<10} {self.subject}: {head}{' (' + self.detail + ')' if self.detail else ''}"


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.changes]


class ConnectionFileError(ValueError):
    """The connections file cannot be used; the message names the file and the entry."""


def read_connections_file(path: Path) -> dict[str, dict[str, Any]]:
    """``{conn_id: {conn_type, host, login, password, schema, port, extra}}`` from JSON or YAML
    (``airflow connections export --file-format json|yaml`` writes this shape); a value may
    also be a Connection URI."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConnectionFileError(f"{path}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConnectionFileError(f"{path}: expected a mapping of Connection id to its fields")
    entries: dict[str, dict[str, Any]] = {}
    for conn_id, value in data.items():
        if isinstance(value, str):
            from airflow.sdk import Connection

            value = _fields(Connection.from_uri(value, conn_id=str(conn_id)))
        if not isinstance(value, dict) or not value.get("conn_type"):
            raise ConnectionFileError(f"{path}: Connection {conn_id!r} needs at least a conn_type")
        unknown = set(value) - set(CONNECTION_FIELDS) - {"description", "conn_id"}
        if unknown:
            raise ConnectionFileError(f"{path}: Connection {conn_id!r} has unknown field(s) {sorted(unknown)}")
        entries[str(conn_id)] = {k: value.get(k) for k in CONNECTION_FIELDS}
    return entries


def _extra(value: Any) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return {"__raw__": value}
        return decoded if isinstance(decoded, dict) else {"__raw__": value}
    return dict(value)


def _fields(conn: Any) -> dict[str, Any]:
    return {"conn_type": conn.conn_type, "host": conn.host, "login": conn.login, "password": conn.password,
            "schema": conn.schema, "port": conn.port, "extra": _extra(conn.extra)}


def _normal(entry: dict[str, Any]) -> dict[str, Any]:
    out = {k: (entry.get(k) if entry.get(k) != "" else None) for k in CONNECTION_FIELDS}
    out["port"] = int(out["port"]) if out["port"] not in (None, "") else None
    out["extra"] = _extra(entry.get("extra"))
    return out


def plan_pools(partners: list[Partner], existing: dict[str, tuple[int, str]]) -> list[Step]:
    steps = []
    for name, slots, description in pool_specs(partners):
        have = existing.get(name)
        if have is None:
            steps.append(Step("pool", name, "create", f"{slots} slot(s)"))
        elif have != (slots, description):
            steps.append(Step("pool", name, "update", f"{have[0]} -> {slots} slot(s)" if have[0] != slots
                              else "description"))
        else:
            steps.append(Step("pool", name, "ok", f"{slots} slot(s)"))
    return steps


def plan_connections(needed: Iterable[str], from_file: dict[str, dict[str, Any]],
                     in_metastore: Callable[[str], dict[str, Any] | None],
                     in_backends: Callable[[str], bool]) -> tuple[list[Step], list[str]]:
    """What the file writes into the metastore (a Connection a secrets backend defines is
    left to the backend, which Airflow reads first), and which needed ones are nowhere."""
    steps, problems = [], []
    for conn_id in sorted(set(needed) | set(from_file)):
        stored = in_metastore(conn_id)
        if conn_id in from_file:
            wanted = _normal(from_file[conn_id])
            if stored is None and in_backends(conn_id):
                steps.append(Step("connection", conn_id, "ok", "defined in a secrets backend, which Airflow reads "
                                                               "before the metastore: the file's entry is not written"))
            elif stored is None:
                steps.append(Step("connection", conn_id, "create", f"{wanted['conn_type']}, from the file"))
            else:
                changed = [k for k in CONNECTION_FIELDS if k in stored and _normal(stored)[k] != wanted[k]]
                steps.append(Step("connection", conn_id, "update" if changed else "ok",
                                  f"fields {', '.join(changed)}" if changed else "as in the file"))
        elif stored is not None:
            steps.append(Step("connection", conn_id, "ok", "in the metastore"))
        elif in_backends(conn_id):
            steps.append(Step("connection", conn_id, "ok", "in a secrets backend"))
        else:
            steps.append(Step("connection", conn_id, "missing", "not in the file nor in any secrets backend"))
            problems.append(f"Connection {conn_id} is missing: its partner's runs would fail at once "
                            "(add it to the connections file, or to the secrets backend)")
    return steps, problems


# -- Airflow's side (the REST API) ------------------------------------------------------

def _metastore_connection(conn_id: str) -> dict[str, Any] | None:
    """The fields the API shows of a Connection in the metastore (never its password, nor an
    extra it redacts: those are left out of the comparison)."""
    from airflow_client.client.exceptions import ApiException

    with api.calling(f"GET /api/v2/connections/{conn_id}"):
        try:
            conn = api.connections().get_connection(conn_id)
        except ApiException as exc:
            if api.absent(exc):
                return None
            raise
    fields: dict[str, Any] = {"conn_type": conn.conn_type, "host": conn.host, "login": conn.login,
                              "schema": conn.var_schema, "port": conn.port}
    extra = _extra(conn.extra)
    if "***" not in json.dumps(extra):
        fields["extra"] = extra
    return fields


def _in_backends(conn_id: str) -> bool:
    """Defined in the environment or a secrets backend (the Task SDK, outside a task, reads
    those and not the metastore)."""
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # AirflowNotFoundException, a backend that cannot answer
        return False
    return True


def _write_connection(conn_id: str, entry: dict[str, Any], exists: bool) -> None:
    from airflow_client import client as airflow_client

    wanted = _normal(entry)
    body = airflow_client.ConnectionBody(
        connection_id=conn_id, conn_type=wanted["conn_type"], host=wanted["host"], login=wanted["login"],
        password=wanted["password"], port=wanted["port"], var_schema=wanted["schema"],
        extra=json.dumps(wanted["extra"]) if wanted["extra"] else None)
    with api.calling(f"{'PATCH' if exists else 'POST'} /api/v2/connections/{conn_id}"):
        if exists:
            api.connections().patch_connection(conn_id, body)
        else:
            api.connections().post_connection(body)


def _dag_states(dag_ids: list[str]) -> dict[str, bool]:
    """dag_id -> is_paused, for the DAGs the dag-processor has parsed."""
    from airflow_client.client.exceptions import ApiException

    states = {}
    for dag_id in dag_ids:
        with api.calling(f"GET /api/v2/dags/{dag_id}"):
            try:
                states[dag_id] = bool(api.dags().get_dag(dag_id).is_paused)
            except ApiException as exc:
                if not api.absent(exc):
                    raise
    return states


def _unpause(dag_ids: list[str]) -> None:
    from airflow_client import client as airflow_client

    for dag_id in dag_ids:
        with api.calling(f"PATCH /api/v2/dags/{dag_id}"):
            api.dags().patch_dag(dag_id, airflow_client.DAGPatchBody(is_paused=False))


def _dags_with_runs(dag_ids: list[str], parsed: set[str]) -> set[str]:
    found = set()
    for dag_id in dag_ids:
        if dag_id in parsed:
            with api.calling(f"GET /api/v2/dags/{dag_id}/dagRuns"):
                if api.dag_runs().get_dag_runs(dag_id, limit=1).total_entries:
                    found.add(dag_id)
    return found


def _trigger(dag_id: str) -> str:
    """A first harvest, dated now (its run deadline counts from its logical date)."""
    from datetime import datetime, timezone

    from airflow_client import client as airflow_client

    body = airflow_client.TriggerDAGRunPostBody(logical_date=datetime.now(timezone.utc),
                                                note="first harvest (partner-harvest onboard)")
    with api.calling(f"POST /api/v2/dags/{dag_id}/dagRuns"):
        return str(api.dag_runs().trigger_dag_run(dag_id, body).dag_run_id)


def onboard(partners: list[Partner], connections: dict[str, dict[str, Any]], partners_with_runs: set[str],
            dry_run: bool) -> Plan:
    """Decide every step from the state now, then (unless ``dry_run``) do the changing ones."""
    from partner_harvest.airflow.admin import read_variable

    plan = Plan()
    pools = existing_pools()
    plan.steps += plan_pools(partners, pools)
    steps, problems = plan_connections([p.conn_id for p in partners], connections, _metastore_connection,
                                       _in_backends)
    plan.steps += steps
    plan.problems += problems
    missing_conn = {s.subject for s in steps if s.action == "missing"}

    dag_ids = [d for p in partners for d in (p.dag_id, p.reconcile_dag_id)]
    paused = _dag_states(dag_ids)
    for dag_id in dag_ids:
        if dag_id not in paused:
            plan.steps.append(Step("unpause", dag_id, "wait", "not parsed by the dag-processor yet: run onboard "
                                                              "again once it shows in the UI"))
        else:
            plan.steps.append(Step("unpause", dag_id, "unpause" if paused[dag_id] else "ok"))
    with_runs = _dags_with_runs([p.dag_id for p in partners], set(paused))
    for p in partners:
        if p.dag_id in with_runs or p.id in partners_with_runs or read_variable(cursor_key(p.id)) is not None:
            plan.steps.append(Step("trigger", p.dag_id, "ok", "has a cursor or a run already"))
        elif p.dag_id not in paused:
            plan.steps.append(Step("trigger", p.dag_id, "wait", "its DAG is not parsed yet"))
        elif p.conn_id in missing_conn:
            plan.steps.append(Step("trigger", p.dag_id, "wait", f"its Connection {p.conn_id} is missing"))
        else:
            plan.steps.append(Step("trigger", p.dag_id, "trigger", "first harvest: no cursor, no run"))
    if dry_run:
        return plan

    for step in plan.changes:
        if step.kind == "pool":
            name, slots, description = next(s for s in pool_specs(partners) if s[0] == step.subject)
            write_pool(name, slots, description, exists=name in pools)
        elif step.kind == "connection":
            _write_connection(step.subject, connections[step.subject], exists=step.action == "update")
    _unpause([s.subject for s in plan.changes if s.kind == "unpause"])
    for step in plan.changes:
        if step.kind == "trigger":
            step.detail = f"run {_trigger(step.subject)}"
    return plan
