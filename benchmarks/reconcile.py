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
import os
import resource
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]


def partner():
    from partner_harvest.registry import Partner

    return Partner(id="bench_reconcile", protocol="oai-pmh", conn_id="-", metadata_prefix="oai_dc",
                   lag=timedelta(minutes=10))


def child(args: argparse.Namespace) -> None:
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.reconcile import MassPurgeRefused, reconcile
    from partner_harvest.store import RunRef, connect

    p = partner()
    adapter = build_adapter(p, Endpoint(args.url))
    started = time.perf_counter()
    with connect(args.db) as conn:
        if args.what == "load":
            window = pipeline.freeze_window(adapter, p.lag, None, pipeline.RunRequest("incremental"))
            pipeline.harvest_window(adapter, conn, RunRef(p.id, args.run_id), window)
            out = pipeline.apply_changes(conn, p.id, args.run_id).as_dict()
        else:
            try:
                out = reconcile(adapter, conn, p, args.run_id).as_dict()
            except MassPurgeRefused as exc:
                out = {"refused": exc.cause}
    out["seconds"] = time.perf_counter() - started
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def run_child(url: str, db: str, what: str, run_id: str) -> dict:
    cmd = [sys.executable, __file__, "--child", what, "--url", url, "--db", db, "--run-id", run_id]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def control(url: str, action: str, body: dict | None = None) -> object:
    base = url.rsplit("/", 1)[0]
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{base}/_control/{action}", data=data), timeout=300) as r:
        payload = r.read().decode()
    return set(payload.split()) if action == "live_ids" else json.loads(payload)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200000)
    parser.add_argument("--child", choices=["load", "reconcile"])
    parser.add_argument("--url")
    parser.add_argument("--db")
    parser.add_argument("--run-id")
    args = parser.parse_args()
    if args.child:
        args.what = args.child
        child(args)
        return 0

    from include import embedded_pg
    from partner_harvest.store import connect, ensure_schema
    from partner_harvest.store.admin import forget_partner, live_identifiers

    db = embedded_pg.start("bench")
    with connect(db) as conn:
        ensure_schema(conn)
        forget_partner(conn, partner().id)
    cmd = [sys.executable, "-m", "include.simulators.oai_pmh", "--records", str(args.records), "--deleted-fraction", "0",
           "--deleted-record", "no", "--page-size", "500", "--formats", "oai_dc", "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip().removeprefix("listening on ")
        load = run_child(url, db, "load", "load")
        print(f"reconcile benchmark: {args.records:,} records, deletedRecord=no, 500 headers per page")
        print(f"  initial full harvest: {load['upserted']:,} records in {load['seconds']:.1f} s")
        vanished = set(control(url, "mutate", {"delete": 1000})["deleted"])
        result = run_child(url, db, "reconcile", "reconcile-1")
        with connect(db) as conn:
            held = live_identifiers(conn, partner().id)
        same = held == control(url, "live_ids")
        print(f"  1,000 vanished without tombstones -> reconcile: {result['seconds']:.1f} s, "
              f"peak RSS {result['peak_rss_mib']:.1f} MiB; swept {result['upstream_live']:,} ids, "
              f"purged {result['purged']:,} (exactly the vanished: {'yes' if result['purged'] == len(vanished) else 'NO'}); "
              f"records == live set: {'yes' if same else 'NO'}")
        control(url, "mutate", {"delete": args.records // 5})
        refused = run_child(url, db, "reconcile", "reconcile-2")
        with connect(db) as conn:
            untouched = live_identifiers(conn, partner().id) == held
        print(f"  20% vanished -> {'refused' if 'refused' in refused else 'APPLIED'} in {refused['seconds']:.1f} s "
              f"(peak RSS {refused['peak_rss_mib']:.1f} MiB); records untouched: {'yes' if untouched else 'NO'}")
        print(f"    {refused.get('refused', '')}")
        return 0 if same and untouched and "refused" in refused else 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
