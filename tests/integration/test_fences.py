"""Fences (issue 23, I14): a task frozen past its lease's TTL writes nothing once it resumes.

A real child process runs the weekly reconcile under its lease and is frozen with a real
SIGSTOP right after it verified its vanished candidates; its renewal thread freezes with it,
the lease lapses, the nightly harvest takes the partner and applies records created
upstream after the sweep. On SIGCONT the reconcile must fail at its next write instead of
purging them (they are absent from its sweep).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from partner_harvest.store.leases import HARVEST, LeaseKeeper, release

ROOT = Path(__file__).resolve().parents[2]
TTL = 1.5
FAST = {"http": {"backoff_factor": 0.01, "retries": 2}}
RECONCILER = "reconcile_museum/scheduled__1"

# The reconcile task's body, as tasks.reconcile_partner runs it (lease, fenced connection),
# with a stop before its removals are staged: it says so and waits for a line on stdin.
CHILD = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    from partner_harvest import reconcile as task
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.registry import Partner
    from partner_harvest.store import connect
    from partner_harvest.store.leases import RECONCILE, LeaseKeeper
    try:
        from partner_harvest.store import fences
    except ImportError:  # the code before issue 23
        fences = None

    db, url, ttl, holder = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    stage_removals = task.sql.stage_removals

    def pause_then_stage(*args, **kwargs):
        print("verified", flush=True)
        sys.stdin.readline()
        return stage_removals(*args, **kwargs)

    task.sql.stage_removals = pause_then_stage
    partner = Partner(id="museum", protocol="oai-pmh", conn_id="-", metadata_prefix="oai_dc",
                      options={"http": {"backoff_factor": 0.01, "retries": 2}})
    keeper = LeaseKeeper(db, "museum", holder, RECONCILE, ttl=timedelta(seconds=ttl), release_on_exit=True)
    with keeper, connect(db) as conn:
        if fences is not None:
            fences.bind(conn, keeper.fence)
        try:
            outcome = task.reconcile(build_adapter(partner, Endpoint(url)), conn, partner, holder)
            print("applied " + json.dumps(outcome.as_dict()), flush=True)
        except Exception as exc:
            print(f"failed {type(exc).__name__}: {exc}", flush=True)
""")


def oai_partner() -> Partner:
    return Partner(id="museum", protocol="oai-pmh", conn_id="-", metadata_prefix="oai_dc", options=FAST)


def harvest_and_apply(sim: OaiSimulator, conn: psycopg.Connection, run_id: str) -> None:
    adapter = build_adapter(oai_partner(), Endpoint(sim.base_url))
    window = pipeline.freeze_window(adapter, timedelta(minutes=10), None, pipeline.RunRequest("full"))
    pipeline.harvest_window(adapter, conn, RunRef("museum", run_id), window)
    pipeline.apply_changes(conn, "museum", run_id)


def lease_lapsed(db: str, holder: str) -> bool:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT expires_at < now() FROM partner_leases WHERE partner_id = 'museum' AND holder = %s",
                           (holder,)).fetchone()
    return row is None or row[0]


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.05)


def test_a_reconcile_frozen_past_its_lease_never_purges_what_the_next_harvest_applied(db: str) -> None:
    repo = SimulatedRepository(records=300, page_size=100, deleted_record="no", deleted_fraction=0.0, seed=231)
    with connect(db) as conn:
        ensure_schema(conn)
    with OaiSimulator(repo) as sim, connect(db) as conn:
        harvest_and_apply(sim, conn, "first")
        vanished = set(repo.delete(2))  # the reconcile's real work: two records gone upstream
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
        child = subprocess.Popen([sys.executable, "-c", CHILD, db, sim.base_url, str(TTL), RECONCILER],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
        try:
            assert child.stdout.readline().strip() == "verified"
            child.send_signal(signal.SIGSTOP)  # its renewal thread stops too
            wait_for(lambda: lease_lapsed(db, RECONCILER), timeout=TTL + 10)
            added = set(repo.add(3))  # created upstream after the sweep passed
            with LeaseKeeper(db, "museum", "harvest_museum/scheduled__2", HARVEST, ttl=timedelta(seconds=60)):
                harvest_and_apply(sim, conn, "harvest_museum/scheduled__2")
            release(conn, "museum", "harvest_museum/scheduled__2")
            assert added <= live_identifiers(conn, "museum")
            conn.commit()
            child.stdin.write("go\n")
            child.stdin.flush()
            child.send_signal(signal.SIGCONT)
            out, _ = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        held = live_identifiers(conn, "museum")
        false_deletions = conn.execute("SELECT identifier FROM deletions WHERE partner_id = 'museum'"
                                       " AND identifier = ANY(%s)", (sorted(added),)).fetchall()
        conn.commit()
        assert added <= held, f"the resumed reconcile purged {sorted(added - held)}: {out}"
        assert false_deletions == [], "the change feed announced deletions of records the partner holds"
        assert out.startswith("failed LeaseLost") and "museum" in out and "no longer held" in out, out
        assert vanished <= held  # nothing of the stale reconcile landed: the next one removes them
