"""Benchmark: a Sierra full load against a server that closes idle keep-alive connections
and answers 500/135 on poison bibs, with the host's adaptive back-off on.

The Sierra simulator runs in its own process with ``--bibs`` bibs whose ids have 8 digits
(from 10,000,000), every ``--poison-every``-th bib one its exporter cannot convert (a
``bibs/marc`` block holding it answers 500/135 on every try: the harvester bisects down to
it and fetches it through ``GET bibs``), and idle keep-alive connections closed after 5 s
(Apache's default, announced as ``Keep-Alive: timeout=5``). The harvester is a fresh
process running the DAG's steps (``partner_harvest.run``) with the production HTTP and
politeness defaults and the host's pacing in PostgreSQL (``host_pacing``), as a task does.

Printed per run: wall time, requests the simulator answered, the host's strains and
back-off at the end, and whether ``records`` (plus the quarantine, by id) equals the live
set. ``--code DIR`` runs the harvester from another checkout's ``plugins`` (the code before
a change); ``--bound SECONDS`` stops a run after that long and extrapolates from the bibs
it staged (said so in the output).

    .venv/bin/python benchmarks/sierra_keep_alive.py [--bibs 12000] [--poison-every 1000]
        [--code ../before/plugins --bound 480] [--label before]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402

KEY, SECRET = "bench-key", "bench-secret"
PARTNER = "bench_keep_alive"


def child(args: argparse.Namespace) -> None:
    """The harvesting process: a full load with the host's pacing; report what it did."""
    if args.code:
        sys.path.insert(0, args.code)  # the other checkout's partner_harvest, before this one's
    import partner_harvest
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.run import run_partner
    from partner_harvest.store import connect
    from partner_harvest.store.pacing import PgPacingStore

    partner = support.partner(id=PARTNER, protocol="sierra", page_size=2000)
    adapter = build_adapter(partner, Endpoint(args.url, KEY, SECRET), pacing=lambda: PgPacingStore(args.db))
    print(json.dumps({"code": partner_harvest.__file__}), file=sys.stderr, flush=True)
    started = time.perf_counter()
    with connect(args.db) as conn:
        run = run_partner(partner, adapter, conn, args.run_id, {"changes": None, "deletions": None})  # a full load
    print(json.dumps({"seconds": time.perf_counter() - started, "fetched": run.changes.fetched,
                      "upserted": run.applied.upserted, "quarantined": run.applied.quarantined,
                      # counted by the code before the export moved to sierra/export.py (--code), not since
                      "isolated": getattr(adapter, "isolated_bibs", None)}))


def _counts(db: str, run_id: str) -> dict[str, Any]:
    from partner_harvest.store import connect
    from partner_harvest.store.db import one, scalar

    with connect(db) as conn:
        staged = scalar(conn.execute("SELECT count(*) FROM staging WHERE partner_id = %s AND run_id = %s",
                                     (PARTNER, run_id)))
        pacing = one(conn.execute("SELECT coalesce(sum(strains), 0), coalesce(max(penalty_ms), 0) FROM host_pacing"))
        quarantined = {r[0] for r in conn.execute(
            "SELECT identifier FROM quarantine_current WHERE partner_id = %s", (PARTNER,))}
        conn.commit()
    return {"staged": staged, "strains": int(pacing[0]), "penalty_ms": float(pacing[1]), "quarantined": quarantined}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bibs", type=int, default=12_000)
    parser.add_argument("--poison-every", type=int, default=1000)
    parser.add_argument("--code", default="", help="run the harvester from this plugins directory (the code before)")
    parser.add_argument("--bound", type=float, default=0, help="stop the run after this many seconds and extrapolate")
    parser.add_argument("--label", default="this checkout")
    support.child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    db = support.fresh_database(PARTNER)
    from partner_harvest.store import connect

    with connect(db) as conn:
        conn.execute("DELETE FROM host_pacing")  # no back-off left over from an earlier run on 127.0.0.1
        conn.commit()
    sim_args = ("--bibs", str(args.bibs), "--first-id", "10000000", "--poison-every", str(args.poison_every),
                "--keep-alive-timeout", "5", "--client-key", KEY, "--client-secret", SECRET)
    with support.simulator("sierra", *sim_args) as url:
        support.control(url, "warm_export", {})
        live = support.control(url, "live_ids")
        answered_before = support.control(url, "state")["requests"]
        run_id = f"full-{args.label.replace(' ', '-')}"
        command = [sys.executable, __file__, "--child", "--url", url, "--db", db, "--run-id", run_id,
                   *(["--code", args.code] if args.code else [])]
        started = time.perf_counter()
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=args.bound or None)
            bounded = False
        except subprocess.TimeoutExpired:
            out, bounded = None, True
        wall = time.perf_counter() - started
        answered = support.control(url, "state")["requests"] - answered_before
        counts = _counts(db, run_id)
    print(f"Sierra full load, {args.bibs:,} bibs with 8-digit ids ({len(live):,} live), one poison bib in "
          f"{args.poison_every:,} (bibs/marc 500/135), idle keep-alive connections closed after 5 s; "
          f"politeness defaults (adaptive back-off); harvester code: {args.code or 'this checkout'} ({args.label})")
    if bounded:
        rate = counts["staged"] / wall
        left = (len(live) - counts["staged"]) / rate if rate else float("inf")
        print(f"  BOUNDED: stopped after {wall:.0f} s with {counts['staged']:,} of {len(live):,} bibs staged, "
              f"{answered:,} requests answered; at that rate the load needs about {wall + left:,.0f} s "
              f"({(wall + left) / 3600:.1f} h) in all and {answered / max(counts['staged'], 1) * len(live):,.0f} "
              f"requests (extrapolated); host back-off then {counts['penalty_ms']:,.0f} ms, "
              f"{counts['strains']} strains")
        return 0
    if out is None or out.returncode != 0:
        print(out.stderr[-3000:] if out else "no output")
        return 1
    result = json.loads(out.stdout.strip().splitlines()[-1])
    held = support.held_ids(db, PARTNER)
    exact = held | counts["quarantined"] == live and not held & counts["quarantined"]
    print(f"  {wall:.1f} s wall ({result['seconds']:.1f} s in the run), {answered:,} requests answered, "
          f"{'?' if result['isolated'] is None else result['isolated']} poison bibs isolated; "
          f"host back-off at the end {counts['penalty_ms']:,.0f} ms "
          f"after {counts['strains']} strains")
    print(f"  records == live set: {'yes' if held == live else 'no'}; records + quarantined (by id) == live set: "
          f"{'yes' if exact else 'NO'} ({len(held):,} held, {len(counts['quarantined']):,} quarantined)")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
