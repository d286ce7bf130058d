"""The Airflow Asset of each partner's records: what downstream DAGs schedule on.

Every applied run (harvest ``apply_changes``, weekly ``reconcile``) emits one event on its
partner's Asset, also when it changed nothing (``extra["changed"]`` is then false): the
event says "the partner is applied up to this window". Its ``extra`` (``event_extra``)
carries the run's window, mode, counts and change range: the run's changes are exactly
the partner's rows with ``change_seq_after < change_seq <= change_seq_until``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from airflow.sdk import Asset, Context

from partner_harvest.store.feed import run_changes

URI_SCHEME = "partner-harvest"


def partner_asset(partner_id: str) -> Asset:
    """``partner-harvest://<id>/records``, named ``partner_<id>_records``."""
    return Asset(name=f"partner_{partner_id}_records", uri=f"{URI_SCHEME}://{partner_id}/records",
                 group="partner-harvest")


def partner_of(asset_uri: str) -> str | None:
    """The partner id of one of our Asset URIs; None for any other asset."""
    prefix = f"{URI_SCHEME}://"
    if not asset_uri.startswith(prefix):
        return None
    partner_id, _, rest = asset_uri[len(prefix):].partition("/")
    return partner_id if rest.rstrip("/") == "records" and partner_id else None


def event_extra(conn: psycopg.Connection, partner_id: str, run_key: str, dag_run_id: str) -> dict[str, Any]:
    return {**run_changes(conn, partner_id, run_key).as_extra(), "dag_run_id": dag_run_id}


def emit(context: Context, partner_id: str, extra: dict[str, Any]) -> None:
    """Attach ``extra`` to the event Airflow emits on the partner's Asset when the task succeeds."""
    events = context.get("outlet_events")
    if events is not None:  # absent only when a task body is called outside Airflow
        events[partner_asset(partner_id)].extra = extra
