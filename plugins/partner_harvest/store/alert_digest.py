"""One alert for an outage shared by many partners: the SQL side.

A failure is *recorded* under its key (``<endpoint host>|<error type>``): the first of a
key opens a group and is alerted at once; those that follow within the fold window join
it without an alert of their own. When the window has ended, one process *claims* the
group (a fenced claim: ``claim_epoch`` goes up, the claim expires) and sends one digest
naming every folded partner; it marks the group sent only while its epoch is still the
current one, in a transaction of its own. A process that dies while sending loses the
claim when it expires, and the next one sends (at least once: a digest is never lost).
Any number of worker processes may record and claim at once. Plain psycopg, no Airflow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

CLAIM_FOR = timedelta(minutes=5)  # far longer than a send (15 s a channel), short enough to retry
KEEP_FOR = timedelta(days=30)  # settled groups are deleted after this


@dataclass(frozen=True)
class Recorded:
    group_id: int
    first: bool  # alert it now: it opened the group (or its partner did)
    first_partner: str


@dataclass(frozen=True)
class Claim:
    group_id: int
    group_key: str
    epoch: int
    holder: str
    first_partner: str
    opened_at: Any
    members: list[dict[str, Any]]  # the folded failures' fields, in order


def record_failure(conn: psycopg.Connection, key: str, partner_id: str, fields: dict[str, Any],
                   fold_for: timedelta) -> Recorded:
    """Join the key's open group, or open one (then this failure is the one alerted at once)."""
    with conn.transaction():
        # Two processes recording the same key at once: one opens, the other joins.
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 4242))", (key,))
        row = conn.execute(
            """
            SELECT id, first_partner FROM alert_groups
            WHERE group_key = %s AND closed_at IS NULL AND fold_until > now()
            ORDER BY opened_at DESC LIMIT 1
            """, (key,)).fetchone()
        first = row is None
        if first:
            row = conn.execute(
                "INSERT INTO alert_groups (group_key, fold_until, first_partner) VALUES (%s, now() + %s, %s)"
                " RETURNING id, first_partner", (key, fold_for, partner_id)).fetchone()
        assert row is not None
        # The opening partner's own further failures (another slice, the reconcile) alert as
        # they always did: the digest is for the other partners.
        alerted = first or row[1] == partner_id
        conn.execute("INSERT INTO alert_group_members (group_id, partner_id, alerted, fields) VALUES (%s, %s, %s, %s)",
                     (row[0], partner_id, alerted, json.dumps(fields, default=str)))
    return Recorded(row[0], alerted, row[1])


def claim_due(conn: psycopg.Connection, holder: str, limit: int = 20) -> list[Claim]:
    """Claim the groups whose window has ended (unclaimed, or whose claim expired); groups
    no failure joined are settled without a digest. Each claim is its own fence."""
    claims = []
    with conn.transaction():
        conn.execute(
            """
            UPDATE alert_groups g SET closed_at = now()
            WHERE closed_at IS NULL AND fold_until <= now()
              AND NOT EXISTS (SELECT 1 FROM alert_group_members m WHERE m.group_id = g.id AND NOT m.alerted)
            """)
        conn.execute("DELETE FROM alert_groups WHERE closed_at < now() - %s", (KEEP_FOR,))
        rows = conn.execute(
            """
            UPDATE alert_groups SET claim_holder = %s, claim_until = now() + %s, claim_epoch = claim_epoch + 1
            WHERE id IN (
                SELECT id FROM alert_groups
                WHERE closed_at IS NULL AND fold_until <= now() AND (claim_until IS NULL OR claim_until <= now())
                ORDER BY fold_until LIMIT %s FOR UPDATE SKIP LOCKED)
            RETURNING id, group_key, claim_epoch, first_partner, opened_at
            """, (holder, CLAIM_FOR, limit)).fetchall()
        for group_id, key, epoch, first_partner, opened_at in rows:
            members = [fields for (fields,) in conn.execute(
                "SELECT fields FROM alert_group_members WHERE group_id = %s AND NOT alerted ORDER BY at, id",
                (group_id,))]
            claims.append(Claim(group_id, key, epoch, holder, first_partner, opened_at, members))
    return claims


def still_held(conn: psycopg.Connection, claim: Claim) -> bool:
    """The claim is still this process's (checked in its own transaction, right before sending)."""
    with conn.transaction():
        row = conn.execute(
            "SELECT 1 FROM alert_groups WHERE id = %s AND claim_epoch = %s AND claim_holder = %s"
            " AND claim_until > now() AND closed_at IS NULL", (claim.group_id, claim.epoch, claim.holder)).fetchone()
    return row is not None


def mark_sent(conn: psycopg.Connection, claim: Claim) -> bool:
    """Settle the group, only under the claim's epoch; False: another process took it over."""
    with conn.transaction():
        cur = conn.execute(
            "UPDATE alert_groups SET digest_sent_at = now(), closed_at = now(), claim_until = NULL"
            " WHERE id = %s AND claim_epoch = %s AND claim_holder = %s AND closed_at IS NULL",
            (claim.group_id, claim.epoch, claim.holder))
    return cur.rowcount == 1
