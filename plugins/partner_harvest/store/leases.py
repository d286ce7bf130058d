"""Partner leases: harvest runs of a partner may overlap, a reconcile never overlaps them.

A reconcile compares the partner's whole id set with ``records``; a harvest applying in
between would make it purge what just arrived, or miss what just left. A lease ends with
its holder (I11): it is short and renewed in the background while the task runs, so a
task killed with SIGKILL (OOM killer, lost node) stops renewing it and it expires within
one TTL, whether or not a failure callback ever runs.

Each tenure of a lease carries a fencing token (store/fences.py): a holder frozen past its
TTL whose lease was taken meanwhile finds its token gone at its next write, and its keeper
stops renewing and tells it at once instead of taking the lease again behind its back.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from types import TracebackType

import psycopg

from partner_harvest.errors import PartnerAsksToWait
from partner_harvest.store import fences
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

    A wait, not a failure: the task gives its worker slot back and uses no retry,
    so a harvest that meets a long weekly reconcile neither burns its retries nor alerts.
    """


def acquire(conn: psycopg.Connection, partner_id: str, holder: str, kind: str, ttl: timedelta) -> int:
    """Take (or join) the lease; returns its fencing token. Raises PartnerBusy if a
    conflicting run holds one.

    The run's tasks join one tenure (a run's mapped slices hold the lease together): a live
    row of the same holder keeps its token; a lapsed one is removed and a new tenure, with
    a new token, begins, so a frozen task of the old tenure can no longer write.
    """
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
        joined = conn.execute(
            "UPDATE partner_leases SET expires_at = now() + %s, kind = %s WHERE partner_id = %s AND holder = %s"
            " AND token IS NOT NULL RETURNING token",
            (ttl, kind, partner_id, holder),
        ).fetchone()
        if joined:
            return joined[0]
        token = fences.next_token(conn, partner_id)
        conn.execute(
            """
            INSERT INTO partner_leases (partner_id, holder, kind, expires_at, token)
            VALUES (%s, %s, %s, now() + %s, %s)
            ON CONFLICT (partner_id, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at, kind = EXCLUDED.kind,
                token = EXCLUDED.token
            """,
            (partner_id, holder, kind, ttl, token),
        )
        return token


def renew(conn: psycopg.Connection, partner_id: str, holder: str, ttl: timedelta, token: int | None = None) -> bool:
    """Push the lease's expiry forward; False when its tenure is gone (lapsed and taken,
    or removed by ``forget``). With ``token``, only that tenure is renewed. A lapsed row
    nobody removed is still the tenure: anyone taking the partner removes it first."""
    with conn.transaction():
        cur = conn.execute(
            "UPDATE partner_leases SET expires_at = now() + %s WHERE partner_id = %s AND holder = %s"
            " AND (%s::bigint IS NULL OR token = %s::bigint)",
            (ttl, partner_id, holder, token, token),
        )
    return cur.rowcount == 1


def release(conn: psycopg.Connection, partner_id: str, holder: str, token: int | None = None) -> None:
    """End the lease; with ``token``, only that tenure (a lost one is left to its new holder)."""
    with conn.transaction():
        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND holder = %s"
                     " AND (%s::bigint IS NULL OR token = %s::bigint)", (partner_id, holder, token, token))


class LeaseKeeper:
    """Holds a lease while a block runs, renewing it every ``ttl / 3`` from a thread.

    On exit the lease is left to expire (the run's next task takes it again) unless
    ``release_on_exit``; a holder that dies stops renewing, so its lease ends within ``ttl``.

    ``fence`` (after entering) is what the block's writes check (store/fences.py):
    ``epoch`` is the epoch the run was planned at, None for the partner's current one
    (a task that plans, or a reconcile, which plans and writes in one task). When a renewal
    finds the tenure gone, or none succeeded for a whole TTL, the keeper stops renewing and
    marks the fence lost: the block's next write fails at once.
    """

    def __init__(self, conninfo: str, partner_id: str, holder: str, kind: str, *,
                 ttl: timedelta = DEFAULT_TTL, release_on_exit: bool = False, epoch: int | None = None):
        self.conninfo, self.partner_id, self.holder, self.kind = conninfo, partner_id, holder, kind
        self.ttl = ttl
        self.release_on_exit = release_on_exit
        self.epoch = epoch
        self.fence: fences.Fence | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        with connect(self.conninfo) as conn:
            token = acquire(conn, self.partner_id, self.holder, self.kind, self.ttl)
            epoch = self.epoch if self.epoch is not None else fences.current_epoch(conn, self.partner_id)
            conn.commit()
        self.fence = fences.Fence(self.partner_id, self.holder, token, epoch)
        self._thread = threading.Thread(target=self._renew_until_stopped, name=f"lease-{self.partner_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.release_on_exit:
            with connect(self.conninfo) as conn:
                release(conn, self.partner_id, self.holder, self.fence.token if self.fence else None)

    def _renew_until_stopped(self) -> None:
        assert self.fence is not None
        interval = max(self.ttl.total_seconds() / 3, 0.05)
        renewed_at = time.monotonic()
        conn: psycopg.Connection | None = None
        while not self._stop.wait(interval):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.conninfo)
                if not renew(conn, self.partner_id, self.holder, self.ttl, self.fence.token):
                    # Never taken again here: another run may have written meanwhile.
                    self._lose(f"its tenure (token {self.fence.token}) is no longer held: it lapsed and was taken, or removed")
                    break
                renewed_at = time.monotonic()
            except Exception as exc:  # a database blip must not kill the task; the next beat retries
                log.warning("%s: could not renew the %s lease: %s", self.partner_id, self.kind, exc)
                if conn is not None:
                    conn.close()
                conn = None
                if time.monotonic() - renewed_at > self.ttl.total_seconds():
                    self._lose(f"no renewal succeeded for {self.ttl.total_seconds():.0f} s (the TTL)")
                    break
        if conn is not None:
            conn.close()

    def _lose(self, reason: str) -> None:
        assert self.fence is not None
        log.error("%s: the %s lease of %s was lost: %s; the task stops at its next write", self.partner_id,
                  self.kind, self.holder, reason)
        self.fence.lose(reason)
