"""Many partners at once, for the health index's paging tests: a registry of ``n``
partners (every fifth one Sierra) and one night of audit rows written straight into
``harvest_runs`` with SQL (one statement, whatever ``n``), so that states, lags and causes
vary the way they do at scale:

- ``i % 10 == 0``: the last run failed with a shared outage's cause (``connection refused``);
- ``i % 7 == 0`` (and not failing): never run;
- else applied, its window ending ``i % 97`` hours before now (some partners behind).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from partner_harvest.registry import Registry, load_registry
from partner_harvest.store.db import one
from tests.support.partners import registry_text

OUTAGE = "connection refused by shared-host.example.org:443"


def partner_id(i: int) -> str:
    return f"p{i:05d}"


def write_registry(path: Path, n: int) -> Registry:
    entries = [{"id": partner_id(i), "protocol": "sierra" if i % 5 == 0 else "oai-pmh",
                "conn_id": f"partner_{partner_id(i)}", **({} if i % 5 == 0 else {"metadata_prefix": "oai_dc"})}
               for i in range(1, n + 1)]
    path.write_text(registry_text(*entries), encoding="utf-8")
    registry = load_registry(path)
    assert not registry.errors, registry.errors[:3]
    return registry


def seed(conn: psycopg.Connection, n: int, now: datetime) -> None:
    conn.execute(
        """
        INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_until, status, fetched, upserted,
                                  unchanged, purged, quarantined, error, started_at, harvested_at, applied_at,
                                  records_held)
        SELECT pid, 'harvest_' || pid || '/scheduled__night', 'changes', 'incremental',
               %(now)s - (i %% 97) * interval '1 hour',
               CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'applied' END, 10 + i %% 13, 10, 0, 0, 0,
               CASE WHEN i %% 10 = 0 THEN %(outage)s END,
               %(now)s - (i %% 97) * interval '1 hour', %(now)s - (i %% 97) * interval '1 hour',
               CASE WHEN i %% 10 = 0 THEN NULL ELSE %(now)s - (i %% 97) * interval '1 hour' END, 100 + i
        FROM generate_series(1, %(n)s) i, LATERAL (SELECT 'p' || lpad(i::text, 5, '0') AS pid) x
        WHERE i %% 10 = 0 OR i %% 7 <> 0
        """,
        {"now": now, "n": n, "outage": OUTAGE},
    )
    conn.execute(
        """
        INSERT INTO partner_stats (partner_id, records_held, quarantined_now)
        SELECT partner_id, max(records_held), 0 FROM harvest_runs WHERE status = 'applied' GROUP BY partner_id
        """)
    conn.commit()


def serve_health_app(conn: psycopg.Connection, db: str, folder: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The health pages' app over a seeded fleet of ``n`` partners, Airflow's login and
    Connections left out (the login is tested in tests/integration/test_health.py)."""
    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.store import connect

    registry = write_registry(folder / "partners.yaml", n)
    (now,) = one(conn.execute("SELECT now()"))
    seed(conn, n, now)
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: {})
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))
    return health_app.create_app()
