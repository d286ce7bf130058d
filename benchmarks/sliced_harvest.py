"""Benchmark: one token chain against a full harvest cut into slices harvested in parallel.

The OAI-PMH simulator serves ``--records`` records (5% deleted, 500 a page) with a delay
of ``--latency`` seconds per response (a real repository answers a page in 0.2-2 s; the
delay is added around the simulator's handler here, a sleep that holds no lock). Each
harvest runs in fresh processes like Airflow workers would: the chain is one process
(freeze, plan kept whole, harvest, apply); the sliced run is a planning process, then one
process per slice at once (a pool of ``--slices`` slots), then the apply. Both end with
``records`` compared with the simulator's live set, identifier for identifier.

Printed: wall time and records/s end to end (staged and applied) of each, and the ratio.

    .venv/bin/python benchmarks/sliced_harvest.py [--records 200000] [--slices 4] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from typing import TYPE_CHECKING

from benchmarks import support  # noqa: E402

if TYPE_CHECKING:
    from partner_harvest.registry import Partner

PARTNER = "bench_slices"


def _partner(args: argparse.Namespace) -> Partner:
    per_slice = max(1, args.records // (2 * args.slices))
    slicing = {"threshold_records": per_slice, "target_records": per_slice, "max_slices": args.slices} \
        if args.slices > 1 else {"max_slices": 1}
    return support.partner(id=args.partner, protocol="oai-pmh", metadata_prefix="oai_dc", slicing=slicing)


def child(args: argparse.Namespace) -> None:
    """One worker's part: ``plan`` (freeze + plan), ``piece`` (one slice) or ``apply``."""
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.store import connect
    from partner_harvest.window import Window

    partner = _partner(args)
    adapter = build_adapter(partner, Endpoint(args.url))
    with connect(args.db) as conn:
        if args.step == "plan":
            window = pipeline.freeze_window(adapter, partner.lag, None, pipeline.RunRequest("incremental"))
            pieces = pipeline.pieces(pipeline.plan_slices(adapter, conn, args.partner, args.run_id, window,
                                                          partner.slicing))
            print(json.dumps({"window": window.to_dict(), "pieces": pieces}))
        elif args.step == "piece":
            window = Window.from_dict(json.loads(args.window))
            stats = pipeline.harvest_piece(adapter, conn, args.partner, args.run_id, window, args.channel)
            print(json.dumps({"fetched": stats.fetched, "pages": stats.pages, "peak_rss_mib": support.peak_rss_mib()}))
        else:
            started = time.perf_counter()
            result = pipeline.apply_changes(conn, args.partner, args.run_id)
            print(json.dumps({**result.as_dict(), "apply_seconds": time.perf_counter() - started}))


def run(script: str, url: str, db: str, args: argparse.Namespace, slices: int, run_id: str) -> dict:
    common = ("--url", url, "--db", db, "--records", str(args.records), "--slices", str(slices), "--run-id", run_id,
              "--partner", getattr(args, "partner", PARTNER))
    started = time.perf_counter()
    plan = support.run_child(script, *common, "--step", "plan")
    planned = time.perf_counter()
    window = json.dumps(plan["window"])
    results = support.run_children_at_once(script, common, window, [p["channel"] for p in plan["pieces"]])
    harvested = time.perf_counter()
    applied = support.run_child(script, *common, "--step", "apply")
    wall = time.perf_counter() - started
    return {"pieces": len(plan["pieces"]), "wall": wall, "fetched": applied["fetched"],
            "pages": sum(r["pages"] for r in results), "apply_seconds": applied["apply_seconds"],
            "plan_seconds": planned - started, "harvest_seconds": harvested - planned,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--no-chain", action="store_true",
                        help="only the sliced harvest (a big run's comparison chain would take hours)")
    parser.add_argument("--baseline-records", type=int, default=0,
                        help="first a sliced harvest of this many records from a second simulator: "
                             "the peak RSS per worker of the big run is printed against it")
    support.child_arguments(parser, "--step", "--window", "--channel")
    parser.add_argument("--partner", default=PARTNER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    baseline = _baseline(args) if args.baseline_records else None
    ok, figures = _compare(args)
    if baseline is not None:
        big = figures[f"{args.slices} slices"]
        print(f"  peak RSS per worker: {big['peak_rss_mib']:.0f} MiB at {args.records:,} records, "
              f"{baseline['peak_rss_mib']:.0f} MiB at {args.baseline_records:,}: "
              f"{big['peak_rss_mib'] / baseline['peak_rss_mib']:.2f}x for {args.records / args.baseline_records:.0f}x the records")
    if args.no_chain:
        return 0 if ok else 1
    chain, sliced = figures["one chain"], figures[f"{args.slices} slices"]
    print(f"  speed-up of {args.slices} slices over one chain: {chain['wall'] / sliced['wall']:.2f}x")
    return 0 if ok else 1


def _baseline(args: argparse.Namespace) -> dict:
    """The same sliced harvest of --baseline-records (peak RSS per worker should not grow)."""
    small = argparse.Namespace(**{**vars(args), "records": args.baseline_records, "no_chain": True})
    print(f"Baseline: {args.baseline_records:,} records")
    ok, figures = _compare(small)
    if not ok:
        raise SystemExit("the baseline harvest was not exact")
    return figures[f"{args.slices} slices"]


def _compare(args: argparse.Namespace) -> tuple[bool, dict]:
    from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
    built = time.perf_counter()
    repo = SimulatedRepository(records=args.records, page_size=500, deleted_fraction=0.05, seed=3)
    # the partner's response time: concurrent requests wait side by side
    sim = OaiSimulator(repo, response_delay_ms=args.latency * 1000)
    against = "" if args.no_chain else "one chain against "
    print(f"Sliced harvest benchmark: {args.records:,} records, 500 a page, {args.latency * 1000:.0f} ms a response; "
          f"{against}{args.slices} slices in parallel processes (simulator built in {time.perf_counter() - built:.0f} s)")
    live = repo.live_identifiers()
    ok = True
    figures = {}
    runs = ([] if args.no_chain else [("one chain", 1)]) + [(f"{args.slices} slices", args.slices)]
    with sim:
        db = support.fresh_database(args.partner)
        # each load a first load under its own partner id, settled before any is measured
        loads = {slices: argparse.Namespace(**{**vars(args), "partner": f"{args.partner}_{slices}"})
                 for _, slices in runs}
        print(f"  (settled: the partners forgotten and the tables vacuumed in "
              f"{support.settle(db, [load.partner for load in loads.values()]):.1f} s)")
        for label, slices in runs:
            load = loads[slices]
            figures[label] = result = run(__file__, sim.base_url, db, load, slices, f"bench-{slices}")
            equal = support.held_ids(db, load.partner) == live
            ok = ok and equal
            print(f"  {label:>10}: {result['pieces']} piece(s), {result['pages']} pages, {result['wall']:.1f} s wall, "
                  f"{result['fetched'] / result['wall']:,.0f} records/s end to end (plan {result['plan_seconds']:.1f} s, "
                  f"harvest {result['harvest_seconds']:.1f} s, apply {result['apply_seconds']:.1f} s), "
                  f"peak RSS per worker {result['peak_rss_mib']:.0f} MiB; records == live set: {'yes' if equal else 'NO'}")
    return ok, figures


if __name__ == "__main__":
    raise SystemExit(main())
