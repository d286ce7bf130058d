"""Opening connections to the aggregation database."""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg

Row = TypeVar("Row")


def connect(conninfo: str, *, autocommit: bool = False) -> psycopg.Connection:
    """A psycopg 3 connection; ``conninfo`` is a libpq URI or key=value string."""
    return psycopg.connect(conninfo, autocommit=autocommit, application_name="partner-harvest")


def one(cursor: psycopg.Cursor[Row]) -> Row:
    """The row of a statement that always returns one (an aggregate, an upsert's RETURNING).

    psycopg types ``fetchone()`` as optional; here no row is a broken invariant, not an answer.
    """
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the statement returned no row where it always returns one")
    return row


def scalar(cursor: psycopg.Cursor[tuple[Any, ...]]) -> Any:
    """The first column of :func:`one` (``SELECT count(*)``, ``RETURNING id``)."""
    return one(cursor)[0]
