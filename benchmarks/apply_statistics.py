"""Benchmark: a new partner's big first load and its next apply (statistics that do not know it).

The upsert and the purge hold anti-joins against the partner's rows in `records` and
`tombstones`, planned on what the statistics believe the partner holds. A new partner is
in no statistics (nor is one that was forgotten and loaded again), so the planner
believed "one row" and ran the anti-join as a nested loop over all the partner's rows for
every tombstone: minutes instead of seconds. A first load anti-joins nothing (the partner
holds nothing: a plain insert); the partner's next apply checks the belief against
partner_stats and analyzes the table when it is far off (store/apply.py).

Each case stages and applies a first load (``--records`` items, 5% of them tombstones),
then a full reharvest of the same items (a tenth of them edited, the same tombstones),
in a fresh child process against the same embedded PostgreSQL:

  empty table:     the first partner, into empty tables (the reference);
  loaded again:    a partner loaded, forgotten (before a clean re-harvest) and loaded
                   again, beside the partner loaded before it;
  same, check off: the same, with the check switched off.

    .venv/bin/python benchmarks/apply_statistics.py [--records 50000]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402
from partner_harvest.store.db import one
from partner_harvest.window import WindowFacts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
_PAYLOAD = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
            'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Record {i}</dc:title>'
            '<dc:creator>Workshop of a painter, active 1650-1700</dc:creator><dc:date>1680</dc:date>'
            '<dc:description>' + "A description of the object as a museum would publish it. " * 6 +
            '</dc:description><dc:identifier>https://collection.example.org/object/{i}</dc:identifier>'
            '<dc:rights>CC BY 4.0</dc:rights></oai_dc:dc>')


def _stage(conn: psycopg.Connection, partner_id: str, run_id: str, records: int, edition: int = 0) -> None:
    from partner_harvest.records import HarvestStats, Record, Tombstone
    from partner_harvest.store import RunRef, StagingWriter, begin_run, finish_harvest
    from partner_harvest.window import Window

    run = RunRef(partner_id, run_id, "changes")
    begin_run(conn, run, Window("full", None, T0 + timedelta(days=1), "seconds", True, WindowFacts()), "oai_dc")
    stats = HarvestStats()
    writer = StagingWriter(conn, run)
    page: list = []
    for i in range(records):
        at = T0 + timedelta(seconds=i)
        item = (Tombstone(f"oai:bench:{i}", at) if i % 20 == 0 else
                Record(f"oai:bench:{i}", at + timedelta(days=edition if i % 10 == 1 else 0), "oai_dc",
                       _PAYLOAD.format(i=i if i % 10 != 1 else f"{i} (edition {edition})"), (), f"record {i}"))
        stats.add(item)
        page.append(item)
        if len(page) == 500:
            writer.write_page(page)
            stats.pages += 1
            page = []
    writer.write_page(page)
    finish_harvest(conn, run, stats)


def child(args: argparse.Namespace) -> dict:
    from partner_harvest.store import apply, connect

    if args.no_refresh:
        apply._know_partner_rows = lambda *a, **k: None
    with connect(args.db) as conn:
        _stage(conn, args.partner, "first", args.records)
        started = time.perf_counter()
        first = apply.apply_run(conn, args.partner, "first")
        loaded = time.perf_counter()
        _stage(conn, args.partner, "second", args.records, edition=1)
        restaged = time.perf_counter()
        second = apply.apply_run(conn, args.partner, "second")
        return {"first": loaded - started, "second": time.perf_counter() - restaged,
                "upserted": first.upserted, "updated": second.upserted}


def _forgotten(db: str, records: int, partner_id: str) -> None:
    """The partner loaded, then forgotten before a clean re-harvest (`forget_partner`, as the
    docs/operator/cli.md suggests), and the tables analyzed (autovacuum would do the same)."""
    from partner_harvest.store import connect
    from partner_harvest.store.admin import forget_partner
    from partner_harvest.store.apply import apply_run

    with connect(db) as conn:
        _stage(conn, partner_id, "old", records)
        apply_run(conn, partner_id, "old")
        forget_partner(conn, partner_id)
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE records")
        conn.execute("ANALYZE tombstones")


def _belief(db: str) -> str:
    from partner_harvest.store import connect

    with connect(db) as conn:
        pages, rows = one(conn.execute("SELECT relpages, reltuples FROM pg_class WHERE relname = 'records'"))
    return f"statistics: {pages:,} pages, {max(rows, 0):,.0f} rows"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--partner", help=argparse.SUPPRESS)
    parser.add_argument("--no-refresh", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import json

        print(json.dumps(child(args)))
        return 0

    from include import embedded_pg
    from partner_harvest.store import connect, ensure_schema

    db = embedded_pg.start("bench-apply")  # its own database: it empties the tables
    with connect(db) as conn:
        ensure_schema(conn)
        conn.execute("TRUNCATE records, tombstones, deletions, staging, harvest_runs, quarantine")
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE records")
    print(f"First load of {args.records:,} items ({args.records // 20:,} tombstones), then a full reharvest "
          f"with a tenth of them edited, three ways")
    figures = {}
    for label, partner, stale, extra in (("empty table", "bench-first", False, ()),
                                         ("loaded again", "bench-again", True, ()),
                                         ("same, check off", "bench-old", True, ("--no-refresh",))):
        if stale:
            _forgotten(db, args.records, partner)
        belief = _belief(db)
        figures[label] = f = support.run_child(__file__, "--db", db, "--partner", partner,
                                               "--records", str(args.records), *extra)
        print(f"  {label:<18} first load {f['first']:6.1f} s ({f['upserted']:,} upserted), reharvest "
              f"{f['second']:6.1f} s ({f['updated']:,} updated); before it, {belief}")
    base = figures["empty table"]["second"]
    print(f"  reharvest, loaded again / empty table: {figures['loaded again']['second'] / base:.2f}x; "
          f"check off / empty table: {figures['same, check off']['second'] / base:.1f}x")
    return 0 if figures["loaded again"]["second"] < 3 * base + 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
