"""Benchmark: the partner's Airflow pool bounds the requests of a sliced run, through Airflow itself.

A real Airflow (api-server, scheduler on the LocalExecutor, dag-processor; started by
tests/support/e2e_stack.py, the e2e tests' stack) runs ``harvest_e2emuseum`` in mode ``full`` against the
OAI-PMH simulator in a process of its own (``--records`` records, 500 a page, 5% deleted,
``--delay-ms`` per response, so that requests overlap). The registry slices the full
harvest into ``--slices`` slices (``slicing``) and gives the partner ``pool_slots:
--pool``; ``partner-harvest sync-pools`` syncs the pool from it. Airflow's
parallelism is above the number of slices, so only the pool holds the slices back.

Printed per run: the most requests the simulator had in flight at once over the whole run
(``max_in_flight``: Identify, the plan's probes, every slice and its checks, the apply)
against the pool's slots; the most ``harvest_changes`` instances running at once and how
many overlapped another (from the task instances' start/end, REST API); the run's wall
time (its start to its end) and records/s; and whether ``records`` equals the simulator's
live set. A control run with ``--control-pool`` slots (default 8) follows: its
``max_in_flight`` rises above ``--pool``, so the counter does see concurrent requests.

Exit status 1 when a run's ``max_in_flight`` exceeds its pool, when ``records`` differs
from the live set, or when a run fails; 0 otherwise.

    .venv/bin/python benchmarks/slice_pool.py [--records 200000] [--slices 8] [--pool 4] [--control-pool 8]

A repository without counts whose records cluster: ``--list-size omitted
--spread clustered`` (the plan then cuts ``--slices`` ranges without counts: registry
``without_count``); ``--plugins <checkout>/plugins`` runs the services on another checkout's
library (main's planner: the "before"). Printed besides: the records each slice fetched and
the harvest phase (the first ``harvest_changes`` start to the last end) in records/s against
the one-chain floor (one chain bound by latency alone: a page per response, ``page size /
delay``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402

PAGE_SIZE = 500
RUN_TIMEOUT = 1800.0


LIBRARY = "e2elibrary"  # the Sierra partner (--protocol sierra), added to the e2e registry
KEY, SECRET = "pool-key", "pool-secret"
SIERRA_OPTIONS = {"export": {"limit": 2000}}


def write_registry(path: Path, partner: str, slices: int, records: int, pool: int) -> None:
    """The e2e registry (its DAGs are what the stack waits for), the partner sliced and pooled."""
    import yaml

    from tests.support import e2e_stack

    e2e_stack.write_registry(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if partner == LIBRARY:
        data["partners"].append({"id": LIBRARY, "protocol": "sierra", "conn_id": f"partner_{LIBRARY}",
                                 "page_size": 2000, "options": SIERRA_OPTIONS})
    entry = next(p for p in data["partners"] if p["id"] == partner)
    if partner != LIBRARY:
        entry.update(metadata_prefix="oai_dc")
    # A target well under records/slices: the plan bisects until it reaches max_slices.
    entry.update(pool_slots=pool, execution_timeout="1h",
                 slicing={"threshold_records": max(1, records // (2 * slices)),
                          "target_records": max(1, records // (2 * slices)), "max_slices": slices,
                          "without_count": slices})
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def sync_pools(stack: Any) -> str:
    """The deployment step: pools from the registry (``pool_slots``)."""
    done = subprocess.run([sys.executable, "-m", "partner_harvest.cli", "sync-pools"],
                          env={**stack.env, "HARVEST_AIRFLOW_API_URL": stack.base_url},
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"pool sync failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def pool_line(synced: str, partner: str) -> str:
    return next((line for line in synced.splitlines() if f"partner_{partner}:" in line), synced)


def _instant(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def _since(value: str, started: float) -> float:
    """Seconds from ``started`` to the instant ``value``."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() - started


def overlap(spans: list[tuple[float, float]]) -> tuple[int, int]:
    """(most running at once, how many overlapped at least one other) of (start, end) spans."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])  # an end sorts first
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    overlapped = sum(1 for i, (s, e) in enumerate(spans)
                     if any(s < e2 and s2 < e for j, (s2, e2) in enumerate(spans) if j != i))
    return most, overlapped


def measure(stack: Any, url: str, partner: str, pool: int, live: set[str]) -> dict[str, Any]:
    """One full harvest through the scheduler; the figures of the run."""
    dag_id = f"harvest_{partner}"
    from partner_harvest.store import connect, ensure_schema

    with connect(stack.aggregation_db) as conn:  # a clean first load each time
        ensure_schema(conn)
    support.settle(stack.aggregation_db, [partner])  # without the previous run's dead keys
    oai = partner != LIBRARY  # the Sierra simulator counts no requests in flight
    if oai:
        support.control(url, "reset_in_flight", {})
        support.control(url, "clear_requests", {})
    run_id = stack.trigger(dag_id, {"mode": "full"})["dag_run_id"]
    run = stack.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT)
    report = support.control(url, "in_flight") if oai else {"max_in_flight": 0, "response_delay_ms": None}
    tis = stack.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})["task_instances"]
    slices = [ti for ti in tis if ti["task_id"] == "harvest_changes"]
    spans = [(_instant(ti["start_date"]), _instant(ti["end_date"])) for ti in slices]
    done = [(start, end) for start, end in spans if start is not None and end is not None]
    most, overlapped = overlap(done)
    pools = {ti["task_id"]: ti["pool"] for ti in tis}
    ended, started = _instant(run["end_date"]), _instant(run["start_date"])
    wall = ended - started if ended is not None and started is not None else float("nan")
    phase = max(e for _, e in done) - min(s for s, _ in done) if done else float("nan")
    equal = support.held_ids(stack.aggregation_db, partner) == live
    import psycopg

    with psycopg.connect(stack.aggregation_db) as conn:
        # per lane (a slice harvested alone, as before lanes, is a lane of its own)
        fetched = [r[0] for r in conn.execute(
            "SELECT sum(fetched) FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel LIKE 'changes/%%'"
            " GROUP BY COALESCE(lane::text, channel) ORDER BY 1 DESC", (partner, f"{dag_id}/{run_id}")).fetchall()]
        slice_count = (conn.execute("SELECT count(*) FROM harvest_runs WHERE partner_id = %s AND run_id = %s"
                                    " AND channel LIKE 'changes/%%'", (partner, f"{dag_id}/{run_id}")).fetchone()
                       or (0,))[0]
    apply: dict[str, Any] = next((ti for ti in tis if ti["task_id"] == "apply_changes"), {})
    started = _since(run["start_date"], 0.0)
    timeline = [(ti["task_id"], ti.get("map_index", -1), _since(ti["start_date"], started),
                 _since(ti["end_date"], started), ti["state"],
                 _since(ti["queued_when"], started) if ti.get("queued_when") else None)
                for ti in tis if ti["start_date"] and ti["end_date"]]
    return {"pool": pool, "state": run["state"], "max_in_flight": report["max_in_flight"],
            "timeline": timeline, "queued": -_since(run["queued_at"], started) if run.get("queued_at") else 0.0,
            "applied_at": _since(apply["end_date"], started) if apply.get("end_date") else float("nan"),
            "delay_ms": report["response_delay_ms"], "slices": slice_count, "lanes": len(slices), "running_at_once": most,
            "overlapped": overlapped, "wall": wall, "apply_seconds": apply.get("duration") or 0.0,
            "exact": equal, "phase": phase, "fetched": fetched, "pooled": sorted(t for t, p in pools.items() if p == f"partner_{partner}"),
            "states": sorted({ti["state"] for ti in tis})}


def table(m: dict[str, Any]) -> list[str]:
    """The run's tasks, each as seconds from the run's start (mapped instances as one row)."""
    rows: dict[str, list[tuple[float, float, str]]] = {}
    queued: dict[str, float] = {}
    for task_id, _, start, end, state, when in sorted(m["timeline"], key=lambda t: (t[2], t[1])):
        rows.setdefault(task_id, []).append((start, end, state))
        if when is not None:
            queued[task_id] = min(queued.get(task_id, when), when)
    lines = ["    | task | seconds from the run's start | queued at |", "    |---|---|---|"]
    for task_id, spans in sorted(rows.items(), key=lambda item: min(s for s, _, _ in item[1])):
        first, last = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
        name = task_id + (f" x{len(spans)}" if len(spans) > 1 else "")
        ends = f" (ends {', '.join(f'{e:.1f}' for _, e, _ in sorted(spans, key=lambda s: s[1]))})" if len(spans) > 1 else ""
        skipped = " skipped" if all(state == "skipped" for _, _, state in spans) else ""
        at = f"{queued[task_id]:.1f}" if task_id in queued else "-"
        lines.append(f"    | {name} | {first:.1f} - {last:.1f}{ends}{skipped} | {at} |")
    lines.append(f"    | the run | 0 - {m['wall']:.1f} | {-m['queued']:.1f} |")
    return lines


def show(label: str, m: dict[str, Any], records: int, chain: float | None = None) -> None:
    print(f"  {label}: run {m['state']}, {m['slices']} slices in {m['lanes']} harvest_changes instances; "
          f"max in flight {m['max_in_flight']} "
          f"(pool {m['pool']}: {'within' if m['max_in_flight'] <= m['pool'] else 'EXCEEDED'}); "
          f"harvest_changes at once {m['running_at_once']}, {m['overlapped']} of {m['lanes']} overlapped another; "
          f"wall {m['wall']:.1f} s ({records / max(m['wall'], 1e-9):,.0f} records/s, apply {m['apply_seconds']:.1f} s); "
          f"records == live set: {'yes' if m['exact'] else 'NO'}")
    print(f"    tasks in pool partner_*: {', '.join(m['pooled'])}")
    floor = PAGE_SIZE / (m["delay_ms"] / 1000) if m["delay_ms"] else float("nan")
    print(f"    records per instance: {', '.join(f'{n:,}' for n in m['fetched'])}; harvest phase {m['phase']:.1f} s = "
          f"{records / m['phase']:,.0f} records/s = {records / m['phase'] / floor:.2f}x the one-chain floor "
          f"({floor:,.0f} records/s); whole run {records / m['wall'] / floor:.2f}x")
    if m["fetched"]:
        mean = sum(m["fetched"]) / len(m["fetched"])
        print(f"    largest instance {max(m['fetched']) / mean:.2f}x the mean")
    print("\n".join(table(m)))
    if chain is not None:
        print(f"    ONE CHAIN fetched for {chain:.1f} s: whole run {chain / m['wall']:.2f}x "
              f"(to the apply's commit, {m['applied_at']:.1f} s: {chain / m['applied_at']:.2f}x); "
              f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


def one_chain(url: str, db: str, protocol: str, label: str) -> float:
    """One chain's fetch time (freeze and staging, no apply, no Airflow) against the same
    simulator, in a process of its own, under a partner of its own: the baseline."""
    from partner_harvest.store import connect, ensure_schema

    with connect(db) as conn:
        ensure_schema(conn)
    partner_id = f"chain_pool_{label}"
    support.forget(db, partner_id)
    figures = support.run_child(__file__, "--url", url, "--db", db, "--run-id", f"chain-{label}",
                                "--partner", partner_id, "--protocol", protocol)
    support.forget(db, partner_id)
    return float(figures["seconds"])


def chain_child(args: argparse.Namespace) -> None:
    """The child of :func:`one_chain`: the run recipe's freeze and one unsliced channel."""
    from partner_harvest import pipeline
    from partner_harvest import run as recipe
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.store import connect

    if args.protocol == "sierra":
        partner = support.partner(id=args.partner, protocol="sierra", page_size=2000, options=SIERRA_OPTIONS)
        endpoint = Endpoint(args.url, KEY, SECRET)
    else:
        partner = support.partner(id=args.partner, protocol="oai-pmh", metadata_prefix="oai_dc")
        endpoint = Endpoint(args.url)
    adapter = build_adapter(partner, endpoint)
    with connect(args.db) as conn:
        started = time.perf_counter()
        window = recipe.freeze(partner, adapter, conn, request=pipeline.RunRequest("full"))
        stats = recipe.stage_channel(adapter, conn, args.run_id, window, recipe.CHANGES)
        seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "fetched": stats.fetched}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--control-pool", type=int, default=8, help="slots of the contrast run (0: none)")
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--list-size", choices=["exact", "omitted"], default="exact")
    parser.add_argument("--spread", choices=["uniform", "clustered"], default="uniform")
    parser.add_argument("--repeat", type=int, default=1, help="sliced runs under --pool, one after another")
    parser.add_argument("--no-chain", action="store_true", help="skip the one-chain baseline")
    parser.add_argument("--idle-sleep", type=float, default=None,
                        help="[scheduler] scheduler_idle_sleep_time (default: the e2e stack's 0.2 s; "
                             "airflow.cfg.example sets 5)")
    parser.add_argument("--protocol", choices=["oai-pmh", "sierra"], default="oai-pmh",
                        help="sierra: a Sierra full load by id ranges (--records bibs, --delay-ms per answer)")
    parser.add_argument("--plugins", type=Path, default=support.ROOT / "plugins",
                        help="the library the Airflow services load (another checkout's: its planner)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the services' and tasks' logs after a clean pass")
    support.child_arguments(parser, "--partner")
    args = parser.parse_args()
    if args.child:
        chain_child(args)
        return 0

    from include import embedded_pg
    from tests.support import e2e_stack

    e2e_stack.STARTUP_TIMEOUT = max(e2e_stack.STARTUP_TIMEOUT, 600.0)  # a loaded machine starts Airflow slowly

    sierra = args.protocol == "sierra"
    partner = LIBRARY if sierra else e2e_stack.MUSEUM
    parallelism = max(8, args.slices, args.control_pool) + 2  # never what holds the slices back
    print(f"Slices under a pool, through Airflow (LocalExecutor, parallelism {parallelism}): {args.records:,} "
          f"{'bibs, exports of 2,000' if sierra else f'records, {PAGE_SIZE} a page'}, {args.delay_ms:.0f} ms a response, "
          f"{args.slices} slices; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    failures = []
    simulated = (("sierra", "--bibs", str(args.records), "--deleted-fraction", "0.05", "--client-key", KEY,
                  "--client-secret", SECRET, "--response-delay-ms", str(args.delay_ms)) if sierra else
                 ("oai_pmh", "--records", str(args.records), "--page-size", str(PAGE_SIZE), "--formats", "oai_dc",
                  "--seed", "9", "--response-delay-ms", str(args.delay_ms), "--list-size", args.list_size,
                  "--spread", args.spread))
    with ExitStack() as cleanup, support.simulator(*simulated) as url:
        base = Path(tempfile.mkdtemp(prefix="slice-pool-"))  # the services' logs; removed after a clean pass
        print(f"  logs: {base}")
        registry = base / "sliced.yaml"
        write_registry(registry, partner, args.slices, args.records, args.pool)
        overrides = {"AIRFLOW__CORE__PARALLELISM": str(parallelism), "HARVEST_PARTNERS_FILE": str(registry),
                     **({"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(args.idle_sleep)}
                        if args.idle_sleep is not None else {}),
                     "PYTHONPATH": os.pathsep.join(str(p) for p in (args.plugins, support.ROOT)),
                     f"AIRFLOW_CONN_PARTNER_{partner.upper()}": json.dumps(
                         {"conn_type": "http", "host": url, **({"login": KEY, "password": SECRET} if sierra else {})})}
        started = time.perf_counter()
        stack = e2e_stack.start_airflow(embedded_pg.start("bench"), base, cleanup, overrides)
        print(f"  Airflow started in {time.perf_counter() - started:.0f} s; {pool_line(sync_pools(stack), partner)}")
        if sierra:
            support.control(url, "warm_export", {})  # the simulator's MARC encoding is not what is measured
        live = support.control(url, "public_ids" if sierra else "live_ids")  # suppressed bibs: purged (the default)
        chain = None
        if not args.no_chain:
            chain = one_chain(url, stack.aggregation_db, args.protocol, "1")
            print(f"  one chain (unsliced, no Airflow): fetched for {chain:.1f} s; load average "
                  f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
        # The stack's first task waits on starting workers (17 s seen): a small partner's run first.
        warm = stack.trigger(f"harvest_{e2e_stack.LAGGING}", {"mode": "full"})["dag_run_id"]
        print(f"  warm-up run of harvest_{e2e_stack.LAGGING}: "
              f"{stack.wait_for_run(f'harvest_{e2e_stack.LAGGING}', warm, timeout=RUN_TIMEOUT)['state']}")
        runs = [(f"pool #{n + 1}" if args.repeat > 1 else "pool", args.pool) for n in range(args.repeat)]
        runs += [("control", args.control_pool)] if args.control_pool else []
        for label, slots in runs:
            if slots != args.pool:
                write_registry(registry, partner, args.slices, args.records, slots)
                print(f"  {pool_line(sync_pools(stack), partner)}")
            figures = measure(stack, url, partner, slots, live)
            show(f"{label} ({slots} slots)", figures, args.records, chain)
            if not sierra and figures["max_in_flight"] > slots:
                failures.append(f"{label}: {figures['max_in_flight']} requests in flight with a pool of {slots}")
            if not figures["exact"] or figures["state"] != "success":
                failures.append(f"{label}: run {figures['state']}, records == live set: {figures['exact']}")
            if label == "control" and figures["max_in_flight"] <= args.pool:
                print(f"  note: the control run never went above {args.pool} in flight (the machine held it back)")
    for failure in failures:
        print(f"FAIL {failure}")
    if not failures and not args.keep_logs:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
