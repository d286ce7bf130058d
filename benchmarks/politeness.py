"""Benchmark: politeness per endpoint host (request_delay, the adaptive back-off) and its cost.

Three parts, each against a baseline in the same run:

1. **The delay across processes.** Two partners served from one host (127.0.0.1, two OAI-PMH
   simulators), each harvested as ``--slices`` slices, a slice of each partner per process
   (``--slices`` processes): requests per second counted at the servers (their own arrival
   times), with ``request_delay`` ``--delay-ms`` against the same harvest unpaced.
2. **The adaptive back-off.** One partner, ``--slices`` slices in one process each, the host
   answering every response in ``--slow-ms`` (slower than ``slow_response``): the rate the
   host receives with the back-off against without it, and the back-off it reached.
3. **The reservation's cost.** ``--reservations`` reservations (one UPDATE ... RETURNING
   each, an autocommit round trip to PostgreSQL) against one simulator request (Identify).

    .venv/bin/python benchmarks/politeness.py [--delay-ms 100] [--slices 4] [--records 400] [--slow-ms 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402,F401 (puts the repository on sys.path)
from include import embedded_pg
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.db import one
from partner_harvest.store.pacing import PgPacingStore
from tests.support.partners import fast_http
from tests.support.politeness import most_in_any_second, run_in_processes, slices


def _entry(pid: str, **fields: Any) -> dict[str, Any]:
    return {"id": pid, "protocol": "oai-pmh", "conn_id": "-", "metadata_prefix": "oai_dc",
            "options": {"http": fast_http()}, **fields}


def _reset(db: str) -> None:
    with connect(db) as conn:
        ensure_schema(conn)
        conn.execute("DELETE FROM host_pacing")
        conn.execute("DELETE FROM partner_pacing")
        conn.commit()


def _rate(arrivals: list[float]) -> tuple[float, int, float]:
    """Mean requests/s over the span, the most in any one second, the median gap in ms."""
    times = sorted(arrivals)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    gaps = [b - a for a, b in zip(times, times[1:])]
    return (len(times) - 1) / span if span else float("inf"), most_in_any_second(times), \
        1000 * statistics.median(gaps) if gaps else 0.0


def shared_host(db: str, args: argparse.Namespace) -> None:
    print(f"1. two partners on one host, {args.slices} slices each, a slice of each per process "
          f"({args.records} records a partner, pages of 10)")
    for label, delay in (("unpaced (baseline)", None), (f"request_delay {args.delay_ms} ms", args.delay_ms)):
        _reset(db)
        with OaiSimulator(SimulatedRepository(records=args.records, page_size=10, seed=1)) as a, \
                OaiSimulator(SimulatedRepository(records=args.records, page_size=10, seed=2)) as b:
            fields = {"request_delay": delay} if delay else {}
            groups = list(zip(slices(_entry("museum_a", **fields), a.base_url, args.slices),
                              slices(_entry("museum_b", **fields), b.base_url, args.slices)))
            started = time.monotonic()
            results = run_in_processes([list(g) for g in groups], db if delay else None)
            wall = time.monotonic() - started
            arrivals = a.arrivals + b.arrivals
        mean, most, median_gap = _rate(arrivals)
        limit = f" (limit {1000 / delay:.1f}/s)" if delay else ""
        print(f"   {label:<24} {len(arrivals)} requests, {sum(r['records'] for r in results)} records, "
              f"{wall:.1f} s: {mean:.1f} requests/s, at most {most} in any second{limit}, "
              f"median gap {median_gap:.0f} ms")


def slow_host(db: str, args: argparse.Namespace) -> None:
    politeness = {"slow_response": args.slow_ms / 2000, "backoff_step": 250, "max_backoff": args.max_backoff,
                  "recovery": 0.1}
    print(f"2. a slow host: {args.slow_ms} ms a response (slow_response {politeness['slow_response']:g} s), "
          f"{args.slices} slices in {args.slices} processes, max_backoff {args.max_backoff} ms")
    figures = {}
    for label, paced in (("no politeness (baseline)", False), ("adaptive back-off", True)):
        _reset(db)
        entry = _entry("museum", options={"http": fast_http(), "politeness": politeness})
        with OaiSimulator(SimulatedRepository(records=args.slow_records, page_size=10),
                          response_delay_ms=args.slow_ms) as sim:
            started = time.monotonic()
            run_in_processes([[job] for job in slices(entry, sim.base_url, args.slices)], db if paced else None)
            wall = time.monotonic() - started
            arrivals = list(sim.arrivals)
            most_at_once = sim.max_in_flight
        mean, most, median_gap = _rate(arrivals)
        figures[label] = mean
        extra = ""
        if paced:
            with connect(db) as conn:
                penalty, strains = one(conn.execute("SELECT max(penalty_ms), max(strains) FROM host_pacing"))
            extra = f", back-off at the end {penalty:.0f} ms after {strains} strains"
        print(f"   {label:<24} {len(arrivals)} requests in {wall:.1f} s: {mean:.2f} requests/s, at most "
              f"{most} in any second, {most_at_once} in flight at once, median gap {median_gap:.0f} ms{extra}")
    ratio = figures["adaptive back-off"] / figures["no politeness (baseline)"]
    print(f"   the slow host receives {ratio:.2f}x the baseline's rate ({1 / ratio:.1f}x fewer requests a second)")


def reservation_cost(db: str, args: argparse.Namespace) -> None:
    _reset(db)
    store = PgPacingStore(db)
    times = []
    try:
        for _ in range(args.reservations):
            started = time.perf_counter()
            store.reserve("bench.example.org", 0, 1, 0.1)
            times.append(time.perf_counter() - started)
    finally:
        store.close()
    import requests

    with OaiSimulator(SimulatedRepository(records=10)) as sim, requests.Session() as session:
        requests_times = []
        for _ in range(200):
            started = time.perf_counter()
            session.get(sim.base_url, params={"verb": "Identify"}).raise_for_status()
            requests_times.append(time.perf_counter() - started)
    times.sort()
    reserve_ms = 1000 * statistics.median(times)
    identify_ms = 1000 * statistics.median(requests_times)
    print(f"3. {args.reservations} reservations: median {reserve_ms:.2f} ms, p95 {1000 * times[int(0.95 * len(times))]:.2f} ms "
          f"a reservation; a loopback Identify (no network latency at all) {identify_ms:.2f} ms: "
          f"{reserve_ms / identify_ms:.2f}x the cheapest request there is")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=int, default=100)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--slow-ms", type=int, default=300)
    parser.add_argument("--slow-records", type=int, default=400)
    parser.add_argument("--max-backoff", type=int, default=2000)
    parser.add_argument("--reservations", type=int, default=2000)
    args = parser.parse_args()
    db = embedded_pg.start("bench")
    with connect(db) as conn:
        ensure_schema(conn)
    shared_host(db, args)
    slow_host(db, args)
    reservation_cost(db, args)


if __name__ == "__main__":
    main()
