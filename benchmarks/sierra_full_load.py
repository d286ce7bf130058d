"""Benchmark: a Sierra full load through the two-phase MARC export, then an incremental run.

For each size (default 10,000 then 100,000 bibs; 2% deleted) it starts the Sierra
simulator in its own process, runs a full load in a fresh harvesting process (export in
2,000-record files, pymarc, MARCXML, staging, apply), checks ``records`` against the
simulator's live set, then lets the catalogue edit 1%, delete 0.5% and add 0.5% and runs
an incremental harvest (change poll + deletion poll on its day cursor).

Printed per size: records/s of the full load, peak RSS of the harvesting process, what
the incremental run fetched on each channel; and the RSS ratio between the sizes.

    .venv/bin/python benchmarks/sierra_full_load.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import support

KEY, SECRET = "bench-key", "bench-secret"


def child(args: argparse.Namespace) -> None:
    """The harvesting process: freeze, both channels, apply; report its own figures."""
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.registry import Partner
    from partner_harvest.store import RunRef, connect
    from partner_harvest.window import parse_instant

    partner = Partner(id="bench_sierra", protocol="sierra", conn_id="-", page_size=2000)
    adapter = build_adapter(partner, Endpoint(args.url, KEY, SECRET))
    cursor = parse_instant(args.cursor) if args.cursor else None
    deletions = parse_instant(args.deletions_cursor) if args.deletions_cursor else None
    started = time.perf_counter()
    window = pipeline.freeze_window(adapter, partner.lag, cursor, pipeline.RunRequest("incremental"),
                                    {"deletions": deletions})
    with connect(args.db) as conn:
        changes = pipeline.harvest_window(adapter, conn, RunRef(partner.id, args.run_id, "changes"), window)
        polled = pipeline.poll_deletions(adapter, conn, RunRef(partner.id, args.run_id, "deletions"), window)
        harvested = time.perf_counter()
        result = pipeline.apply_changes(conn, partner.id, args.run_id)
    applied = time.perf_counter()
    print(json.dumps({
        "until": window.to_dict()["until"],
        "deletions_until": window.protocol["channels"]["deletions"]["until"],
        "changes_fetched": changes.fetched, "deletions_fetched": polled.fetched, "pages": changes.pages,
        "upserted": result.upserted, "purged": result.purged, "unchanged": result.unchanged,
        "quarantined": result.quarantined,
        "harvest_seconds": harvested - started, "total_seconds": applied - started,
        "peak_rss_mib": support.peak_rss_mib(),
    }))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url")
    parser.add_argument("--db")
    parser.add_argument("--run-id")
    parser.add_argument("--cursor")
    parser.add_argument("--deletions-cursor")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    print("Sierra benchmark: export files of 2,000 bibs, change/deletion polls of 2,000; 2% deleted; "
          "simulator and harvester in separate processes; PostgreSQL "
          f"{'given' if os.environ.get('HARVEST_DATABASE_URL') else 'embedded'}")
    rows, ok = [], True
    for size in [int(s) for s in args.sizes.split(",")]:
        db = support.fresh_database("bench_sierra")
        sim_args = ("--bibs", str(size), "--deleted-fraction", "0.02", "--client-key", KEY, "--client-secret", SECRET)
        with support.simulator("sierra", *sim_args) as url:
            full = support.run_child(__file__, "--url", url, "--db", db, "--run-id", f"full-{size}")
            full_equal = support.held_ids(db, "bench_sierra") == support.control(url, "live_ids")
            support.control(url, "advance_clock", {"seconds": 3600})
            changes = support.control(url, "mutate", {"edit": size // 100, "delete": size // 200, "add": size // 200})
            edited, deleted, added = set(changes["edited"]), set(changes["deleted"]), set(changes["added"])
            incr = support.run_child(__file__, "--url", url, "--db", db, "--run-id", f"incr-{size}",
                                     "--cursor", full["until"], "--deletions-cursor", full["deletions_until"])
            upstream = support.control(url, "live_ids")
            incr_equal = support.held_ids(db, "bench_sierra") == upstream
        expected_changes = len(edited - deleted) + len(added)
        # Everything changed lands; anything else fetched is the lag/day overlap (unchanged).
        only_changes = incr["upserted"] == expected_changes and incr["purged"] == len(deleted)
        ok = ok and full_equal and incr_equal and only_changes
        rows.append((size, full))
        print(f"\n{size:,} bibs")
        print(f"  full load (export): {full['changes_fetched'] / full['harvest_seconds']:,.0f} records/s exported+parsed+staged "
              f"({full['harvest_seconds']:.1f} s); {full['changes_fetched'] / full['total_seconds']:,.0f} records/s including apply "
              f"({full['total_seconds']:.1f} s); {full['pages']} export files")
        print(f"  peak RSS of the harvesting process: {full['peak_rss_mib']:.1f} MiB")
        print(f"  records == simulator live set: {'yes' if full_equal else 'NO'}")
        print(f"  after edit 1% / delete 0.5% / add 0.5%: change poll fetched {incr['changes_fetched']:,} "
              f"({expected_changes:,} edited-and-live or added + re-seen in the 10-minute lag), deletion poll fetched "
              f"{incr['deletions_fetched']:,} ({len(deleted):,} new + re-seen in the day overlap), "
              f"upserted {incr['upserted']:,}, purged {incr['purged']:,}, {incr['total_seconds']:.1f} s; "
              f"records == live set: {'yes' if incr_equal else 'NO'}")
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        print(f"\npeak RSS ratio {large[0]:,} / {small[0]:,} bibs: {large[1]['peak_rss_mib'] / small[1]['peak_rss_mib']:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
