"""A night the soak stops at its approval gate holds no lock on Airflow's metadata database.

The soak's ``dag.test()`` nights share one SQLite file (WAL mode, as Airflow sets it). The
reconcile waiting at its gate is stopped (SIGSTOP) while the partner's nightly harvest runs
in another process; stopped inside a write transaction, it kept that harvest from writing
(``sqlite3.OperationalError: database is locked``, a short-soak night lost). The stop now
waits for a sleep of the polling loop itself, where no transaction is open.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A loop of dag.test()'s shape: a write committed, then a sleep before the next poll, most
# of its time inside the write; the stop is asked for from another thread while the loop is
# inside it (the soak's approving thread, at any moment), so stopped at once it holds the lock.
POLLING_NIGHT = r"""
import sqlite3, sys, threading, time

from benchmarks.soak.night import stop_between_polls

db = sqlite3.connect(sys.argv[1], isolation_level=None)
requested, resumed, polling = threading.Event(), threading.Event(), threading.Event()


def poll_loop() -> None:
    while not resumed.is_set():
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE run SET polls = polls + 1")
        polling.set()
        inside = time.perf_counter() + 0.02
        while time.perf_counter() < inside:
            pass
        db.execute("COMMIT")
        time.sleep(0.001)


stop_between_polls(poll_loop, requested, resumed, reached_within=30)
threading.Thread(target=lambda: polling.wait() and requested.set()).start()  # as the gate starts waiting
poll_loop()
"""


def test_a_night_stopped_between_its_polls_lets_another_night_write(tmp_path: Path) -> None:
    path = tmp_path / "airflow.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE run (polls INTEGER)")
        db.execute("INSERT INTO run VALUES (0)")
    night = subprocess.Popen([sys.executable, "-c", POLLING_NIGHT, str(path)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    try:
        _, status = os.waitpid(night.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"the night ended instead of stopping: {night.stderr.read() if night.stderr else ''}"
        other = sqlite3.connect(path, timeout=0.5)  # another night's write, while the first is stopped
        with other:
            other.execute("UPDATE run SET polls = -1")
        other.close()
        os.kill(night.pid, signal.SIGCONT)
        assert night.wait(timeout=60) == 0, night.stderr.read() if night.stderr else ""
    finally:
        if night.poll() is None:
            night.kill()
            night.wait()
