"""Fences (I14): a task frozen past its lease's TTL writes nothing once it resumes.

A real child process runs the weekly reconcile under its lease and is frozen with a real
SIGSTOP right after it verified its vanished candidates; its renewal thread freezes with it,
the lease lapses, the nightly harvest takes the partner and applies records created
upstream after the sweep. On SIGCONT the reconcile must fail at its next write instead of
purging them (they are absent from its sweep).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.store import RunRef, connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from partner_harvest.store.db import scalar
from partner_harvest.store.leases import HARVEST, LeaseKeeper, release
from partner_harvest.window import WindowFacts
from tests.support.harness import run_once
from tests.support.partners import oai_partner

ROOT = Path(__file__).resolve().parents[2]
TTL = 1.5
RECONCILER = "reconcile_museum/scheduled__1"

# The reconcile task's body, as tasks.reconcile_partner runs it (lease, fenced connection),
# with a stop before its removals are staged: it says so and waits for a line on stdin.
CHILD = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    from partner_harvest import reconcile as task
    from partner_harvest.factory import Endpoint, build_adapter
    from tests.support.partners import oai_partner
    from partner_harvest.store import connect
    from partner_harvest.store.leases import RECONCILE, LeaseKeeper
    try:
        from partner_harvest.store import fences
    except ImportError:  # the code before fences
        fences = None

    db, url, ttl, holder = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    stage_removals = task.sql.stage_removals

    def pause_then_stage(*args, **kwargs):
        print("verified", flush=True)
        sys.stdin.readline()
        return stage_removals(*args, **kwargs)

    task.sql.stage_removals = pause_then_stage
    partner = oai_partner()
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


def harvest_and_apply(sim: OaiSimulator, conn: psycopg.Connection, run_id: str) -> None:
    run_once(sim, conn, oai_partner(), run_id, request=pipeline.RunRequest("full"))


def lease_lapsed(db: str, holder: str) -> bool:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT expires_at < now() FROM partner_leases WHERE partner_id = 'museum' AND holder = %s",
                           (holder,)).fetchone()
    return row is None or row[0]


def wait_for(condition: Callable[[], object], timeout: float) -> None:
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
        assert child.stdin is not None and child.stdout is not None
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


HARVEST_CHILD = textwrap.dedent("""
    import sys
    from datetime import timedelta
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from tests.support.partners import oai_partner
    from partner_harvest.store import RunRef, connect, staging
    from partner_harvest.store.leases import HARVEST, LeaseKeeper
    try:
        from partner_harvest.store import fences
    except ImportError:  # the code before fences
        fences = None

    db, url, ttl, holder = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    write_page = staging.StagingWriter.write_page
    pages = []

    def pause_at_the_second_page(self, items, *args, **kwargs):
        pages.append(len(items))
        if len(pages) == 2:
            print("paged", flush=True)
            sys.stdin.readline()
        return write_page(self, items, *args, **kwargs)

    staging.StagingWriter.write_page = pause_at_the_second_page
    partner = oai_partner()
    keeper = LeaseKeeper(db, "museum", holder, HARVEST, ttl=timedelta(seconds=ttl))
    with keeper, connect(db) as conn:
        if fences is not None:
            fences.bind(conn, keeper.fence)
        try:
            adapter = build_adapter(partner, Endpoint(url))
            window = pipeline.freeze_window(adapter, timedelta(minutes=10), None, pipeline.RunRequest("full"))
            pipeline.harvest_window(adapter, conn, RunRef("museum", holder), window)
            pipeline.apply_changes(conn, "museum", holder)
            print("applied", flush=True)
        except Exception as exc:
            print(f"failed {type(exc).__name__}: {exc}", flush=True)
""")


def test_a_harvest_frozen_past_its_lease_stops_at_its_next_page(db: str) -> None:
    """A harvest task SIGSTOPped between two pages past its TTL while a reconcile took the
    partner: on SIGCONT its next page fails (LeaseLost, retryable), nothing of it applies."""
    repo = SimulatedRepository(records=400, page_size=100, deleted_fraction=0.0, seed=232)
    holder = "harvest_museum/scheduled__3"
    with connect(db) as conn:
        ensure_schema(conn)
    with OaiSimulator(repo) as sim, connect(db) as conn:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
        child = subprocess.Popen([sys.executable, "-c", HARVEST_CHILD, db, sim.base_url, str(TTL), holder],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "paged"
            child.send_signal(signal.SIGSTOP)
            wait_for(lambda: lease_lapsed(db, holder), timeout=TTL + 10)
            with LeaseKeeper(db, "museum", "reconcile_museum/scheduled__3", "reconcile", ttl=timedelta(seconds=60),
                             release_on_exit=True):
                pass  # the weekly reconcile took the partner (and finished)
            child.stdin.write("go\n")
            child.stdin.flush()
            child.send_signal(signal.SIGCONT)
            out, _ = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        applied = scalar(conn.execute("SELECT count(*) FROM records WHERE partner_id = 'museum'"))
        staged = scalar(conn.execute("SELECT count(*) FROM staging WHERE run_id = %s", (holder,)))
        conn.commit()
        assert out.startswith("failed LeaseLost"), out
        assert applied == 0 and staged <= 100, (applied, staged)  # the first page only: the second never landed


def test_lease_tokens_only_grow_and_a_lapsed_tenure_gets_a_new_one(db: str) -> None:
    from partner_harvest.store.leases import acquire

    with connect(db) as conn:
        ensure_schema(conn)
        first = acquire(conn, "p", "run-1", HARVEST, timedelta(seconds=60))
        assert acquire(conn, "p", "run-1", HARVEST, timedelta(seconds=60)) == first  # a sibling task joins
        second = acquire(conn, "p", "run-2", HARVEST, timedelta(seconds=60))
        conn.execute("UPDATE partner_leases SET expires_at = now() - interval '1 second' WHERE holder = 'run-1'")
        conn.commit()
        third = acquire(conn, "p", "run-1", HARVEST, timedelta(seconds=60))  # lapsed: a new tenure
        assert first < second < third
        conn.execute("DELETE FROM partner_leases")  # what forget removes; tokens are kept
        conn.commit()
        assert acquire(conn, "p", "run-1", HARVEST, timedelta(seconds=60)) > third
        assert acquire(conn, "q", "run-1", HARVEST, timedelta(seconds=60)) == 1  # per partner


def test_a_keeper_that_cannot_renew_stops_the_work_at_its_next_page(db: str) -> None:
    """The keeper finds its tenure gone (removed here as a lapse-and-take would): it marks
    the fence lost at once, and the next page fails without writing, naming the partner."""
    from partner_harvest.records import Record
    from partner_harvest.store import StagingWriter, fences
    from partner_harvest.store.runs import begin_run
    from partner_harvest.window import Window

    with connect(db) as conn:
        ensure_schema(conn)
    keeper = LeaseKeeper(db, "museum", "run-9", HARVEST, ttl=timedelta(seconds=0.3))
    with keeper, connect(db) as conn:
        fences.bind(conn, keeper.fence)
        run = RunRef("museum", "run-9")
        window = Window("full", None, datetime(2026, 1, 1, tzinfo=timezone.utc), "seconds", False, WindowFacts())
        attempt = begin_run(conn, run, window, "oai_dc")
        writer = StagingWriter(conn, run, attempt=attempt)
        stamp = window.until
        writer.write_page([Record("a", stamp, "oai_dc", "<x/>")])
        with psycopg.connect(db, autocommit=True) as other:
            other.execute("DELETE FROM partner_leases WHERE holder = 'run-9'")
        assert keeper.fence is not None and keeper.fence.lost.wait(5), "the keeper never noticed"
        with pytest.raises(fences.LeaseLost, match="museum"):
            writer.write_page([Record("b", stamp, "oai_dc", "<y/>")])
        assert scalar(conn.execute("SELECT count(*) FROM staging WHERE run_id = 'run-9'")) == 1


def test_a_run_staged_before_an_operator_command_never_applies_after_it(db: str) -> None:
    """reset-cursor (any epoch bump) between a run's harvest and its apply: the apply fails
    naming the command and nothing of the run lands; the next run plans afresh."""
    from partner_harvest.store import fences
    from partner_harvest.store.fences import PartnerChanged, bump_epoch

    repo = SimulatedRepository(records=200, page_size=100, deleted_fraction=0.0, seed=233)
    with connect(db) as conn:
        ensure_schema(conn)
    holder = "harvest_museum/manual__4"
    with OaiSimulator(repo) as sim, connect(db) as conn:
        keeper = LeaseKeeper(db, "museum", holder, HARVEST, ttl=timedelta(seconds=60))
        with keeper:
            fences.bind(conn, keeper.fence)
            adapter = build_adapter(oai_partner(), Endpoint(sim.base_url))
            window = pipeline.freeze_window(adapter, timedelta(minutes=10), None, pipeline.RunRequest("full"))
            pipeline.harvest_window(adapter, conn, RunRef("museum", holder), window)
            with psycopg.connect(db) as operator, operator.transaction():
                bump_epoch(operator, "museum", "reset-cursor")
            with pytest.raises(PartnerChanged, match="`partner-harvest reset-cursor` changed this partner"):
                pipeline.apply_changes(conn, "museum", holder)
        assert scalar(conn.execute("SELECT count(*) FROM records")) == 0
        status = scalar(conn.execute("SELECT status FROM harvest_runs WHERE run_id = %s", (holder,)))
        conn.commit()
        assert status == "failed"
