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
import resource
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]


def child(args: argparse.Namespace) -> None:
    """The harvesting process: one window, then report its own figures as JSON."""
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.registry import Partner
    from partner_harvest.store import RunRef, connect
    from partner_harvest.window import parse_instant

    partner = Partner(id="bench", protocol="oai-pmh", conn_id="-", metadata_prefix=args.prefix,
                      lag=timedelta(minutes=10))
    adapter = build_adapter(partner, Endpoint(args.url))
    cursor = parse_instant(args.cursor) if args.cursor else None
    started = time.perf_counter()
    window = pipeline.freeze_window(adapter, partner.lag, cursor, pipeline.RunRequest("incremental"))
    with connect(args.db) as conn:
        stats = pipeline.harvest_window(adapter, conn, RunRef("bench", args.run_id), window)
        harvested = time.perf_counter()
        result = pipeline.apply_changes(conn, "bench", args.run_id)
    applied = time.perf_counter()
    print(json.dumps({
        "until": window.to_dict()["until"],
        "fetched": stats.fetched, "pages": stats.pages,
        "upserted": result.upserted, "purged": result.purged, "unchanged": result.unchanged,
        "quarantined": result.quarantined,
        "harvest_seconds": harvested - started, "total_seconds": applied - started,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


@contextmanager
def simulator(records: int, page_size: int) -> Iterator[str]:
    cmd = [sys.executable, "-m", "include.simulators.oai_pmh", "--records", str(records),
           "--deleted-fraction", "0.05", "--page-size", str(page_size), "--granularity", "seconds",
           "--formats", "oai_dc,lido", "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        yield line.removeprefix("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def control(url: str, action: str, body: dict | None = None) -> object:
    base = url.rsplit("/", 1)[0]
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{base}/_control/{action}", data=data), timeout=120) as r:
        payload = r.read().decode()
    return set(payload.split()) if action == "live_ids" else json.loads(payload)


def run_child(url: str, db: str, run_id: str, prefix: str, cursor: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--url", url, "--db", db, "--run-id", run_id, "--prefix", prefix]
    if cursor:
        cmd += ["--cursor", cursor]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ""})
    return json.loads(out.stdout.strip().splitlines()[-1])


def held_ids(db: str) -> set[str]:
    from partner_harvest.store import connect
    from partner_harvest.store.admin import live_identifiers

    with connect(db) as conn:
        return live_identifiers(conn, "bench")


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

    from include import embedded_pg
    from partner_harvest.store import connect, ensure_schema
    from partner_harvest.store.admin import forget_partner

    db = embedded_pg.start("bench")
    print(f"OAI-PMH harvest benchmark: page size {args.page_size}, prefix {args.prefix}, "
          f"5% deleted; simulator and harvester in separate processes; PostgreSQL {'given' if os.environ.get('HARVEST_DATABASE_URL') else 'embedded'}")
    rows = []
    ok = True
    for size in [int(s) for s in args.sizes.split(",")]:
        with connect(db) as conn:
            ensure_schema(conn)
            forget_partner(conn, "bench")
        with simulator(size, args.page_size) as url:
            full = run_child(url, db, f"full-{size}", args.prefix, None)
            upstream = control(url, "live_ids")
            held = held_ids(db)
            full_equal = held == upstream
            changes = control(url, "mutate", {"edit": size // 100, "delete": size // 200, "add": size // 200})
            changed = len(set(changes["edited"]) | set(changes["deleted"]) | set(changes["added"]))
            incr = run_child(url, db, f"incr-{size}", args.prefix, full["until"])
            upstream = control(url, "live_ids")
            incr_equal = held_ids(db) == upstream
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
