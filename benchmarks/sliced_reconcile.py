"""Benchmark: a big partner's reconcile in slices, one lane killed and resumed, against one chain.

The OAI-PMH simulator runs in a process of its own with ``--records`` records (2,000,000 by
default; deletedRecord ``no``, so vanished records leave no tombstone; ``--list-size``
omitted: no completeListSize), ``--page-size`` headers a page (1,000) and ``--delay-ms`` per
response (200). The aggregation holds the same identifiers, loaded by SQL (the reconcile
compares identifiers; a full harvest of two million records is benchmarks/sliced_harvest.py's),
and the counter the apply keeps of them (the content check samples ``--content-share`` of
them, as the registry's default). Then, twice, ``--vanish`` records vanish upstream and
``--add`` new ones appear, and the partner is reconciled:

- **in slices**: a planning process (sliced_reconcile.plan_sweep: ``--slices`` slices, cut
  finer and graded with several lanes), then one process per lane, ``--pool`` of them (as the
  partner's Airflow pool runs the mapped ``sweep_ids``), each sweeping slice after slice; lane
  ``--kill`` is killed with SIGKILL once its slice has staged a third of its estimate and run
  again (its retry resumes at that slice), then the apply process (sliced_reconcile.apply_sweep);
- **as one chain**: one process running reconcile.reconcile (the unsliced DAG's one task).

Each ends with ``records`` compared with the simulator's live set, id for id. Printed: each
lane's and slice's start and end, the plan's and the settle's steps (seconds each), wall
time of each and of the sweep, the ratio of the two.

    .venv/bin/python benchmarks/sliced_reconcile.py [--records 2000000] [--slices 8] [--pool 4]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from typing import TYPE_CHECKING

from benchmarks import support  # noqa: E402

if TYPE_CHECKING:
    from partner_harvest.registry import Partner

PARTNER = "bench_sliced_reconcile"


def _partner(slices: int, pool: int = 1, content_share: float = 0.01) -> Partner:
    """The partner as its registry entry would read: its pool's slots (the plan's width), the
    content check's share of held records (options.content_check; 0: off)."""
    check = {"share": content_share} if content_share > 0 else {"mode": "off"}
    return support.partner(id=PARTNER, protocol="oai-pmh", metadata_prefix="oai_dc", pool_slots=pool,
                           slicing={"threshold_records": 1000, "target_records": 1000, "reconcile_slices": slices},
                           options={"content_check": check})


def _timed(phases: dict[str, float]) -> None:
    """Wrap the settle's steps (where they exist) so the child reports the seconds of each."""
    import functools
    import importlib

    steps = {"partner_harvest.store.reconcile": ("plan", "stage_removals", "clear", "keep_unverified"),
             "partner_harvest.reconcile": ("_verify_vanished", "_fetch_missing", "apply_run", "finish_harvest",
                                           "_settle_attached"),
             "partner_harvest.content_check": ("check",),
             "partner_harvest.store.reconcile_slices": ("rows", "lost")}
    for module_name, names in steps.items():
        module = importlib.import_module(module_name)
        for name in names:
            original = getattr(module, name, None)
            if original is None:
                continue

            def wrapper(*a: object, _f: object = original, _n: str = name, **k: object) -> object:
                began = time.perf_counter()
                try:
                    return _f(*a, **k)  # type: ignore[operator]
                finally:
                    phases[_n] = phases.get(_n, 0.0) + time.perf_counter() - began

            setattr(module, name, functools.wraps(original)(wrapper))


def child(args: argparse.Namespace) -> None:
    from partner_harvest import sliced_reconcile as sliced
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.reconcile import reconcile
    from partner_harvest.store import connect

    phases: dict[str, float] = {}
    _timed(phases)
    partner = _partner(args.slices, args.pool, args.content_share)
    adapter = build_adapter(partner, Endpoint(args.url))
    began_at = time.time()
    started = time.perf_counter()
    with connect(args.db) as conn:
        if args.step == "plan":
            out = sliced.plan_sweep(adapter, conn, partner, args.run_id).to_dict()
        elif args.step == "lane":
            plan = sliced.SweepPlan.from_dict(json.loads(args.plan))
            timings: list[dict] = []
            sweep_slice = sliced.sweep_slice

            def timed(*a: object, **k: object) -> object:
                began = time.time()
                stats = sweep_slice(*a, **k)  # type: ignore[arg-type]
                timings.append({"slice": a[5], "began_at": began, "ended_at": time.time(), "pages": stats.pages,
                                "ids": stats.fetched})
                return stats

            sliced.sweep_slice = timed  # type: ignore[assignment]
            done = sliced.sweep_lane(adapter, conn, PARTNER, args.run_id, plan, args.index)
            out = {"pages": sum(s.pages for _, s in done), "ids": sum(s.fetched for _, s in done), "slices": timings}
        elif args.step == "apply":
            plan = sliced.SweepPlan.from_dict(json.loads(args.plan))
            out = sliced.apply_sweep(adapter, conn, partner, args.run_id, plan).as_dict()
        else:
            out = reconcile(adapter, conn, partner, args.run_id).as_dict()
    out["seconds"] = time.perf_counter() - started
    out.update(began_at=began_at, ended_at=time.time(), phases=phases, responses=adapter.responses)
    print(json.dumps(out, default=str))


def _cmd(args: argparse.Namespace, url: str, db: str, run_id: str, step: str, *extra: str) -> list[str]:
    return [sys.executable, __file__, "--child", "--url", url, "--db", db, "--run-id", run_id, "--step", step,
            "--slices", str(args.slices), "--pool", str(args.pool), "--content-share", str(args.content_share), *extra]


def _run(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:8])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load(db: str, records: int) -> float:
    """The aggregation holds what the partner holds: every identifier, by SQL."""
    import psycopg

    started = time.perf_counter()
    support.forget(db, PARTNER)
    with psycopg.connect(db) as conn:
        conn.execute(
            "INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, content_hash, run_id)"
            " SELECT %s, 'oai:sim.example:rec-' || lpad(n::text, 7, '0'), timestamptz '2025-06-01', 'oai_dc',"
            " '<metadata/>', 'loaded', 'load' FROM generate_series(1, %s) AS n", (PARTNER, records))
        # the counter the apply keeps (the content check sizes its sample by it)
        conn.execute("INSERT INTO partner_stats (partner_id, records_held, quarantined_now) VALUES (%s, %s, 0)",
                     (PARTNER, records))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) records")
    return time.perf_counter() - started


def sliced_run(args: argparse.Namespace, url: str, db: str) -> dict:
    import psycopg

    run_id = "reconcile_bench/sliced"
    began_at = time.time()
    started = time.perf_counter()
    plan = _run(_cmd(args, url, db, run_id, "plan"))
    planned = time.perf_counter()
    text = json.dumps({k: v for k, v in plan.items() if k != "seconds"})
    killed: dict = {}

    def sweep(lane: int) -> dict:
        cmd = _cmd(args, url, db, run_id, "lane", "--plan", text, "--index", str(lane))
        if lane != args.kill:
            return _run(cmd)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with psycopg.connect(db, autocommit=True) as conn:
            while proc.poll() is None:  # a benchmark's watch, not a test's synchronisation
                row = conn.execute(
                    "SELECT slice, pages, estimate FROM reconcile_slices WHERE run_id = %s AND lane = %s"
                    " AND status = 'sweeping'", (run_id, lane)).fetchone()
                if row is not None and row[1] * args.page_size >= max((row[2] or 0) / 3, args.page_size):
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed.update(slice=row[0], pages=row[1], estimate=row[2])
                    break
                time.sleep(0.2)
        if not killed:
            raise SystemExit(f"lane {lane} finished before it could be killed")
        return _run(cmd)  # the retry: at its slice's own start, the other lanes untouched

    with ThreadPoolExecutor(args.pool) as pool:
        swept = list(pool.map(sweep, range(1, len(plan["pieces"]) + 1)))
    for lane, s in enumerate(swept, 1):
        print(f"    lane {lane}: {s['began_at'] - began_at:6.1f} .. {s['ended_at'] - began_at:6.1f} s, {s['pages']} pages, "
              f"{s['ids']:,} ids; " + ", ".join(f"slice {t['slice']} {t['began_at'] - began_at:.1f}..{t['ended_at'] - began_at:.1f} "
                                                f"({t['ids']:,})" for t in s["slices"]))
    harvested = time.perf_counter()
    with psycopg.connect(db) as conn:  # the apply clears the slices' rows
        attempts: dict[str, int] = dict(conn.execute("SELECT slice, attempts FROM reconcile_slices WHERE run_id = %s",
                                     (run_id,)).fetchall())
    applied = _run(_cmd(args, url, db, run_id, "apply", "--plan", text))
    print(f"    plan: {plan['seconds']:.1f} s in its process, {plan['responses']} responses; apply "
          f"{applied['began_at'] - began_at:.1f} .. {applied['ended_at'] - began_at:.1f} s, "
          f"{applied['responses']} responses: {_phases(applied)}")
    return {"wall": time.perf_counter() - started, "plan": planned - started, "sweep": harvested - planned,
            "apply": applied["seconds"], "slices": plan["slices"], "lanes": len(plan["pieces"]),
            "ids": sum(s["ids"] for s in swept),
            "pages": sum(s["pages"] for s in swept), "killed": killed, "result": applied, "attempts": attempts}


def _phases(out: dict) -> str:
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in sorted(out["phases"].items(), key=lambda p: -p[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--kill", type=int, default=3, help="the lane killed once (0: none)")
    parser.add_argument("--vanish", type=int, default=100)
    parser.add_argument("--add", type=int, default=20)
    parser.add_argument("--content-share", type=float, default=0.01,
                        help="options.content_check.share (the registry's default 0.01: at most 2,000 GetRecords); 0: off")
    parser.add_argument("--list-size", default="exact", choices=("exact", "understated", "omitted"),
                        help="the completeListSize the simulator announces (omitted: the plan cuts without counts)")
    parser.add_argument("--no-chain", action="store_true", help="only the sliced reconcile")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--db", "--run-id", "--step", "--plan"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    db = support.fresh_database(PARTNER)
    sim_args = ("--records", str(args.records), "--deleted-fraction", "0", "--deleted-record", "no",
                "--page-size", str(args.page_size), "--formats", "oai_dc", "--response-delay-ms", str(args.delay_ms),
                "--list-size", args.list_size)
    print(f"Sliced reconcile benchmark: {args.records:,} identifiers, {args.page_size} headers a page, "
          f"{args.delay_ms:.0f} ms a response, completeListSize {args.list_size}, content check share "
          f"{args.content_share}; {args.slices} slices, {args.pool} at once, lane {args.kill} killed once and "
          f"resumed; against one chain")
    ok = True
    figures = {}
    with support.simulator("oai_pmh", *sim_args) as url:
        print(f"  loaded {args.records:,} records by SQL in {load(db, args.records):.1f} s")
        runs = [("sliced", sliced_run)] + ([] if args.no_chain else [("one chain", None)])
        for label, how in runs:
            changed = support.control(url, "mutate", {"delete": args.vanish, "add": args.add})
            if how is not None:
                m = how(args, url, db)
                result = m["result"]
                line = (f"{m['slices']} slices in {m['lanes']} lanes: {m['wall']:.1f} s wall (plan {m['plan']:.1f} s, "
                        f"sweep {m['sweep']:.1f} s for {m['pages']:,} pages of the slices' final attempts, apply "
                        f"{m['apply']:.1f} s); "
                        + (f"lane {args.kill} killed in slice {m['killed'].get('slice')} after "
                           f"{m['killed'].get('pages')} of ~{(m['killed'].get('estimate') or 0) // args.page_size} pages "
                           f"and resumed at it (attempts per slice {m['attempts']})" if m["killed"] else "none killed"))
            else:
                started = time.perf_counter()
                result = _run(_cmd(args, url, db, "reconcile_bench/chain", "chain"))
                m = {"wall": time.perf_counter() - started}
                print(f"    one chain: {result['responses']} responses; {_phases(result)}")
                line = f"one chain: {m['wall']:.1f} s wall"
            live = set(support.control(url, "live_ids"))
            exact = support.held_ids(db, PARTNER) == live
            purged_ok = result["purged"] == len(changed["deleted"]) and result["fetched_missing"] == len(changed["added"])
            ok = ok and exact and purged_ok
            figures[label] = m
            print(f"  {line}; {args.records / m['wall']:,.0f} ids/s end to end; purged {result['purged']} "
                  f"(vanished {len(changed['deleted'])}), fetched {result['fetched_missing']} (added "
                  f"{len(changed['added'])}); records == live set: {'yes' if exact else 'NO'}")
    if "one chain" in figures:
        print(f"  speed-up of the sliced reconcile (with its killed slice) over one chain: "
              f"{figures['one chain']['wall'] / figures['sliced']['wall']:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
