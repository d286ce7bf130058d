"""Benchmark: a Sierra catalogue with items and holdings, loaded and then kept in step night by night.

A catalogue of ``--bibs`` bibs with ``--items`` items and ``--holdings`` holdings records (the
Sierra simulator, in this process, on loopback) is harvested by a partner with
``options.sierra.channels: [bibs, items, holdings]`` through the run recipe
(``partner_harvest.run.run_partner``, the DAG's steps): a full load, then ``--nights`` nights of
checkouts (updates), transfers between bibs, deletions and suppressions of items (and some
holdings and bib edits). After every night it checks that ``records``, ``items`` and
``holdings`` equal the simulator's public live sets (items with the bibs they belong to), and
that the change feed holds exactly one ``attachment_events`` row for each bib whose items or
holdings changed that night. Printed: wall time and requests of the load and of each night.

Then a quiet night (nothing changed) of the same partner against a partner of the same
catalogue with bibs only: requests and wall time of the quiet-night path (``run.quiet_night``,
what ``freeze_window`` runs on Airflow: one look per poll, then the apply) and of an ordinary
run, the median of ``--repeat`` each.

    .venv/bin/python benchmarks/sierra_items.py [--bibs 10000] [--items 25000] [--holdings 2000]
        [--nights 5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from typing import TYPE_CHECKING, Any

from benchmarks import support  # noqa: E402

if TYPE_CHECKING:
    import psycopg

    from partner_harvest.registry import Partner

KEY, SECRET = "bench-key", "bench-secret"
PARTNER, BIBS_ONLY = "bench_items", "bench_bibs_only"


def _partner(pid: str, channels: list[str]) -> Partner:
    return support.partner(id=pid, protocol="sierra", page_size=2000,
                           slicing={"threshold_records": 10000, "target_records": 10000, "max_slices": 4},
                           options={"sierra": {"suppressed": "purge", "channels": channels}})


def _held(conn: psycopg.Connection, table: str, pid: str) -> dict[str, tuple[str, ...]]:
    rows = conn.execute(f"SELECT identifier, bib_ids FROM {table} WHERE partner_id = %s", (pid,)).fetchall()
    conn.commit()
    return {i: tuple(sorted(b)) for i, b in rows}


def _events(conn: psycopg.Connection, pid: str, run_id: str) -> list[str]:
    from partner_harvest.store.db import one

    after, until = one(conn.execute("SELECT change_seq_after, change_seq_until FROM harvest_runs WHERE partner_id = %s "
                                "AND run_id = %s AND channel = 'changes'", (pid, run_id)))
    rows = conn.execute("SELECT identifier FROM attachment_events WHERE partner_id = %s AND change_seq > %s "
                        "AND change_seq <= %s", (pid, after, until)).fetchall()
    conn.commit()
    return [r[0] for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bibs", type=int, default=10_000)
    parser.add_argument("--items", type=int, default=25_000)
    parser.add_argument("--holdings", type=int, default=2_000)
    parser.add_argument("--nights", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.run import Kept, freeze, quiet_night, run_partner
    from partner_harvest.store import connect

    db = support.fresh_database(PARTNER)
    support.settle(db, [PARTNER, BIBS_ONLY])
    catalogue = SimulatedCatalogue(bibs=args.bibs, deleted_fraction=0.02, suppressed_fraction=0.01, seed=43,
                                   start_clock=datetime(2026, 3, 1))
    items = catalogue.attach("items", args.items)
    holdings = catalogue.attach("holdings", args.holdings)
    ok = True
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, mixed_fixed_types=True) as sim, \
            connect(db) as conn:
        sim.warm_export()
        partner, bibs_only = _partner(PARTNER, ["bibs", "items", "holdings"]), _partner(BIBS_ONLY, ["bibs"])
        cursors: dict = {}
        runs = 0

        def night(who: Partner, kept: dict[str, Any], label: str) -> tuple[dict[str, Any], float, int, str]:
            nonlocal runs
            runs += 1
            run_id = f"{label}-{runs}"
            before = len(sim.requests)
            started = time.perf_counter()
            result = run_partner(who, build_adapter(who, Endpoint(sim.base_url, KEY, SECRET)), conn, run_id, kept)
            return result.cursors, time.perf_counter() - started, len(sim.requests) - before, run_id

        def check(what: str) -> None:
            nonlocal ok
            equal = {"records": support.held_ids(db, PARTNER) == catalogue.public_ids(),
                     "items": _held(conn, "items", PARTNER) == items.live(public_only=True),
                     "holdings": _held(conn, "holdings", PARTNER) == holdings.live(public_only=True)}
            ok = ok and all(equal.values())
            print(f"  {what}: equal to the live sets: {equal}")

        cursors, seconds, requests, _ = night(partner, {}, "load")
        print(f"full load of {args.bibs:,} bibs, {args.items:,} items, {args.holdings:,} holdings: "
              f"{seconds:.1f} s, {requests:,} requests")
        check("after the load")
        for n in range(1, args.nights + 1):
            catalogue.advance_clock(86400)
            before_items, before_holdings = items.live(public_only=True), holdings.live(public_only=True)
            changed = items.checkout(600)
            changed += list(items.transfer(120))
            changed += items.delete(60)
            changed += items.suppress(40)
            changed += items.suppress(ids=sorted(set(items.live()) - set(before_items))[:10], on=False)
            changed += items.add(25)
            changed_holdings = holdings.checkout(40) + holdings.delete(5) + list(holdings.transfer(5))
            catalogue.edit(80)
            catalogue.delete(10)
            cursors, seconds, requests, run_id = night(partner, cursors, "night")
            after_items, after_holdings = items.live(public_only=True), holdings.live(public_only=True)
            expected = {b for i in changed for b in (*before_items.get(i, ()), *after_items.get(i, ()))}
            expected |= {b for i in changed_holdings for b in (*before_holdings.get(i, ()), *after_holdings.get(i, ()))}
            events = _events(conn, PARTNER, run_id)
            feed_ok = sorted(events) == sorted(expected) and len(events) == len(set(events))
            ok = ok and feed_ok
            print(f"night {n}: {len(changed)} item changes, {len(changed_holdings)} holdings changes: {seconds:.1f} s, "
                  f"{requests} requests; feed: {len(events)} bib events for {len(expected)} bibs whose items or "
                  f"holdings changed: {'one each' if feed_ok else 'MISMATCH'}")
            check(f"night {n}")

        # The quiet nights: the three-channel partner against a bibs-only partner of the same catalogue.
        bib_cursors, seconds, requests, _ = night(bibs_only, {}, "bibs-load")
        print(f"bibs-only partner's full load: {seconds:.1f} s, {requests:,} requests")
        catalogue.advance_clock(86400 * 3)
        cursors, *_ = night(partner, cursors, "settle")
        bib_cursors, *_ = night(bibs_only, bib_cursors, "settle")
        figures: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.repeat):
            for label, who in (("bibs only", bibs_only), ("bibs, items, holdings", partner)):
                catalogue.advance_clock(86400)
                kept = bib_cursors if who is bibs_only else cursors
                # the ordinary run: every task's step in turn
                new, seconds, requests, _ = night(who, kept, "ordinary")
                figures.setdefault(label, {}).setdefault("ordinary", []).append(seconds)
                figures[label].setdefault("ordinary requests", []).append(requests)
                catalogue.advance_clock(86400)
                outlets = Kept(dict(new))
                before = len(sim.requests)
                started = time.perf_counter()
                adapter = build_adapter(who, Endpoint(sim.base_url, KEY, SECRET))
                runs += 1
                window = freeze(who, adapter, conn, outlets)
                finished = quiet_night(adapter, conn, f"quiet-{runs}", window, outlets)
                figures[label].setdefault("quiet", []).append(time.perf_counter() - started)
                figures[label].setdefault("quiet requests", []).append(len(sim.requests) - before)
                ok = ok and finished is not None
                if who is bibs_only:
                    bib_cursors = outlets.cursors
                else:
                    cursors = outlets.cursors
        print(f"quiet nights (median of {args.repeat}; requests include the token and the clock):")
        for label, measured in figures.items():
            print(f"  {label}: quiet-night path {statistics.median(measured['quiet']) * 1000:.0f} ms, "
                  f"{statistics.median(measured['quiet requests']):.0f} requests; ordinary run "
                  f"{statistics.median(measured['ordinary']) * 1000:.0f} ms, "
                  f"{statistics.median(measured['ordinary requests']):.0f} requests")
    print("all equal" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
