"""Schema migrations that apply themselves, idempotently, before the first write.

Migrations are numbered SQL files next to this module. Each is applied once, under an
advisory lock so two tasks starting together do not race, and recorded in
``schema_migrations``.

Deployments whose tasks must not run DDL set ``HARVEST_SCHEMA_MANAGED=external`` and apply
the migrations themselves (``partner-harvest migrate``, with an owner role): tasks then only
check that every migration of this code is recorded, and fail naming the missing ones.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from importlib import resources

import psycopg

from partner_harvest.store.db import scalar

log = logging.getLogger(__name__)
_LOCK_KEY = 0x5048_0001  # arbitrary constant: "PH" schema lock
SCHEMA_MANAGED_ENV = "HARVEST_SCHEMA_MANAGED"


class SchemaNotReady(RuntimeError):
    """The schema is managed outside the tasks and lacks migrations this code needs."""


def schema_managed_externally() -> bool:
    return (os.environ.get(SCHEMA_MANAGED_ENV) or "").strip().lower() == "external"


def pending_migrations(conn: psycopg.Connection) -> list[str]:
    """The migrations of this code not recorded in the database (reads only, no DDL)."""
    with conn.transaction():
        exists = scalar(conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL"))
        done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")} if exists else set()
    return [name for name, _ in migration_files() if name not in done]


@cache
def migration_files() -> tuple[tuple[str, str], ...]:
    """The package's migrations (name, SQL) in order, read once per process (they ship with the code)."""
    folder = resources.files("partner_harvest.store") / "migrations"
    files = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return tuple((p.name, p.read_text(encoding="utf-8")) for p in files)


def ensure_schema(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied now (usually none).

    With ``HARVEST_SCHEMA_MANAGED=external`` it runs no DDL: it raises
    :class:`SchemaNotReady` when a migration is missing, else returns ``[]``.
    """
    if schema_managed_externally():
        missing = pending_migrations(conn)
        if missing:
            raise SchemaNotReady(
                f"the aggregation database lacks schema migration(s) {', '.join(missing)} and "
                f"{SCHEMA_MANAGED_ENV}=external forbids tasks to apply them: run `partner-harvest migrate` "
                "with a role that may change the schema"
            )
        return []
    if not pending_migrations(conn):  # every task asks: a read, without the lock and the DDL
        return []
    return apply_migrations(conn)


def apply_migrations(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations under the advisory lock, whatever the environment says."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
        for name, sql in migration_files():
            if name in done:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (name,))
            applied_now.append(name)
            log.info("applied schema migration %s", name)
    return applied_now
