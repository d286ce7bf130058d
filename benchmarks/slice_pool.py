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


def write_registry(path: Path, partner: str, slices: int, records: int, pool: int) -> None:
    """The e2e registry (its DAGs are what the stack waits for), the museum sliced and pooled."""
    import yaml

    from tests.support import e2e_stack

    e2e_stack.write_registry(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    entry = next(p for p in data["partners"] if p["id"] == partner)
    # A target well under records/slices: the plan bisects until it reaches max_slices.
    entry.update(metadata_prefix="oai_dc", pool_slots=pool, execution_timeout="1h",
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
    support.forget(stack.aggregation_db, partner)
    support.control(url, "reset_in_flight", {})
    support.control(url, "clear_requests", {})
    run_id = stack.trigger(dag_id, {"mode": "full"})["dag_run_id"]
    run = stack.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT)
    report = support.control(url, "in_flight")
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
        fetched = [r[0] for r in conn.execute(
            "SELECT fetched FROM harvest_runs WHERE partner_id = %s AND run_id = %s AND channel LIKE 'changes/%%'"
            " ORDER BY channel", (partner, f"{dag_id}/{run_id}")).fetchall()]
    apply: dict[str, Any] = next((ti for ti in tis if ti["task_id"] == "apply_changes"), {})
    return {"pool": pool, "state": run["state"], "max_in_flight": report["max_in_flight"],
            "delay_ms": report["response_delay_ms"], "slices": len(slices), "running_at_once": most,
            "overlapped": overlapped, "wall": wall, "apply_seconds": apply.get("duration") or 0.0,
            "exact": equal, "phase": phase, "fetched": fetched, "pooled": sorted(t for t, p in pools.items() if p == f"partner_{partner}"),
            "states": sorted({ti["state"] for ti in tis})}


def show(label: str, m: dict[str, Any], records: int) -> None:
    print(f"  {label}: run {m['state']}, {m['slices']} slices; max in flight {m['max_in_flight']} "
          f"(pool {m['pool']}: {'within' if m['max_in_flight'] <= m['pool'] else 'EXCEEDED'}); "
          f"harvest_changes at once {m['running_at_once']}, {m['overlapped']} of {m['slices']} overlapped another; "
          f"wall {m['wall']:.1f} s ({records / max(m['wall'], 1e-9):,.0f} records/s, apply {m['apply_seconds']:.1f} s); "
          f"records == live set: {'yes' if m['exact'] else 'NO'}")
    print(f"    tasks in pool partner_*: {', '.join(m['pooled'])}")
    floor = PAGE_SIZE / (m["delay_ms"] / 1000) if m["delay_ms"] else float("nan")
    print(f"    records per slice: {', '.join(f'{n:,}' for n in m['fetched'])}; harvest phase {m['phase']:.1f} s = "
          f"{records / m['phase']:,.0f} records/s = {records / m['phase'] / floor:.2f}x the one-chain floor "
          f"({floor:,.0f} records/s); whole run {records / m['wall'] / floor:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--control-pool", type=int, default=8, help="slots of the contrast run (0: none)")
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--list-size", choices=["exact", "omitted"], default="exact")
    parser.add_argument("--spread", choices=["uniform", "clustered"], default="uniform")
    parser.add_argument("--plugins", type=Path, default=support.ROOT / "plugins",
                        help="the library the Airflow services load (another checkout's: its planner)")
    args = parser.parse_args()

    from include import embedded_pg
    from tests.support import e2e_stack

    e2e_stack.STARTUP_TIMEOUT = max(e2e_stack.STARTUP_TIMEOUT, 600.0)  # a loaded machine starts Airflow slowly

    partner = e2e_stack.MUSEUM
    parallelism = max(8, args.slices, args.control_pool) + 2  # never what holds the slices back
    print(f"Slices under a pool, through Airflow (LocalExecutor, parallelism {parallelism}): {args.records:,} records, "
          f"{PAGE_SIZE} a page, {args.delay_ms:.0f} ms a response, {args.slices} slices")
    failures = []
    with ExitStack() as cleanup, support.simulator(
            "oai_pmh", "--records", str(args.records), "--page-size", str(PAGE_SIZE), "--formats", "oai_dc",
            "--seed", "9", "--response-delay-ms", str(args.delay_ms), "--list-size", args.list_size,
            "--spread", args.spread) as url:
        base = Path(tempfile.mkdtemp(prefix="slice-pool-"))  # the services' logs; removed after a clean pass
        print(f"  logs: {base}")
        registry = base / "sliced.yaml"
        write_registry(registry, partner, args.slices, args.records, args.pool)
        overrides = {"AIRFLOW__CORE__PARALLELISM": str(parallelism), "HARVEST_PARTNERS_FILE": str(registry),
                     "PYTHONPATH": os.pathsep.join(str(p) for p in (args.plugins, support.ROOT)),
                     f"AIRFLOW_CONN_PARTNER_{partner.upper()}": json.dumps({"conn_type": "http", "host": url})}
        started = time.perf_counter()
        stack = e2e_stack.start_airflow(embedded_pg.start("bench"), base, cleanup, overrides)
        print(f"  Airflow started in {time.perf_counter() - started:.0f} s; {pool_line(sync_pools(stack), partner)}")
        live = support.control(url, "live_ids")
        runs = [("pool", args.pool)] + ([("control", args.control_pool)] if args.control_pool else [])
        for label, slots in runs:
            if slots != args.pool:
                write_registry(registry, partner, args.slices, args.records, slots)
                print(f"  {pool_line(sync_pools(stack), partner)}")
            figures = measure(stack, url, partner, slots, live)
            show(f"{label} ({slots} slots)", figures, args.records)
            if figures["max_in_flight"] > slots:
                failures.append(f"{label}: {figures['max_in_flight']} requests in flight with a pool of {slots}")
            if not figures["exact"] or figures["state"] != "success":
                failures.append(f"{label}: run {figures['state']}, records == live set: {figures['exact']}")
            if label == "control" and figures["max_in_flight"] <= args.pool:
                print(f"  note: the control run never went above {args.pool} in flight (the machine held it back)")
    for failure in failures:
        print(f"FAIL {failure}")
    if not failures:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
