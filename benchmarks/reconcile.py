"""Benchmark: the weekly full reconcile of an OAI-PMH partner that never sends tombstones.

Starts the OAI-PMH simulator (``deletedRecord`` = ``no``, 500 headers per page) in its own
process, loads the collection with a full harvest, lets 1,000 records vanish upstream
without a trace, then runs the reconcile in a fresh process (ListIdentifiers sweep staged
in PostgreSQL, plan, guard, apply) and prints its duration, peak RSS and what it removed;
then lets 20% vanish and shows the mass-purge guard refusing.

    .venv/bin/python benchmarks/reconcile.py [--records 200000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from typing import TYPE_CHECKING, Any

from benchmarks import support  # noqa: E402

if TYPE_CHECKING:
    from partner_harvest.registry import Partner


def partner() -> Partner:
    return support.partner(id="bench_reconcile", protocol="oai-pmh", metadata_prefix="oai_dc")


def child(args: argparse.Namespace) -> None:
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.reconcile import MassPurgeRefused, reconcile
    from partner_harvest.run import run_partner
    from partner_harvest.store import connect

    p = partner()
    adapter = build_adapter(p, Endpoint(args.url))
    started = time.perf_counter()
    out: dict[str, Any]
    with connect(args.db) as conn:
        if args.what == "load":
            out = dict(run_partner(p, adapter, conn, args.run_id).applied.as_dict())
        else:
            try:
                out = reconcile(adapter, conn, p, args.run_id).as_dict()
            except MassPurgeRefused as exc:
                out = {"refused": exc.cause}
    out["seconds"] = time.perf_counter() - started
    out["peak_rss_mib"] = support.peak_rss_mib()
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200000)
    support.child_arguments(parser)
    parser.add_argument("--what", choices=["load", "reconcile"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    pid = partner().id
    db = support.fresh_database(pid)
    sim_args = ("--records", str(args.records), "--deleted-fraction", "0", "--deleted-record", "no",
                "--page-size", "500", "--formats", "oai_dc")
    with support.simulator("oai_pmh", *sim_args) as url:

        def run(what: str, run_id: str) -> dict:
            return support.run_child(__file__, "--what", what, "--url", url, "--db", db, "--run-id", run_id)

        load = run("load", "load")
        print(f"reconcile benchmark: {args.records:,} records, deletedRecord=no, 500 headers per page")
        print(f"  initial full harvest: {load['upserted']:,} records in {load['seconds']:.1f} s")
        gone = min(1000, args.records // 200)  # 1,000 of 200,000: well under the 5% guard
        vanished = set(support.control(url, "mutate", {"delete": gone})["deleted"])
        result = run("reconcile", "reconcile-1")
        held = support.held_ids(db, pid)
        same = held == support.control(url, "live_ids")
        print(f"  {gone:,} vanished without tombstones -> reconcile: {result['seconds']:.1f} s, "
              f"peak RSS {result['peak_rss_mib']:.1f} MiB; swept {result['upstream_live']:,} ids, "
              f"purged {result['purged']:,} (exactly the vanished: {'yes' if result['purged'] == len(vanished) else 'NO'}); "
              f"records == live set: {'yes' if same else 'NO'}")
        support.control(url, "mutate", {"delete": args.records // 5})
        refused = run("reconcile", "reconcile-2")
        untouched = support.held_ids(db, pid) == held
        print(f"  20% vanished -> {'refused' if 'refused' in refused else 'APPLIED'} in {refused['seconds']:.1f} s "
              f"(peak RSS {refused['peak_rss_mib']:.1f} MiB); records untouched: {'yes' if untouched else 'NO'}")
        print(f"    {refused.get('refused', '')}")
        return 0 if same and untouched and "refused" in refused else 1


if __name__ == "__main__":
    raise SystemExit(main())
