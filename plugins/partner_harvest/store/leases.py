"""Partner leases: harvest runs of a partner may overlap, a reconcile never overlaps them.

A reconcile compares the partner's whole id set with ``records``; a harvest applying in
between would make it purge what just arrived, or miss what just left. Leases expire, so
a run killed without cleaning up blocks the partner for at most its TTL.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from partner_harvest.errors import HarvestError

HARVEST, RECONCILE = "harvest", "reconcile"


class PartnerBusy(HarvestError):
    """Another kind of run holds the partner; retrying later will help."""


def acquire(conn: psycopg.Connection, partner_id: str, holder: str, kind: str, ttl: timedelta) -> None:
    """Take (or renew) the lease; raises PartnerBusy if a conflicting run holds one."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('lease:' || %s))", (partner_id,))
        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND expires_at < now()", (partner_id,))
        conflicts = conn.execute(
            """
            SELECT holder, kind, acquired_at FROM partner_leases
            WHERE partner_id = %s AND holder <> %s AND (kind = %s OR %s = %s)
            ORDER BY acquired_at LIMIT 1
            """,
            (partner_id, holder, RECONCILE, kind, RECONCILE),
        ).fetchone()
        if conflicts:
            other, other_kind, since = conflicts
            raise PartnerBusy(
                partner_id, f"{kind} lease",
                f"a {other_kind} run ({other}) has been working on this partner since {since:%Y-%m-%d %H:%M:%S}Z; "
                "a reconcile and a harvest never run at the same time — this task will retry",
            )
        conn.execute(
            """
            INSERT INTO partner_leases (partner_id, holder, kind, expires_at)
            VALUES (%s, %s, %s, now() + %s)
            ON CONFLICT (partner_id, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at, kind = EXCLUDED.kind
            """,
            (partner_id, holder, kind, ttl),
        )


def release(conn: psycopg.Connection, partner_id: str, holder: str) -> None:
    with conn.transaction():
        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND holder = %s", (partner_id, holder))
