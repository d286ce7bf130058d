"""Benchmark: the partner health query with 500 partners and 10,000,000 records.

Builds (once; reused while it is there) a database ``bench_health`` on the embedded
PostgreSQL: 500 partners of 20,000 records each, a year of nightly runs per partner
(182,500 ``harvest_runs`` rows, one in ten partners failing last night), weekly
reconciles, 100,000 quarantined rows, all with INSERT ... SELECT generate_series, and
``partner_stats`` filled once the way migration 0006 does. Then times
``store.health.partner_health`` over every partner (what ``partner-harvest status`` runs),
``store.health.index_health`` (the index's read of every partner's state), the partner
page's queries (``recent_runs``, ``quarantine_today``), and the index itself, first request
(nothing kept) and warm. Targets: the health query under 300 ms; at 10,000 partners the
index's first request under 1 s.

    .venv/bin/python benchmarks/health_page.py [--partners 500] [--records-per-partner 20000] [--rebuild]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402,F401 (puts the repository on sys.path)
from partner_harvest.store.db import one, scalar

DB_NAME = "bench_health"
TARGET_MS = 300.0
# The partner ids, the same on both sides: at least 3 digits, never cut (``lpad`` to a fixed
# width truncates: '1000' became '100').
PID = "'bench' || lpad(p::text, greatest(3, length(p::text)), '0')"


def partner_id(p: int) -> str:
    return f"bench{p:03d}"


def database(rebuild: bool) -> str:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from include import embedded_pg

    server = embedded_pg.start("bench")
    with psycopg.connect(server, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if exists and rebuild:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(DB_NAME)))
        if not exists or rebuild:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    params = conninfo_to_dict(server)
    params["dbname"] = DB_NAME
    return make_conninfo("", **params)


def build(conn: psycopg.Connection, partners: int, per_partner: int, days: int = 365, weeks: int = 52, quarantined: int = 200) -> None:
    """The data, unless a build of this size is already there (``days`` of nightly runs,
    ``weeks`` of reconciles, ``quarantined`` rows per partner)."""
    held = one(conn.execute("SELECT count(*), COALESCE(sum(records_held), 0) FROM partner_stats"))
    if tuple(held) == (partners, partners * per_partner):
        print(f"reusing the data: {partners} partners, {held[1]:,} records")
        return
    for table in ("records", "harvest_runs", "quarantine", "partner_stats"):
        conn.execute(f"TRUNCATE {table}")
    conn.commit()
    started = time.perf_counter()
    chunk = max(1, 1_000_000 // per_partner)  # partners per statement: ~1M rows each
    for first in range(1, partners + 1, chunk):
        last = min(partners, first + chunk - 1)
        conn.execute(
            f"""
            INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, title,
                                 content_hash, run_id, observed_at)
            SELECT {PID}, 'oai:bench' || p || ':' || i,
                   timestamptz '2026-01-01' + (i %% 300) * interval '1 day', 'oai_dc',
                   '<dc><title>Record ' || i || '</title></dc>', 'Record ' || i, md5(p || ':' || i),
                   'harvest_' || {PID} || '/load', timestamptz '2026-01-01'
            FROM generate_series(%s::int, %s::int) p, generate_series(1, %s::int) i
            """,
            (first, last, per_partner),
        )
        conn.commit()
        print(f"  records of partners {first}..{last} loaded ({time.perf_counter() - started:.0f} s)", flush=True)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    conn.execute(
        f"""
        INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_from, window_until, status,
                                  pages, fetched, upserted, unchanged, purged, quarantined, error,
                                  started_at, harvested_at, applied_at, records_held)
        SELECT pid, 'harvest_' || pid || '/scheduled__' || d, 'changes', 'incremental',
               %(now)s - (d + 1) * interval '1 day', %(now)s - d * interval '1 day',
               CASE WHEN d = 0 AND p %% 10 = 0 THEN 'failed' ELSE 'applied' END,
               3, 500 + d %% 50, 400, 90, 10 + d %% 5, d %% 3,
               CASE WHEN d = 0 AND p %% 10 = 0 THEN 'connection refused' END,
               %(now)s - d * interval '1 day' - interval '2 hours',
               %(now)s - d * interval '1 day' - interval '110 minutes',
               CASE WHEN d = 0 AND p %% 10 = 0 THEN NULL ELSE %(now)s - d * interval '1 day' - interval '100 minutes' END,
               %(held)s
        FROM generate_series(1, %(partners)s) p, LATERAL (SELECT {PID} AS pid) n,
             generate_series(0, %(days)s - 1) d
        """,
        {"now": now, "partners": partners, "held": per_partner, "days": days},
    )
    conn.execute(
        f"""
        INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_until, status, fetched,
                                  upserted, purged, started_at, harvested_at, applied_at, records_held)
        SELECT pid, 'reconcile_' || pid || '/scheduled__' || w, 'reconcile', 'reconcile',
               %(now)s - w * interval '7 days', 'applied', 12, 2, 10,
               %(now)s - w * interval '7 days' - interval '1 hour', %(now)s - w * interval '7 days' - interval '50 minutes',
               %(now)s - w * interval '7 days' - interval '45 minutes', %(held)s
        FROM generate_series(1, %(partners)s) p, LATERAL (SELECT {PID} AS pid) n,
             generate_series(0, %(weeks)s - 1) w
        """,
        {"now": now, "partners": partners, "held": per_partner, "weeks": weeks},
    )
    conn.execute(
        f"""
        INSERT INTO quarantine (partner_id, identifier, reason, raw_payload, run_id, quarantined_at, observed_at)
        SELECT {PID}, 'oai:bench' || p || ':q' || q,
               'no title (' || (q %% 4) || ')', '<x/>', 'harvest_bench/scheduled__0',
               %(now)s - (q %% 30) * interval '1 day', %(now)s - (q %% 30) * interval '1 day'
        FROM generate_series(1, %(partners)s) p, generate_series(1, %(quarantined)s) q
        """,
        {"now": now, "partners": partners, "quarantined": quarantined},
    )
    conn.execute(  # once, as migration 0006 does; apply_run keeps them in step from then on
        """
        INSERT INTO partner_stats (partner_id, records_held, quarantined_now)
        SELECT partner_id, count(*), (SELECT count(*) FROM quarantine_current q WHERE q.partner_id = r.partner_id)
        FROM records r GROUP BY partner_id
        """)
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE")
    conn.autocommit = False
    print(f"built in {time.perf_counter() - started:.0f} s")


# The index as the operator asks for it: the first page, sorted by lag, filtered by state and
# by text (the old page ignores the query and sends every partner each time).
INDEX_PATHS = ("/", "/?sort=lag&order=desc", "/?state=failing", "/?q=bench99", "/?page=40")


def index_page(db: str, partners: list, repeat: int) -> list[tuple[str, int, float]]:
    """(path, bytes, median ms) of the health index rendered by the app itself (FastAPI's
    TestClient, Airflow's login and the scheduler's runs left out), against ``db``."""
    from pathlib import Path
    from unittest import mock

    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.registry import Registry
    from partner_harvest.store import connect

    registry = Registry(Path("partners.yaml"), partners, [])
    figures = []
    with mock.patch.object(source, "registry", lambda: registry), \
            mock.patch.object(source, "latest_harvest_runs", lambda partners: {}), \
            mock.patch.object(source, "connection", lambda: connect(db)), \
            mock.patch.object(health_app, "_require_user", lambda: (lambda: None)):
        client = TestClient(health_app.create_app())
        for path in INDEX_PATHS:
            for warm in (False, True):  # warm: the app's few seconds of kept figures (where it keeps them)
                timings, size = [], 0
                for _ in range(repeat):
                    if not warm:
                        getattr(health_app, "_index_cache", {}).clear()
                    started = time.perf_counter()
                    response = client.get(path)
                    timings.append((time.perf_counter() - started) * 1000)
                    response.raise_for_status()
                    size = len(response.content)
                figures.append((path + (" (warm)" if warm else ""), size, statistics.median(timings)))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partners", type=int, default=500)
    parser.add_argument("--records-per-partner", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--days", type=int, default=365, help="nightly runs per partner")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()

    from partner_harvest.store import connect, ensure_schema, health
    from partner_harvest.store.health import partner_health, quarantine_today, recent_runs

    db = database(args.rebuild)
    with connect(db) as conn:
        ensure_schema(conn)
        build(conn, args.partners, args.records_per_partner, days=args.days)
        records = scalar(conn.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'records'"))
        runs = scalar(conn.execute("SELECT count(*) FROM harvest_runs"))
        conn.commit()
        partners = [support.partner(id=partner_id(p), protocol="oai-pmh") for p in range(1, args.partners + 1)]
        now = datetime.now(timezone.utc)
        timings = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            rows = partner_health(conn, partners, now)
            timings.append((time.perf_counter() - started) * 1000)
        fast = []  # the index's read (one row per partner: partner_health_facts), where there is one
        for _ in range(args.repeat if hasattr(health, "index_health") else 0):
            started = time.perf_counter()
            health.index_health(conn, partners, now)
            fast.append((time.perf_counter() - started) * 1000)
        page = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            recent_runs(conn, "bench250", 90)
            quarantine_today(conn, "bench250", now)
            page.append((time.perf_counter() - started) * 1000)
    pages = index_page(db, partners, max(1, args.repeat // 3))
    states: dict[str, int] = {}
    for row in rows:
        states[row.state] = states.get(row.state, 0) + 1
    median = statistics.median(timings)
    print(f"data: {len(partners)} partners, ~{records:,} records, {runs:,} harvest_runs rows")
    print(f"partner_health ({len(rows)} partners): median {median:.1f} ms, min {min(timings):.1f} ms, "
          f"max {max(timings):.1f} ms over {len(timings)} runs; states {states}")
    if fast:
        print(f"index_health ({len(partners)} partners): median {statistics.median(fast):.1f} ms, "
              f"min {min(fast):.1f} ms, max {max(fast):.1f} ms over {len(fast)} runs")
    print(f"partner page (recent_runs 90 + quarantine_today): median {statistics.median(page):.1f} ms")
    for path, size, ms in pages:
        print(f"health index {path}: {size:,} bytes, median {ms:.0f} ms")
    print(f"target {TARGET_MS:.0f} ms: {'met' if median < TARGET_MS else 'MISSED'}")


if __name__ == "__main__":
    main()
