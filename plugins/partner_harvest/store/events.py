"""``run_events``: what a harvest run's tasks said when they did not harvest (migration 0017).

A failed try, a failed last try, a skipped run: Airflow keeps these in its own database and
logs only, and a run that fails before it writes ``harvest_runs`` (an unreachable endpoint)
leaves nothing in the aggregation. The task callbacks write one row each, so the health
page and ``partner-harvest status`` name the cause from the aggregation database alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import psycopg

RETRY, FAILED, SKIPPED, EMPTY = "retry", "failed", "skipped", "empty"
MESSAGE_LIMIT = 2000  # an error's first lines, never a whole traceback


@dataclass(frozen=True)
class RunEvent:
    partner_id: str
    dag_id: str
    run_id: str  # <dag_id>/<Airflow run id>
    task_id: str
    try_number: int | None
    kind: str
    message: str
    at: datetime


def record(conn: psycopg.Connection, partner_id: str, dag_id: str, run_id: str, task_id: str,
           try_number: int | None, kind: str, message: str) -> None:
    """One event, in its own transaction (the callers are callbacks: nothing else to commit)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO run_events (partner_id, dag_id, run_id, task_id, try_number, kind, message)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (partner_id, dag_id, run_id, task_id, try_number, kind, message[:MESSAGE_LIMIT]),
        )


def newest(conn: psycopg.Connection, dags: Iterable[tuple[str, str]]) -> dict[str, RunEvent]:
    """Each partner's newest event of its harvest DAG (``(partner_id, dag_id)`` pairs)."""
    pairs = list(dags)
    if not pairs:
        return {}
    pids, dag_ids = [p for p, _ in pairs], [d for _, d in pairs]
    rows = conn.execute(
        """
        SELECT e.partner_id, e.dag_id, e.run_id, e.task_id, e.try_number, e.kind, e.message, e.at
        FROM unnest(%(pids)s::text[], %(dags)s::text[]) AS k(partner_id, dag_id)
        CROSS JOIN LATERAL (
            SELECT * FROM run_events r WHERE r.partner_id = k.partner_id AND r.dag_id = k.dag_id
            ORDER BY r.at DESC, r.id DESC LIMIT 1
        ) e
        """,
        {"pids": pids, "dags": dag_ids},
    ).fetchall()
    return {row[0]: RunEvent(*row) for row in rows}
