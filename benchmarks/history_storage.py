"""Benchmark: what 30 days of history cost, for a partner of 100,000 records with 1 % daily change.

Starts the OAI-PMH simulator (oai_dc, 500 records per page) in its own process, loads the
collection with a full harvest, then plays ``--days`` nights: each edits ``--change`` of the
records upstream (new versions, new datestamps) and runs the partner incrementally through
the run recipe (partner_harvest.run), whose apply keeps every replaced version in
``record_history``. With ``history_retention`` at 30 days (the default) the history of 30
nights is what the table holds at steady state (each freeze drops what is older). Prints the
sizes on disk of ``record_history`` (table, TOAST and index) against ``records`` in the same
database, per night and at the end, and the nightly apply's time.

    .venv/bin/python benchmarks/history_storage.py [--records 100000] [--days 30] [--change 0.01]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402

_SIZE = "SELECT pg_total_relation_size(%s::regclass)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--change", type=float, default=0.01)
    args = parser.parse_args()

    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.run import run_partner
    from partner_harvest.store import connect
    from partner_harvest.store.db import one, scalar

    p = support.partner(id="bench_history", protocol="oai-pmh", metadata_prefix="oai_dc", lag="0s")
    db = support.fresh_database(p.id)
    sim_args = ("--records", str(args.records), "--deleted-fraction", "0", "--page-size", "500",
                "--formats", "oai_dc")
    edits = round(args.records * args.change)
    with support.simulator("oai_pmh", *sim_args) as url, connect(db) as conn:
        adapter = build_adapter(p, Endpoint(url))
        load = run_partner(p, adapter, conn, "load")
        cursors = load.cursors

        def sizes() -> tuple[int, int]:
            row = one(conn.execute(f"SELECT ({_SIZE}), ({_SIZE})", ("records", "record_history")))
            conn.commit()
            return int(row[0]), int(row[1])

        records_bytes, _ = sizes()
        print(f"history storage benchmark: {args.records:,} records, {edits:,} edited a night "
              f"({args.change:.1%}), {args.days} nights, retention 30 days")
        print(f"  first load: {load.applied.upserted:,} records in {sum(load.seconds.values()):.1f} s; "
              f"records: {records_bytes / 2**20:.1f} MiB")
        applies = []
        for day in range(1, args.days + 1):
            support.control(url, "mutate", {"edit": edits})
            night = run_partner(p, adapter, conn, f"night-{day:02d}", cursors)
            cursors = night.cursors
            applies.append(night.seconds["apply"])
            records_bytes, history_bytes = sizes()
            if day in (1, 7, 14, 21, args.days):
                print(f"  night {day:2d}: upserted {night.applied.upserted:,}, apply {night.seconds['apply']:.2f} s; "
                      f"record_history {history_bytes / 2**20:.1f} MiB "
                      f"({history_bytes / records_bytes:.2f}x records, {history_bytes / (day * edits):.0f} B a version)")
        versions = scalar(conn.execute("SELECT count(*) FROM record_history"))
        held = one(conn.execute("SELECT count(*), avg(octet_length(metadata)) FROM records"))
        conn.commit()
        print(f"  after {args.days} nights: {versions:,} versions kept; record_history {history_bytes / 2**20:.1f} MiB "
              f"against records {records_bytes / 2**20:.1f} MiB ({history_bytes / records_bytes:.1%}); "
              f"{held[0]:,} records of {float(held[1]):.0f} B metadata on average")
        print(f"  nightly apply: median {statistics.median(applies):.2f} s, max {max(applies):.2f} s")
        live = support.control(url, "live_ids")
        same = support.held_ids(db, p.id) == live
        print(f"  records == live set: {'yes' if same else 'NO'}")
        return 0 if same and versions == args.days * edits else 1


if __name__ == "__main__":
    raise SystemExit(main())
