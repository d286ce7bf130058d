"""Benchmark: a Sierra full load through the two-phase MARC export, then an incremental run.

For each size (default 10,000 then 100,000 bibs; 5% deleted and 3% suppressed, spread
over every export block) and each ``options.export.limit`` (default 2000 and 5000, which
the client pages at Sierra's 2000) it starts the Sierra simulator in its own process, runs
a full load in a fresh harvesting process (export, pymarc, MARCXML, staging, then the
JSON API id enumeration that proves completeness and fetches what the export missed,
apply), checks ``records`` against the simulator's live set, then lets the catalogue edit
1%, delete 0.5% and add 0.5% and runs an incremental harvest (change poll + deletion
poll on its day cursor).

Unless ``--no-baseline``, the same full load first runs through the old decoding path
(pymarc and lxml for every record; ``baselines.pymarc_for_every_record``) (its rows dropped
afterwards), so the ratio new/old is measured against the same simulator in the same run.
The 1-minute load average is printed with each figure (the machine may be shared).
Before both full loads the simulator pre-encodes its export records (``warm_export``), so
its pure-Python MARC encoder does not compete with the harvester for the CPU during the
measurement (``--cold-simulator`` encodes on request, as before).

Printed per run: bibs/s of the full load, its time split (export, id enumeration, apply:
wall time and the CPU of the harvester, the simulator and the embedded PostgreSQL), the completeness check (listed, staged by
the export, fetched), peak RSS of the harvesting process, what the incremental run
fetched on each channel; and the RSS ratio between the sizes.

    .venv/bin/python benchmarks/sierra_full_load.py [--sizes 10000,100000] [--limits 2000,5000]
        [--export-omits-suppressed]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402

KEY, SECRET = "bench-key", "bench-secret"


def child(args: argparse.Namespace) -> None:
    """The harvesting process: freeze, both channels, apply; report its own figures."""
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.run import run_partner
    from partner_harvest.sierra import export
    from partner_harvest.sierra.spec import DELETIONS
    from partner_harvest.store import connect
    from partner_harvest.store.db import one
    from partner_harvest.window import parse_instant

    partner = support.partner(id="bench_sierra", protocol="sierra", page_size=2000,
                              options={"export": {"limit": args.limit}})
    adapter = build_adapter(partner, Endpoint(args.url, KEY, SECRET))
    if args.old_marc:
        from benchmarks import baselines

        baselines.pymarc_for_every_record()  # the baseline: every record through pymarc + lxml
    cursor = parse_instant(args.cursor) if args.cursor else None
    deletions = parse_instant(args.deletions_cursor) if args.deletions_cursor else None
    marks: dict[str, tuple[float, float, float, float | None]] = {}

    def mark(name: str) -> None:
        """Wall, this process's CPU, the simulator's CPU, PostgreSQL's CPU at a phase boundary."""
        state = support.control(args.url, "state")
        marks[name] = (time.perf_counter(), time.process_time(), state["process_cpu_seconds"],
                       support.postgres_cpu_seconds())

    def timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:  # the adapter's two phases, from outside
        def run(*a: Any, **k: Any) -> Any:
            mark(f"{name} start")
            try:
                return method(*a, **k)
            finally:
                mark(f"{name} end")
        return run

    export._Keyset.run = timed("export", export._Keyset.run)  # type: ignore[method-assign]
    export.FullLoad._prove_complete = timed("enumeration", export.FullLoad._prove_complete)  # type: ignore[method-assign]
    mark("start")
    started, cpu_started = time.perf_counter(), time.process_time()
    harvested: dict[str, float] = {}

    def staged(channel: str) -> None:  # both channels in staging: the apply starts next
        if channel == DELETIONS:
            harvested.update(wall=time.perf_counter(), cpu=time.process_time())
            mark("apply start")

    with connect(args.db) as conn:  # the DAG's steps (partner_harvest.run)
        run = run_partner(partner, adapter, conn, args.run_id, {"changes": cursor, DELETIONS: deletions},
                          on_staged=staged)
        applied = time.perf_counter()
        mark("apply end")
        check = one(conn.execute(
            "SELECT check_kind, check_expected, check_found, check_ok, check_detail FROM harvest_runs"
            " WHERE partner_id = %s AND run_id = %s AND channel = 'changes'", (partner.id, args.run_id)))
        conn.commit()
    window, changes, polled, result = run.window, run.changes, run.staged[DELETIONS], run.applied
    split = {}
    for phase in ("export", "enumeration", "apply"):
        if f"{phase} start" in marks:
            begin, end = marks[f"{phase} start"], marks[f"{phase} end"]
            split[phase] = {"wall": end[0] - begin[0], "harvester_cpu": end[1] - begin[1],
                            "simulator_cpu": end[2] - begin[2],
                            "postgres_cpu": None if begin[3] is None or end[3] is None else end[3] - begin[3]}
    print(json.dumps({
        "until": window.to_dict()["until"],
        "deletions_until": window.protocol.channels["deletions"].until.date().isoformat(),
        "changes_fetched": changes.fetched, "deletions_fetched": polled.fetched, "pages": changes.pages,
        "upserted": result.upserted, "purged": result.purged, "unchanged": result.unchanged,
        "quarantined": result.quarantined,
        "harvest_seconds": harvested["wall"] - started, "total_seconds": applied - started,
        "harvest_cpu_seconds": harvested["cpu"] - cpu_started,
        "peak_rss_mib": support.peak_rss_mib(), "split": split,
        "check": dict(zip(("kind", "expected", "found", "ok", "detail"), check)),
    }))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--limits", default="2000,5000", help="options.export.limit values to run")
    parser.add_argument("--limit", type=int, default=2000, help=argparse.SUPPRESS)
    parser.add_argument("--export-omits-suppressed", action="store_true",
                        help="the simulated export leaves suppressed bibs out (the id enumeration must fetch them)")
    parser.add_argument("--cold-simulator", action="store_true",
                        help="let the simulator encode each export record while it is exported (its pure-Python "
                             "MARC encoder then shares the CPU with the harvester)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the full load through the old pymarc path (the ratio's baseline)")
    parser.add_argument("--old-marc", action="store_true", help=argparse.SUPPRESS)
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

    omit = ["--export-omits-suppressed"] if args.export_omits_suppressed else []
    warmth = ("cold simulator (export records encoded on request)" if args.cold_simulator
              else "export records pre-encoded by the simulator (warm_export) before both full loads")
    print("Sierra benchmark: 5% deleted and 3% suppressed bibs spread over every export block"
          f"{' (the export omits suppressed bibs)' if omit else ''}; change/deletion polls of 2,000; "
          "simulator and harvester in separate processes; PostgreSQL "
          f"{'given' if os.environ.get('HARVEST_DATABASE_URL') else 'embedded'}; {warmth}; "
          f"{os.cpu_count()} CPUs")
    rows, ok = [], True
    sizes, limits = [int(s) for s in args.sizes.split(",")], [int(v) for v in args.limits.split(",")]
    for size, limit in itertools.product(sizes, limits):
        db = support.fresh_database("bench_sierra")
        sim_args = ("--bibs", str(size), "--deleted-fraction", "0.05", "--suppressed-fraction", "0.03",
                    "--client-key", KEY, "--client-secret", SECRET, *omit)
        with support.simulator("sierra", *sim_args) as url:
            if not args.cold_simulator:
                support.control(url, "warm_export", {})
            baseline = None
            if not args.no_baseline:  # the old path first (same simulator); its rows are dropped after
                base_db = db
                load_before = os.getloadavg()[0]
                baseline = support.run_child(__file__, "--url", url, "--db", base_db, "--run-id", f"old-{size}-{limit}",
                                             "--limit", str(limit), "--old-marc")
                baseline["load"] = (load_before, os.getloadavg()[0])
                baseline["equal"] = support.held_ids(base_db, "bench_sierra") == support.control(url, "live_ids")
                support.forget(base_db, "bench_sierra")
            load_before = os.getloadavg()[0]
            full = support.run_child(__file__, "--url", url, "--db", db, "--run-id", f"full-{size}-{limit}",
                                     "--limit", str(limit))
            full["load"] = (load_before, os.getloadavg()[0])
            live = support.control(url, "live_ids")
            full_equal = support.held_ids(db, "bench_sierra") == live
            support.control(url, "advance_clock", {"seconds": 3600})
            changes = support.control(url, "mutate", {"edit": size // 100, "delete": size // 200, "add": size // 200})
            edited, deleted, added = set(changes["edited"]), set(changes["deleted"]), set(changes["added"])
            incr = support.run_child(__file__, "--url", url, "--db", db, "--run-id", f"incr-{size}-{limit}",
                                     "--cursor", full["until"], "--deletions-cursor", full["deletions_until"],
                                     "--limit", str(limit))
            upstream = support.control(url, "live_ids")
            incr_equal = support.held_ids(db, "bench_sierra") == upstream
        expected_changes = len(edited - deleted) + len(added)
        # Everything changed lands; anything else fetched is the lag/day overlap (unchanged).
        only_changes = incr["upserted"] == expected_changes and incr["purged"] == len(deleted)
        check = full["check"]
        check_ok = bool(check["ok"]) and check["expected"] == len(live)
        ok = ok and full_equal and incr_equal and only_changes and check_ok
        rows.append((size, full))
        print(f"\n{size:,} bibs ({len(live):,} live), options.export.limit {limit}")
        rate = full['changes_fetched'] / full['harvest_seconds']
        print(f"  full load (export + id enumeration): {rate:,.0f} bibs/s "
              f"exported+parsed+staged ({full['harvest_seconds']:.1f} s); {full['changes_fetched'] / full['total_seconds']:,.0f} "
              f"bibs/s including apply ({full['total_seconds']:.1f} s); {full['pages']} pages staged; "
              f"harvester CPU {full['harvest_cpu_seconds']:.1f} s; "
              f"loadavg {full['load'][0]:.2f} before, {full['load'][1]:.2f} after")
        if baseline is not None:
            old_rate = baseline['changes_fetched'] / baseline['harvest_seconds']
            ok = ok and baseline["equal"]
            print(f"  old path (pymarc + lxml for every record), same simulator: {old_rate:,.0f} bibs/s "
                  f"({baseline['harvest_seconds']:.1f} s, harvester CPU {baseline['harvest_cpu_seconds']:.1f} s; "
                  f"records == live set: {'yes' if baseline['equal'] else 'NO'}; "
                  f"loadavg {baseline['load'][0]:.2f} before, {baseline['load'][1]:.2f} after); "
                  f"new / old: {rate / old_rate:.2f}x")
        for phase, figures in full["split"].items():
            pg = "n/a" if figures["postgres_cpu"] is None else f"{figures['postgres_cpu']:.1f} s"
            print(f"  time split, {phase}: {figures['wall']:.1f} s wall; CPU: harvester {figures['harvester_cpu']:.1f} s "
                  f"(all its threads), simulator {figures['simulator_cpu']:.1f} s, PostgreSQL {pg}")
        print(f"  completeness check {check['kind']}: expected {check['expected']:,} live ids, the export staged "
              f"{check['found']:,}, ok={check['ok']}; {check['detail']}")
        print(f"  peak RSS of the harvesting process: {full['peak_rss_mib']:.1f} MiB")
        print(f"  records == simulator live set: {'yes' if full_equal else 'NO'} "
              f"(upserted {full['upserted']:,}, quarantined {full['quarantined']:,})")
        print(f"  after edit 1% / delete 0.5% / add 0.5%: change poll fetched {incr['changes_fetched']:,} "
              f"({expected_changes:,} edited-and-live or added + re-seen in the 10-minute lag), deletion poll fetched "
              f"{incr['deletions_fetched']:,} ({len(deleted):,} new + re-seen in the day overlap), "
              f"upserted {incr['upserted']:,}, purged {incr['purged']:,}, {incr['total_seconds']:.1f} s; "
              f"records == live set: {'yes' if incr_equal else 'NO'}")
    if len(sizes) > 1:
        small, large = rows[0], rows[-1]
        print(f"\npeak RSS ratio {large[0]:,} / {small[0]:,} bibs: {large[1]['peak_rss_mib'] / small[1]['peak_rss_mib']:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
