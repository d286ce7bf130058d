"""The one rule by which a lane takes its next slice, for a sliced harvest's slices
(``harvest_runs``) and a sliced reconcile's sweep (``reconcile_slices``) alike."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from partner_harvest.store import fences


def claim(conn: psycopg.Connection, table: str, key: str, unfinished: tuple[str, ...], scope: sql.Composable,
          params: dict[str, Any], request: str) -> Any | None:
    """The ``key`` of the next row of ``table`` within ``scope`` that lane ``params["lane"]``
    takes, in one fenced transaction: its own row still ``unfinished`` (a retry of the lane),
    else the first ``planned`` row nobody took (the plans number them biggest first); None
    when none is left. Two lanes never take the same row (FOR UPDATE SKIP LOCKED); a row
    another lane took stays that lane's."""
    with conn.transaction():
        fences.check(conn, request)
        row = conn.execute(sql.SQL(
            """
            WITH next AS (
                SELECT {key} AS picked FROM {table}
                WHERE {scope}
                  AND ((lane = %(lane)s AND status = ANY(%(unfinished)s)) OR (lane IS NULL AND status = 'planned'))
                ORDER BY lane IS NULL, {key}
                LIMIT 1 FOR UPDATE SKIP LOCKED
            )
            UPDATE {table} t SET lane = %(lane)s FROM next
            WHERE {scope} AND t.{key} = next.picked
            RETURNING t.{key}
            """).format(key=sql.Identifier(key), table=sql.Identifier(table), scope=scope),
            {**params, "unfinished": list(unfinished)},
        ).fetchone()
    return row[0] if row else None
