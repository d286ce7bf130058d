"""Benchmark: a Sierra full load in one process against the same load cut into id-range slices.

A Sierra full load is limited by the harvesting process's own CPU (MARC decoding holds
Python's interpreter lock; benchmarks/sierra_full_load.py prints the split). A big
library's full load is planned as export id ranges that Airflow runs as mapped tasks,
each in its own process, so decoding spreads over the cores. Both runs here go the way
the DAG goes, each step in fresh processes like Airflow workers: freeze and plan
(``pipeline.plan_slices``), the pieces (one process per slice, all at once), then the
deletion poll and the apply. Each ends with ``records`` compared with the simulator's
live set, id for id, and the completeness check of every slice.

    .venv/bin/python benchmarks/sierra_sliced_load.py [--bibs 100000] [--slices 2] [--limit 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from typing import TYPE_CHECKING

from benchmarks import support  # noqa: E402

if TYPE_CHECKING:
    from partner_harvest.registry import Partner

KEY, SECRET = "bench-key", "bench-secret"
PARTNER = "bench_sierra_slices"


def _partner(args: argparse.Namespace) -> Partner:
    per_slice = max(1, args.bibs // args.slices)
    slicing = {"threshold_records": per_slice, "target_records": per_slice, "max_slices": args.slices} \
        if args.slices > 1 else {"max_slices": 1}
    return support.partner(id=PARTNER, protocol="sierra", page_size=2000, options={"export": {"limit": args.limit}},
                           slicing=slicing)


def child(args: argparse.Namespace) -> None:
    """One worker's part: ``plan`` (freeze + plan), ``piece`` (one slice) or ``finish``
    (deletion poll + apply)."""
    from partner_harvest import pipeline
    from partner_harvest import run as recipe
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.store import connect
    from partner_harvest.window import Window

    if os.environ.get("HARVEST_BENCH_LOG"):  # each worker's log with times, on its stderr
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s")
    partner = _partner(args)
    adapter = build_adapter(partner, Endpoint(args.url, KEY, SECRET))
    started = time.perf_counter()
    with connect(args.db) as conn:
        if args.step == "plan":
            window = recipe.freeze(partner, adapter, conn, request=pipeline.RunRequest("incremental"))
            pieces = recipe.plan(partner, adapter, conn, args.run_id, window)
            print(json.dumps({"window": window.to_dict(), "pieces": pieces}))
            return
        window = Window.from_dict(json.loads(args.window))
        if args.step == "piece":
            stats = recipe.stage_channel(adapter, conn, args.run_id, window, args.channel)
            print(json.dumps({"fetched": stats.fetched, "seconds": time.perf_counter() - started,
                              "cpu_seconds": time.process_time(), "peak_rss_mib": support.peak_rss_mib()}))
            return
        recipe.stage_channel(adapter, conn, args.run_id, window, "deletions")
        applied = time.perf_counter()
        result = recipe.apply(conn, PARTNER, args.run_id, window, recipe.Kept(), None)
        checks = conn.execute("SELECT channel, check_ok FROM harvest_runs WHERE partner_id = %s AND run_id = %s"
                              " AND check_kind IS NOT NULL", (PARTNER, args.run_id)).fetchall()
        print(json.dumps({**result.as_dict(), "apply_seconds": time.perf_counter() - applied,
                          "checks": dict(checks)}))


def run(url: str, db: str, args: argparse.Namespace, slices: int, run_id: str) -> dict:
    common = ("--url", url, "--db", db, "--bibs", str(args.bibs), "--slices", str(slices), "--run-id", run_id,
              "--limit", str(args.limit))
    started = time.perf_counter()
    plan = support.run_child(__file__, *common, "--step", "plan")
    window = json.dumps(plan["window"])
    pieces = support.run_children_at_once(__file__, common, window, [p["channel"] for p in plan["pieces"]])
    harvested = time.perf_counter()
    finished = support.run_child(__file__, *common, "--step", "finish", "--window", window)
    wall = time.perf_counter() - started
    return {"pieces": len(plan["pieces"]), "wall": wall, "harvest": harvested - started,
            "apply": finished["apply_seconds"], "upserted": finished["upserted"], "checks": finished["checks"],
            "cpu": sum(p["cpu_seconds"] for p in pieces), "rss": max(p["peak_rss_mib"] for p in pieces)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bibs", type=int, default=100_000)
    parser.add_argument("--slices", type=int, default=2)
    parser.add_argument("--limit", type=int, default=2000, help="options.export.limit")
    support.child_arguments(parser, "--step", "--window", "--channel")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    print(f"Sierra full load, {args.bibs:,} bibs (5% deleted, 3% suppressed), export limit {args.limit}: one process "
          f"against {args.slices} id-range slices in parallel processes; {os.cpu_count()} CPUs")
    db = support.fresh_database(PARTNER)
    sim_args = ("--bibs", str(args.bibs), "--deleted-fraction", "0.05", "--suppressed-fraction", "0.03",
                "--client-key", KEY, "--client-secret", SECRET)
    ok, figures = True, {}
    with support.simulator("sierra", *sim_args) as url:
        support.control(url, "warm_export", {})  # the simulator's MARC encoding is not what is measured
        live = support.control(url, "live_ids")
        for label, slices in (("one process", 1), (f"{args.slices} slices", args.slices)):
            support.forget(db, PARTNER)
            load = os.getloadavg()[0]
            figures[label] = f = run(url, db, args, slices, f"load-{slices}")
            equal = support.held_ids(db, PARTNER) == live
            checks_ok = bool(f["checks"]) and all(f["checks"].values())
            ok = ok and equal and checks_ok
            print(f"  {label:>12}: {f['pieces']} piece(s), {len(live) / f['wall']:,.0f} live bibs/s end to end "
                  f"({f['wall']:.1f} s: harvest {f['harvest']:.1f} s, apply {f['apply']:.1f} s); harvesting CPU "
                  f"{f['cpu']:.1f} s; peak RSS per worker {f['rss']:.0f} MiB; records == live set: "
                  f"{'yes' if equal else 'NO'}; completeness checks {f['checks']}; "
                  f"load {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    one, sliced = figures["one process"], figures[f"{args.slices} slices"]
    rate = len(live) / sliced["wall"]
    print(f"  {args.slices} slices / one process: {one['wall'] / sliced['wall']:.2f}x; "
          f"sliced full load {rate:,.0f} bibs/s (target >= 5,000: {'met' if rate >= 5000 else 'NOT met'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
