"""Turning Airflow Connections into endpoints and database conninfo.

Secrets stay inside the Connection objects: nothing here logs or returns them in text
that could reach a log line, an XCom or a rendered field.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from airflow.sdk import BaseHook
from psycopg.conninfo import make_conninfo

from partner_harvest.factory import Endpoint

AGGREGATION_CONN_ID = "aggregation_db"
# conn_id -> conninfo, while a task try runs (read_once_per_task); None outside one.
_READ_IN_THIS_TASK: ContextVar[dict[str, str] | None] = ContextVar("partner_harvest_conninfo", default=None)


def partner_endpoint(conn_id: str) -> Endpoint:
    """The Connection's host is the endpoint's base URL (a bare host gets schema/port).

    Read by the partner hooks (``hooks.py``, any of the types ``http``, ``oai_pmh``,
    ``sierra``): the extras ``verify`` (a CA bundle), ``cert`` and ``proxies`` (or the form's
    ``proxy`` and ``client_key``) configure the partner's session (``factory.transport``);
    ``verify: false`` is refused.
    """
    from partner_harvest.airflow.hooks import PartnerEndpointHook

    return PartnerEndpointHook(conn_id=conn_id).endpoint()


def aggregation_conninfo(conn_id: str = AGGREGATION_CONN_ID) -> str:
    """libpq conninfo for the aggregation database (host may be a socket directory); inside
    :func:`read_once_per_task`, the Connection is read at the first call only."""
    kept = _READ_IN_THIS_TASK.get()
    if kept is not None and conn_id in kept:
        return kept[conn_id]
    conninfo = conninfo_from_connection(BaseHook.get_connection(conn_id))
    if kept is not None:
        kept[conn_id] = conninfo
    return conninfo


@contextmanager
def read_once_per_task() -> Iterator[None]:
    """One task try reads the aggregation's Connection once, not at every connection it opens.

    A Connection stored in the metadata database or a secrets backend costs a request to the
    api-server (or the backend) per read, and a quiet night's one task opened seven. The
    conninfo is kept for the block only, never across tries or processes: a changed
    Connection (rotated credentials) is read by the next try. A nested block reuses the
    outer one's.
    """
    if _READ_IN_THIS_TASK.get() is not None:
        yield
        return
    token = _READ_IN_THIS_TASK.set({})
    try:
        yield
    finally:
        _READ_IN_THIS_TASK.reset(token)


def conninfo_from_connection(conn: Any) -> str:
    """libpq conninfo from any Airflow Connection object (task SDK or core model)."""
    params = {
        "host": conn.host or None,
        "port": conn.port or None,
        "user": conn.login or None,
        "password": conn.password or None,
        "dbname": conn.schema or None,
    }
    params.update({k: v for k, v in conn.extra_dejson.items() if k in {"sslmode", "options", "connect_timeout"}})
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})

