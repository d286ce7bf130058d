"""Benchmark: full and incremental OAI-PMH harvests against the simulator over loopback.

For each collection size (default 20,000 then 200,000 records; 5% deleted; 500 per
page) it starts the OAI-PMH simulator in its own process, runs a full harvest in a fresh
harvesting process (freeze, stream into staging, apply), checks ``records`` against the
simulator's live set identifier for identifier, then lets the partner edit 1%, delete
0.5% and add 0.5% and runs an incremental harvest from the frozen cursor.

Printed per size: records/s of the full harvest (fetch+parse+stage, and including the
apply), the harvesting process's peak RSS, what the incremental run fetched; and the
RSS ratio between the largest and the smallest size (I5: memory bounded by a page).

    .venv/bin/python benchmarks/oai_full_harvest.py [--sizes 20000,200000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """The harvesting process: one window, then report its own figures as JSON."""
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.run import run_partner
    from partner_harvest.store import connect
    from partner_harvest.window import parse_instant

    partner = support.partner(id="bench", protocol="oai-pmh", metadata_prefix=args.prefix)
    adapter = build_adapter(partner, Endpoint(args.url))
    cursor = parse_instant(args.cursor) if args.cursor else None
    with connect(args.db) as conn:  # the DAG's steps (partner_harvest.run), each one timed
        run = run_partner(partner, adapter, conn, args.run_id, {"changes": cursor})
    stats, result = run.changes, run.applied
    print(json.dumps({
        "until": run.window.to_dict()["until"],
        "fetched": stats.fetched, "pages": stats.pages,
        "upserted": result.upserted, "purged": result.purged, "unchanged": result.unchanged,
        "quarantined": result.quarantined,
        "harvest_seconds": run.seconds["freeze"] + run.seconds["stage"], "total_seconds": sum(run.seconds.values()),
        "peak_rss_mib": support.peak_rss_mib(),
    }))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20000,200000")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--prefix", default="oai_dc")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url")
    parser.add_argument("--db")
    parser.add_argument("--run-id")
    parser.add_argument("--cursor")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    print(f"OAI-PMH harvest benchmark: page size {args.page_size}, prefix {args.prefix}, "
          f"5% deleted; simulator and harvester in separate processes; PostgreSQL "
          f"{'given' if os.environ.get('HARVEST_DATABASE_URL') else 'embedded'}")
    rows = []
    ok = True
    for size in [int(s) for s in args.sizes.split(",")]:
        db = support.fresh_database("bench")
        sim_args = ("--records", str(size), "--deleted-fraction", "0.05", "--page-size", str(args.page_size),
                    "--granularity", "seconds", "--formats", "oai_dc,lido")
        with support.simulator("oai_pmh", *sim_args) as url:
            child_args = ("--url", url, "--db", db, "--prefix", args.prefix)
            full = support.run_child(__file__, *child_args, "--run-id", f"full-{size}")
            upstream = support.control(url, "live_ids")
            held = support.held_ids(db, "bench")
            full_equal = held == upstream
            changes = support.control(url, "mutate", {"edit": size // 100, "delete": size // 200, "add": size // 200})
            changed = len(set(changes["edited"]) | set(changes["deleted"]) | set(changes["added"]))
            incr = support.run_child(__file__, *child_args, "--run-id", f"incr-{size}", "--cursor", full["until"])
            upstream = support.control(url, "live_ids")
            incr_equal = support.held_ids(db, "bench") == upstream
        # Everything changed must land; anything else fetched is the lag overlap (unchanged).
        only_changes = incr["upserted"] + incr["purged"] == changed and incr["unchanged"] == incr["fetched"] - changed
        ok = ok and full_equal and incr_equal and only_changes
        rows.append((size, full, incr, changed, full_equal, incr_equal, len(upstream)))
        print(f"\n{size:,} records ({full['pages']} pages)")
        print(f"  full harvest:  {full['fetched'] / full['harvest_seconds']:,.0f} records/s fetched+parsed+staged "
              f"({full['harvest_seconds']:.1f} s); {full['fetched'] / full['total_seconds']:,.0f} records/s "
              f"including apply ({full['total_seconds']:.1f} s)")
        print(f"  peak RSS of the harvesting process: {full['peak_rss_mib']:.1f} MiB")
        print(f"  records == simulator live set: {'yes' if full_equal else 'NO'} ({len(held):,} identifiers)")
        print(f"  after edit 1% / delete 0.5% / add 0.5% ({changed:,} distinct records changed): incremental fetched "
              f"{incr['fetched']:,} in {incr['pages']} pages ({changed:,} changed + {incr['unchanged']:,} unchanged "
              f"re-seen in the lag overlap), upserted {incr['upserted']:,}, purged {incr['purged']:,}, "
              f"{incr['total_seconds']:.1f} s; records == live set: {'yes' if incr_equal else 'NO'}")
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        print(f"\npeak RSS ratio {large[0]:,} / {small[0]:,} records: "
              f"{large[1]['peak_rss_mib'] / small[1]['peak_rss_mib']:.2f} "
              f"(collection {large[0] / small[0]:.0f}x larger)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
