"""A lease ends with its holder (I11): renewed while the task lives,
expiring within one TTL after it is killed with SIGKILL (no failure callback runs)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

from partner_harvest.store import connect, ensure_schema, leases

TTL = 1.5

HOLDER = textwrap.dedent("""
    import sys, time
    from datetime import timedelta
    from partner_harvest.store.leases import LeaseKeeper
    with LeaseKeeper(sys.argv[1], "p", "harvest_p/scheduled__1", "harvest", ttl=timedelta(seconds=float(sys.argv[2]))):
        print("held", flush=True)
        time.sleep(600)
""")


def reconcile_can_start(conn: psycopg.Connection) -> bool:
    try:
        leases.acquire(conn, "p", "reconcile_p/scheduled__1", leases.RECONCILE, timedelta(seconds=60))
        return True
    except leases.PartnerBusy:
        return False


def wait_for(condition: Callable[[], object], timeout: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_killed_holder_releases_the_partner_within_one_ttl(db: str) -> None:
    with connect(db) as conn:
        ensure_schema(conn)
    child = subprocess.Popen([sys.executable, "-c", HOLDER, db, str(TTL)], stdout=subprocess.PIPE, text=True,
                             cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2] / "plugins"))
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "held"
        with connect(db) as conn:
            # Alive: renewed past several TTLs, the partner stays held.
            deadline = time.monotonic() + 3 * TTL
            while time.monotonic() < deadline:
                assert not reconcile_can_start(conn)
                time.sleep(0.2)
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            killed_at = time.monotonic()
            waited = wait_for(lambda: reconcile_can_start(conn), timeout=TTL + 5)
        assert waited <= TTL + 1.0, f"the dead holder's lease lasted {waited:.1f} s after the kill"
        assert time.monotonic() - killed_at >= 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_task_leases_are_short(db: str) -> None:
    """No lease outlives a dead task by hours: the task layer's TTL is minutes."""
    assert leases.DEFAULT_TTL <= timedelta(minutes=10)
