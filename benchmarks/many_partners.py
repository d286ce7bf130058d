"""Many partners on one real Airflow: what a first night, a quiet night and an idle hour cost.

A real api-server, scheduler and dag-processor (LocalExecutor; tests/support/airflow_stack.py),
one OAI-PMH simulator, one Connection and one pool per partner, the metadata and the
aggregation databases on one embedded PostgreSQL. Figures are CPU-seconds read from
/proc (user + system of every process of each service's session, reaped children
included; PostgreSQL: the postmaster and its children), not wall time: the machine is
shared. The simulator (the partners' side) is not counted.

    .venv/bin/python benchmarks/many_partners.py --partners 10 100
    .venv/bin/python benchmarks/many_partners.py --partners 100 --shards 4

The dag-processor and the scheduler run with the ``[dag_processor]`` and ``[scheduler]``
settings of the checkout's ``airflow.cfg.example`` (none: Airflow's defaults), so the same
script run from an older checkout measures "before". benchmarks/idle_cpu.py measures the
idle hour of two settings side by side.
"""

from __future__ import annotations

import argparse
import configparser
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from typing import Any

from benchmarks.support import ROOT  # noqa: E402 (a runtime directory for PostgreSQL too)
from include import embedded_pg  # noqa: E402
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository  # noqa: E402
from tests.support.airflow_stack import (  # noqa: E402
    SERVICES,
    AirflowServices,
    Keys,
    Timing,
    airflow_settings,
    clean_environ,
    code_path,
    create_database,
    free_loopback_port,
    http_connection,
    postgres_connection,
)

TICK = os.sysconf("SC_CLK_TCK")
PG_LABEL = f"bench-many-{os.getpid()}"  # a server per run: its CPU is this run's alone
# Airflow's defaults but for airflow.cfg.example's [dag_processor] and [scheduler] keys; new DAG files found within 5 s.
TIMING = Timing(dag_refresh=5, min_file_process=None, heartbeat=None, idle_sleep=None)


# ---------------------------------------------------------------------------- CPU from /proc
def _stat(pid: int) -> tuple[int, int, float] | None:
    """(ppid, session, CPU-s incl. reaped children) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    ppid, session = int(fields[1]), int(fields[3])
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return ppid, session, (utime + stime + cutime + cstime) / TICK


def cpu_snapshot(services: dict[str, int], postmaster: int) -> dict[str, float]:
    """CPU-s so far per service (its session: task runners included) and PostgreSQL."""
    totals = dict.fromkeys([*services, "postgres"], 0.0)
    by_session = {sid: name for name, sid in services.items()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is None:
            continue
        ppid, session, cpu = stat
        if session in by_session:
            totals[by_session[session]] += cpu
        elif int(entry) == postmaster or ppid == postmaster:
            totals["postgres"] += cpu
    return totals


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


# ---------------------------------------------------------------------------- the stack
def write_registry(path: Path, ids: list[str]) -> None:
    lines = ["partners:"]
    for pid in ids:
        lines += [f"  - id: {pid}", "    protocol: oai-pmh", f"    conn_id: partner_{pid}", "    metadata_prefix: auto",
                  "    lag: 5m", "    options: {http: {backoff_factor: 0.01, retries: 1}}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def dag_processor_settings() -> dict[str, str]:
    """The ``[dag_processor]`` and ``[scheduler]`` keys of this checkout's airflow.cfg.example."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "airflow.cfg.example")
    env = {}
    for section in ("dag_processor", "scheduler"):
        if parser.has_section(section):
            for key, value in parser.items(section):
                env[f"AIRFLOW__{section.upper()}__{key.upper()}"] = value
    return env


@dataclass
class Night:
    name: str
    wall: float
    cpu: dict[str, float]
    tasks: int
    requests: int
    states: dict[str, int]


class ManyPartners:
    """``settings`` (AIRFLOW__* variables) replace the checkout's ``[dag_processor]`` keys;
    each stack with its own ``pg_label`` has a PostgreSQL server (and CPU figure) of its own."""

    def __init__(self, count: int, shards: int, work: Path, *, settings: dict[str, str] | None = None,
                 services: tuple[str, ...] = SERVICES, pg_label: str = PG_LABEL,
                 connections: str = "environment") -> None:
        self.count, self.shards, self.work, self.connections = count, shards, work, connections
        self.settings = dag_processor_settings() if settings is None else settings
        self.services, self.pg_label = services, pg_label
        self.ids = [f"p{i:05d}" for i in range(count)]

    def start(self) -> None:
        server = embedded_pg.start(self.pg_label)
        self.postmaster = int((embedded_pg.data_dir(self.pg_label) / "postmaster.pid").read_text().split()[0])
        suffix = uuid.uuid4().hex[:8]
        self.meta_db = create_database(server, f"many_airflow_{suffix}")
        self.agg_db = create_database(server, f"many_agg_{suffix}")
        now = datetime.now(timezone.utc).replace(microsecond=0)
        self.simulator = OaiSimulator(SimulatedRepository(records=60, page_size=100, seed=28, start_clock=now)).start()
        registry = self.work / "partners.yaml"
        write_registry(registry, self.ids)
        dags = self.work / "dags"
        shutil.copytree(ROOT / "dags", dags, ignore=shutil.ignore_patterns("__pycache__", "example_*"))
        home = self.work / "airflow_home"
        home.mkdir()
        port = free_loopback_port()
        env = clean_environ()
        env.update({"AIRFLOW_HOME": str(home), "PYTHONPATH": code_path(), "PYTHONUNBUFFERED": "1"})
        env.update(airflow_settings(home=home, port=port, metadata_db=self.meta_db, keys=Keys.fresh(),
                                    triggered_only=True, timing=TIMING))
        for key in ("PARSING_PROCESSES", "REFRESH_INTERVAL"):  # the checkout's settings or Airflow's
            env.pop(f"AIRFLOW__DAG_PROCESSOR__{key}", None)
        env.update(self.settings)
        env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "HARVEST_PARTNERS_FILE": str(registry)})
        if self.connections == "environment":
            env["AIRFLOW_CONN_AGGREGATION_DB"] = postgres_connection(self.agg_db)
            for pid in self.ids:
                env[f"AIRFLOW_CONN_PARTNER_{pid.upper()}"] = http_connection(self.simulator.base_url)
        if self.shards > 1:
            subprocess.run([sys.executable, "-m", "partner_harvest.cli", "shards", "--shards", str(self.shards),
                            str(dags)], env=env, check=True)
        self.stack = AirflowServices(env, self.work, port, self.services)
        self.stack.migrate(timeout=900)
        self.stack.start()
        self.stack.wait_healthy(300)
        self.sessions = {name: os.getsid(proc.pid) for name, proc in self.stack.processes.items()}
        started = time.monotonic()
        self.stack.wait_for_dags([f"harvest_{pid}" for pid in self.ids], timeout=1800)
        self.first_parse = time.monotonic() - started
        self.stack.wait_for_dags([f"reconcile_{pid}" for pid in self.ids], timeout=1800)
        time.sleep(30)  # let the first pass of every file end before the idle hour is measured
        pools = [f"partner_{pid}" for pid in self.ids]
        self.stack.ensure_pools(pools, slots=1, description="many partners")
        if self.connections == "metastore":  # as `partner-harvest onboard` or the UI stores them
            connections = {"aggregation_db": postgres_connection(self.agg_db)}
            connections.update({f"partner_{pid}": http_connection(self.simulator.base_url) for pid in self.ids})
            for conn_id, value in connections.items():
                self._api("POST", "/connections", json={"connection_id": conn_id, **json.loads(value)},
                          expect=(201,))

    def seed_history(self) -> float:
        """The nights before the steady quiet one, run through the library instead of Airflow: a
        first harvest, then an incremental run that fetched nothing, the remembered ``auto`` prefix
        and the cursor Variable (through the REST API). What ``freeze_window`` then finds is what
        two real nights leave behind, so the next night is a quiet one (airflow/quiet.py). Returns
        the wall seconds it took (not counted: the services' CPU is read around each night)."""
        from partner_harvest.factory import Endpoint, build_adapter
        from partner_harvest.registry import cursor_value, load_registry
        from partner_harvest.run import CHANGES, run_partner
        from partner_harvest.store import connect, prefix_choices

        logging.getLogger("partner_harvest").setLevel(logging.WARNING)  # 2 runs a partner: keep the output short
        started = time.monotonic()
        registry = load_registry(self.work / "partners.yaml")
        with connect(self.agg_db) as conn:
            for number, partner in enumerate(registry.partners, 1):
                adapter = build_adapter(partner, Endpoint(self.simulator.base_url))
                first = run_partner(partner, adapter, conn, f"{partner.dag_id}/seed__first")
                prefix = first.window.protocol.metadata_prefix
                assert prefix, f"{partner.id}: the first harvest chose no prefix"
                prefix_choices.remember(conn, partner.id, prefix)
                chosen = partner.evolve(metadata_prefix=prefix)
                second = run_partner(chosen, build_adapter(chosen, Endpoint(self.simulator.base_url)), conn,
                                     f"{partner.dag_id}/seed__quiet1", first.cursors)
                assert second.changes.fetched == 0, f"{partner.id}: the seeded second night fetched records"
                until = second.cursors[CHANGES]
                assert until is not None
                value = cursor_value(until, second.window.granularity, "seed__quiet1")
                self._api("POST", "/variables", expect=(201,),
                          json={"key": partner.cursor_key, "value": json.dumps(value),
                                "description": f"harvest cursor of partner {partner.id}"})
                if number % 100 == 0:
                    print(f"seeded {number} of {self.count} partners", flush=True)
        return time.monotonic() - started

    def stop(self) -> None:
        if getattr(self, "stack", None):
            self.stack.stop()
        if getattr(self, "simulator", None):
            self.simulator.stop()

    def cpu(self) -> dict[str, float]:
        return cpu_snapshot(self.sessions, self.postmaster)

    def idle(self, seconds: float) -> dict[str, float]:
        """CPU-s per service over ``seconds`` with no run at all."""
        before = self.cpu()
        time.sleep(seconds)  # measuring a rate over a span of time, not waiting for a state
        return delta(self.cpu(), before)

    def _api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One REST call, asked again after a timeout (a loaded machine answers late)."""
        import requests

        for attempt in range(10):
            try:
                return self.stack.api(method, path, timeout=120, **kwargs)
            except requests.RequestException:
                if attempt == 9:
                    raise
                time.sleep(5)  # the api-server is busy: ask again later
        raise AssertionError("unreachable")

    def runs(self, run_id: str) -> dict[str, str]:
        """Every partner's run of ``run_id``: dag id -> state (one batch call)."""
        body = {"dag_ids": [f"harvest_{pid}" for pid in self.ids], "page_limit": 10000}
        found = self._api("POST", "/dags/~/dagRuns/list", json=body)["dag_runs"]
        return {r["dag_id"]: r["state"] for r in found if r["dag_run_id"] == run_id}

    def night(self, name: str) -> Night:
        self.simulator.repo.advance_clock(3600)  # an hour on: each night's cursor moves, as in production
        requests_before = len(self.simulator.requests)
        before, started = self.cpu(), time.monotonic()
        logical = datetime.now(timezone.utc)
        run_id = f"many__{name}__{uuid.uuid4().hex[:6]}"
        for pid in self.ids:
            self._api("POST", f"/dags/harvest_{pid}/dagRuns",
                      json={"dag_run_id": run_id, "logical_date": logical.isoformat(), "conf": {}})
        deadline = time.monotonic() + 7200
        while True:
            states = self.runs(run_id)
            if len(states) == self.count and all(s in ("success", "failed") for s in states.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} night unfinished: {states}")
            time.sleep(5)  # polls the runs' observable state; seldom, to keep the api-server's share small
        wall = time.monotonic() - started
        cpu = delta(self.cpu(), before)
        body = {"dag_ids": [f"harvest_{pid}" for pid in self.ids], "dag_run_ids": [run_id], "page_limit": 100000}
        tis = self._api("POST", "/dags/~/dagRuns/~/taskInstances/list", json=body)["task_instances"]
        tasks = sum(1 for ti in tis if ti["state"] in ("success", "failed") and ti.get("start_date"))
        counted: dict[str, int] = {}
        for state in states.values():
            counted[state] = counted.get(state, 0) + 1
        night = Night(name, wall, cpu, tasks, len(self.simulator.requests) - requests_before, counted)
        print(f"night {night}", flush=True)  # the figures so far, should a later night fail
        return night


def report(count: int, shards: int, idle_s: float, stack: ManyPartners, nights: list[Night],
           idle: dict[str, float]) -> None:
    per_hour = {k: v * 3600 / idle_s for k, v in idle.items()}
    print(f"\n== {count} partners, code {ROOT}, shards {shards or 1}, "
          f"[dag_processor] {dag_processor_settings() or 'Airflow defaults'}")
    print(f"first parse of every harvest DAG: {stack.first_parse:.0f} s wall")
    print("idle CPU-s per hour: " + ", ".join(f"{k} {v:.0f}" for k, v in per_hour.items()))
    daily_share = per_hour["dag-processor"] * 24 / count
    print("| partners | night | wall | CPU-s in all | CPU-s per partner | without the dag-processor "
          "| + its idle day per partner | = per partner | tasks per partner | requests per partner | runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for night in nights:
        total = sum(night.cpu.values())
        rest = (total - night.cpu["dag-processor"]) / count  # its night is inside its day
        print(f"| {count} | {night.name} | {night.wall:.0f} s | {total:.0f} | {total / count:.2f} | {rest:.2f} "
              f"| {daily_share:.2f} | {rest + daily_share:.2f} | {night.tasks / count:.1f} "
              f"| {night.requests / count:.1f} | {night.states} |")
        print("    by service: " + ", ".join(f"{k} {v:.1f}" for k, v in night.cpu.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partners", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--shards", type=int, default=0)
    parser.add_argument("--idle", type=float, default=120.0, help="seconds of the idle measurement")
    parser.add_argument("--nights", type=int, choices=range(4), default=3,
                        help="how many of the nights first, quiet1, quiet to run (0: the parse and the idle hour only)")
    parser.add_argument("--history", choices=("airflow", "seeded"), default="airflow",
                        help="seeded: the first and quiet1 nights run through the library (not measured), then two "
                             "quiet nights on the scheduler, the second the steady one (for 1,000 partners and more)")
    parser.add_argument("--connections", choices=("environment", "metastore"), default="environment",
                        help="where the Connections live: AIRFLOW_CONN_* variables, or Airflow's metadata database "
                             "(a task then asks the api-server for each one it reads)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each stack's logs (services, task logs) under this directory")
    args = parser.parse_args()
    for count in args.partners:
        with tempfile.TemporaryDirectory(prefix="many-partners-") as tmp:
            work = Path(tmp) if args.keep is None else Path(tempfile.mkdtemp(prefix=f"{count}-", dir=args.keep))
            print(f"work directory {work}", flush=True)
            stack = ManyPartners(count, args.shards, work, connections=args.connections)
            try:
                stack.start()
                idle = stack.idle(args.idle)
                print(f"idle {args.idle:.0f} s: {idle}", flush=True)
                # The second night follows one that fetched records; from the third on a quiet
                # partner's night is what it is every night after (airflow/quiet.py).
                names = ("first", "quiet1", "quiet")[:args.nights]
                if args.history == "seeded":
                    print(f"history seeded through the library in {stack.seed_history():.0f} s", flush=True)
                    names = ("quiet0", "quiet")[:args.nights]  # quiet0: the services' first night (cold caches)
                nights = [stack.night(name) for name in names]
            finally:
                stack.stop()
            report(count, args.shards, args.idle, stack, nights, idle)


if __name__ == "__main__":
    main()
