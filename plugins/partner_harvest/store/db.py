"""Opening connections to the aggregation database."""

from __future__ import annotations

import psycopg


def connect(conninfo: str, *, autocommit: bool = False) -> psycopg.Connection:
    """A psycopg 3 connection; ``conninfo`` is a libpq URI or key=value string."""
    return psycopg.connect(conninfo, autocommit=autocommit, application_name="partner-harvest")
