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
import resource
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

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
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


@contextmanager
def simulator(bibs: int) -> Iterator[str]:
    cmd = [sys.executable, "-m", "include.simulators.sierra", "--bibs", str(bibs), "--deleted-fraction", "0.02",
           "--port", "0", "--client-key", KEY, "--client-secret", SECRET]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        yield line.removeprefix("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def control(url: str, action: str, body: dict | None = None) -> object:
    base = url.split("/iii/")[0]
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{base}/_control/{action}", data=data), timeout=120) as r:
        payload = r.read().decode()
    return set(payload.split()) if action == "live_ids" else json.loads(payload)


def run_child(url: str, db: str, run_id: str, cursor: str | None, deletions_cursor: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--url", url, "--db", db, "--run-id", run_id]
    if cursor:
        cmd += ["--cursor", cursor, "--deletions-cursor", deletions_cursor]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def held_ids(db: str) -> set[str]:
    from partner_harvest.store import connect
    from partner_harvest.store.admin import live_identifiers

    with connect(db) as conn:
        return live_identifiers(conn, "bench_sierra")


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

    from include import embedded_pg
    from partner_harvest.store import connect, ensure_schema
    from partner_harvest.store.admin import forget_partner

    db = embedded_pg.start("bench")
    print("Sierra benchmark: export files of 2,000 bibs, change/deletion polls of 2,000; 2% deleted; "
          "simulator and harvester in separate processes; PostgreSQL "
          f"{'given' if os.environ.get('HARVEST_DATABASE_URL') else 'embedded'}")
    rows, ok = [], True
    for size in [int(s) for s in args.sizes.split(",")]:
        with connect(db) as conn:
            ensure_schema(conn)
            forget_partner(conn, "bench_sierra")
        with simulator(size) as url:
            full = run_child(url, db, f"full-{size}", None, None)
            full_equal = held_ids(db) == control(url, "live_ids")
            control(url, "advance_clock", {"seconds": 3600})
            changes = control(url, "mutate", {"edit": size // 100, "delete": size // 200, "add": size // 200})
            edited, deleted, added = set(changes["edited"]), set(changes["deleted"]), set(changes["added"])
            incr = run_child(url, db, f"incr-{size}", full["until"], full["deletions_until"])
            upstream = control(url, "live_ids")
            incr_equal = held_ids(db) == upstream
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
