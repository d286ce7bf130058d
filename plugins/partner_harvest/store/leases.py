"""Partner leases: harvest runs of a partner may overlap, a reconcile never overlaps them.

A reconcile compares the partner's whole id set with ``records``; a harvest applying in
between would make it purge what just arrived, or miss what just left. A lease ends with
its holder (I11): it is short and renewed in the background while the task runs, so a
task killed with SIGKILL (OOM killer, lost node) stops renewing it and it expires within
one TTL, whether or not a failure callback ever runs.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from types import TracebackType

import psycopg

from partner_harvest.errors import PartnerAsksToWait
from partner_harvest.store.db import connect

log = logging.getLogger(__name__)

HARVEST, RECONCILE = "harvest", "reconcile"
DEFAULT_TTL = timedelta(minutes=5)


# A task that finds the partner busy comes back when the other lease could have ended (it
# is renewed while its holder lives), at most RECHECK_AFTER later, at least MIN_WAIT.
MIN_WAIT = timedelta(seconds=5)
RECHECK_AFTER = timedelta(seconds=60)


class PartnerBusy(PartnerAsksToWait):
    """Another kind of run holds the partner: come back when its lease could have ended.

    A wait, not a failure (issue 9): the task gives its worker slot back and uses no retry,
    so a harvest that meets a long weekly reconcile neither burns its retries nor alerts.
    """


def acquire(conn: psycopg.Connection, partner_id: str, holder: str, kind: str, ttl: timedelta) -> None:
    """Take (or renew) the lease; raises PartnerBusy if a conflicting run holds one."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('lease:' || %s))", (partner_id,))
        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND expires_at < now()", (partner_id,))
        conflicts = conn.execute(
            """
            SELECT holder, kind, acquired_at, GREATEST(LEAST(expires_at, now() + %s), now() + %s) FROM partner_leases
            WHERE partner_id = %s AND holder <> %s AND (kind = %s OR %s = %s)
            ORDER BY acquired_at LIMIT 1
            """,
            (RECHECK_AFTER, MIN_WAIT, partner_id, holder, RECONCILE, kind, RECONCILE),
        ).fetchone()
        if conflicts:
            other, other_kind, since, resume_at = conflicts
            raise PartnerBusy(
                partner_id, f"{kind} lease",
                f"a {other_kind} run ({other}) has been working on this partner since {since:%Y-%m-%d %H:%M:%S}Z; "
                "a reconcile and a harvest never run at the same time — this task waits for its lease",
                resume_at,
            )
        conn.execute(
            """
            INSERT INTO partner_leases (partner_id, holder, kind, expires_at)
            VALUES (%s, %s, %s, now() + %s)
            ON CONFLICT (partner_id, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at, kind = EXCLUDED.kind
            """,
            (partner_id, holder, kind, ttl),
        )


def renew(conn: psycopg.Connection, partner_id: str, holder: str, ttl: timedelta) -> bool:
    """Push the lease's expiry forward; False when it is gone (expired and taken)."""
    with conn.transaction():
        cur = conn.execute(
            "UPDATE partner_leases SET expires_at = now() + %s WHERE partner_id = %s AND holder = %s",
            (ttl, partner_id, holder),
        )
    return cur.rowcount == 1


def release(conn: psycopg.Connection, partner_id: str, holder: str) -> None:
    with conn.transaction():
        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND holder = %s", (partner_id, holder))


class LeaseKeeper:
    """Holds a lease while a block runs, renewing it every ``ttl / 3`` from a thread.

    On exit the lease is left to expire (the run's next task takes it again) unless
    ``release_on_exit``; a holder that dies stops renewing, so its lease ends within ``ttl``.
    """

    def __init__(self, conninfo: str, partner_id: str, holder: str, kind: str, *,
                 ttl: timedelta = DEFAULT_TTL, release_on_exit: bool = False):
        self.conninfo, self.partner_id, self.holder, self.kind = conninfo, partner_id, holder, kind
        self.ttl = ttl
        self.release_on_exit = release_on_exit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "LeaseKeeper":
        with connect(self.conninfo) as conn:
            acquire(conn, self.partner_id, self.holder, self.kind, self.ttl)
        self._thread = threading.Thread(target=self._renew_until_stopped, name=f"lease-{self.partner_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.release_on_exit:
            with connect(self.conninfo) as conn:
                release(conn, self.partner_id, self.holder)

    def _renew_until_stopped(self) -> None:
        interval = max(self.ttl.total_seconds() / 3, 0.05)
        conn: psycopg.Connection | None = None
        while not self._stop.wait(interval):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.conninfo)
                if not renew(conn, self.partner_id, self.holder, self.ttl):
                    log.warning("%s: the %s lease of %s was lost (expired and cleared); renewing it again",
                                self.partner_id, self.kind, self.holder)
                    acquire(conn, self.partner_id, self.holder, self.kind, self.ttl)
            except Exception as exc:  # a database blip must not kill the task; the next beat retries
                log.warning("%s: could not renew the %s lease: %s", self.partner_id, self.kind, exc)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
