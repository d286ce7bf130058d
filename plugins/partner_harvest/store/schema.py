"""Schema migrations that apply themselves, idempotently, before the first write.

Migrations are numbered SQL files next to this module. Each is applied once, under an
advisory lock so two tasks starting together do not race, and recorded in
``schema_migrations``.
"""

from __future__ import annotations

import logging
from importlib import resources

import psycopg

log = logging.getLogger(__name__)
_LOCK_KEY = 0x5048_0001  # arbitrary constant: "PH" schema lock


def migration_files() -> list[tuple[str, str]]:
    folder = resources.files("partner_harvest.store") / "migrations"
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(p.name, p.read_text(encoding="utf-8")) for p in files]


def ensure_schema(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied now (usually none)."""
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
