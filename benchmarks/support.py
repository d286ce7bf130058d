"""What the benchmarks share: simulator processes, their control API, the embedded DB."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
for _path in (str(ROOT), str(ROOT / "plugins")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from include.simulators.process import control  # noqa: E402,F401 (benchmarks call support.control)
from include.simulators.process import simulator_process as simulator  # noqa: E402,F401 (and support.simulator)

if TYPE_CHECKING:
    from partner_harvest.registry import Partner


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that high-water mark across ``execve``,
    so a child spawned by a big parent would report the parent's size.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_child(script: str, *args: str) -> dict:
    """Run the benchmark's own --child mode in a fresh process; its last line is JSON."""
    out = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_arguments(parser: argparse.ArgumentParser, *extra: str) -> None:
    """The hidden arguments of a benchmark's ``--child`` mode, which :func:`run_child` passes."""
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--db", "--run-id", *extra):
        parser.add_argument(name, help=argparse.SUPPRESS)


def held_ids(db: str, partner_id: str) -> set[str]:
    from tests.support.db import held

    return held(db, partner_id)


def partner(**entry: Any) -> Partner:
    """A benchmark partner from a registry entry, through the registry (tests/support/partners.py):
    the production HTTP policy, no ``conn_id`` needed, harvested whole unless ``slicing`` says."""
    from tests.support.partners import partner_from_entry

    return partner_from_entry({"conn_id": "-", "lag": "10m", "slicing": {"max_slices": 1}, **entry})


def fresh_database(partner_id: str) -> str:
    """The benchmark database (embedded unless HARVEST_DATABASE_URL), partner emptied."""
    from include import embedded_pg
    from partner_harvest.store import connect, ensure_schema

    db = embedded_pg.start("bench")
    with connect(db) as conn:
        ensure_schema(conn)
    forget(db, partner_id)
    return db


def settle(db: str, partner_ids: list[str]) -> float:
    """Forget the partners a benchmark is about to load, then VACUUM (ANALYZE) the tables
    they leave dead rows in; returns the seconds it took.

    A load right after ``forget_partner`` of the same keys is not a first load: the unique
    index still holds every forgotten key, and each insert visits the dead row it points
    to (a 190,000-record insert took 10.0 s instead of 2.6 s). Autovacuum clears that
    between real loads; this does it before the measurements start.
    """
    import time

    import psycopg

    started = time.perf_counter()
    for partner_id in partner_ids:
        forget(db, partner_id)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) records, tombstones, deletions, staging")
    return time.perf_counter() - started


def forget(db: str, partner_id: str) -> None:
    """Drop a partner's rows (the baseline's database is emptied after its measurement),
    its change feed too: nobody consumes a benchmark partner's feed, and ``forget_partner``
    would otherwise add a deletion per record to it on every benchmark run."""
    from partner_harvest.store import connect
    from partner_harvest.store.admin import forget_partner

    with connect(db) as conn:
        with conn.transaction():
            for table in ("records", "deletions", "items", "holdings", "attached_deletions", "attachment_events"):
                conn.execute(f"DELETE FROM {table} WHERE partner_id = %s", (partner_id,))
        forget_partner(conn, partner_id)


def postgres_cpu_seconds() -> float | None:
    """CPU used so far by the embedded PostgreSQL (postmaster, its live backends and the
    children it reaped); None for a database given in HARVEST_DATABASE_URL."""
    from include import embedded_pg

    if os.environ.get(embedded_pg.DATABASE_URL_ENV):
        return None
    try:
        postmaster = int((embedded_pg.data_dir("bench") / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(entry) == postmaster or int(fields[1]) == postmaster:
            total += sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


def process_cpu_seconds(pid: int) -> float:
    """CPU (user + system) one live process has used so far, its threads included."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def child_pid(marker: str) -> int | None:
    """The pid of this process's live child whose command line contains ``marker``."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = stat.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if parent == me and marker in command:
            return int(entry)
    return None


class CpuMeter:
    """CPU seconds spent between ``start()`` and ``stop()`` by this process's reaped
    children (the measured client processes, start-up included), the embedded
    PostgreSQL and one simulator process: what a measurement cost the machine."""

    def __init__(self, simulator_pid: int | None) -> None:
        self.simulator_pid = simulator_pid

    def _now(self) -> dict[str, float]:
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "client": children.ru_utime + children.ru_stime,
            "postgres": postgres_cpu_seconds() or 0.0,
            "simulator": process_cpu_seconds(self.simulator_pid) if self.simulator_pid else 0.0,
        }

    def start(self) -> None:
        self._started = self._now()

    def stop(self) -> dict[str, float]:
        now = self._now()
        used = {k: now[k] - self._started[k] for k in now}
        used["total"] = sum(used.values())
        return used


def run_children_at_once(script: str, common: tuple[str, ...], window: str, channels: list[str]) -> list[dict]:
    """One ``--step piece`` child per slice channel, all started at once (a pool as wide as
    the plan), like Airflow's mapped slice tasks; their JSON figures in plan order."""
    workers = [subprocess.Popen([sys.executable, script, "--child", *common, "--step", "piece", "--window", window,
                                 "--channel", channel], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for channel in channels]
    results = []
    for worker in workers:
        out, err = worker.communicate()
        if worker.returncode != 0:
            raise SystemExit(f"slice worker failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results
