"""Fences: a write a lease or an operator's state protects checks, in its own transaction,
that it may still write.

A lease is renewed by a thread; a task frozen past its TTL (SIGSTOP, a suspended VM, a
long stall) freezes its renewals too, the lease lapses and another run takes the partner.
When the frozen task resumes, nothing but a fence stops it writing what it planned before:
a reconcile would purge records the other run just applied. So:

- every lease tenure carries a **token**, a per-partner number that only grows
  (``partner_fences.last_token``); a write checks that its lease row still holds its token;
- every operator command that changes a partner's state (``forget``, ``reset-cursor``)
  bumps the partner's **epoch**; a run carries the epoch it was planned at (its frozen
  window) and none of its writes lands after a bump.

The check locks the partner's ``partner_fences`` row FOR KEY SHARE and its lease row FOR
KEY SHARE inside the write's transaction: a command's bump (FOR UPDATE) and another run's
taking of a lapsed lease (its DELETE) wait until the write committed, and a write that
starts after them sees them. Renewals (a plain UPDATE of ``expires_at``) and new tokens
(an UPDATE of ``last_token``) do not conflict with the check, so writes never wait for them.

The fence guards the aggregation database and the cursor; it cannot undo what a stale
task already asked of the partner (a request sent is sent) nor order the partner's own
state. See docs/design/fences.md.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from partner_harvest.errors import HarvestError
from partner_harvest.store.attached import ENTITIES
from partner_harvest.store.db import scalar


class LeaseLost(HarvestError):
    """The task's lease lapsed and may have been taken: it stops writing; a retry takes a new one."""


class PartnerChanged(HarvestError):
    """An operator command changed the partner after the run was planned: the run never
    applies nor moves the cursor. Not retried: the retry would reuse the stale plan; the
    partner's next run plans from the new state."""

    retryable = False


class NewerRunApplied(HarvestError):
    """Another run of the partner applied while this one waited at its approval gate and changed
    a record this one would purge: what the person approved was measured against a state that
    is gone. Not retried (docs/operator/approvals.md)."""

    retryable = False


@dataclass
class Fence:
    """What one task may write: its lease's tenure (``token``) and its plan's ``epoch``.

    ``epoch`` None: the task has no plan of its own to be stale against (never for a
    harvest task after the window is frozen). ``lost`` is set by the lease's keeper the
    moment it cannot renew: the next write (or page) fails without asking the database.
    """

    partner_id: str
    holder: str
    token: int
    epoch: int | None = None
    lost: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    lost_reason: str = ""
    # Set after an approval gate's wait (store/gates.py): no other run of the partner applied since
    # this instant (the request's, or a sliced reconcile's plan) may have changed a record this
    # run would purge, or the approved write refuses.
    applied_before: datetime | None = None

    def lose(self, reason: str) -> None:
        self.lost_reason = self.lost_reason or reason
        self.lost.set()


_BOUND: weakref.WeakKeyDictionary[psycopg.Connection, Fence] = weakref.WeakKeyDictionary()


def bind(conn: psycopg.Connection, fence: Fence | None) -> psycopg.Connection:
    """Every fenced write made through ``conn`` from now on checks ``fence``."""
    if fence is None:
        _BOUND.pop(conn, None)
    else:
        _BOUND[conn] = fence
    return conn


def bound(conn: psycopg.Connection) -> Fence | None:
    return _BOUND.get(conn)


def check(conn: psycopg.Connection, request: str) -> None:
    """Inside a write's transaction: raise unless the connection's fence still holds.

    A connection without a fence (library use outside a leased task, the tests of the
    store) is not checked.
    """
    fence = _BOUND.get(conn)
    if fence is not None:
        check_fence(conn, fence, request)


def check_fence(conn: psycopg.Connection, fence: Fence, request: str) -> None:
    if fence.lost.is_set():
        raise LeaseLost(fence.partner_id, request, f"the lease of {fence.holder} (token {fence.token}) was lost: "
                        f"{fence.lost_reason}; nothing more is written, a retry takes a new lease")
    row = conn.execute(
        "SELECT epoch, epoch_command, epoch_at FROM partner_fences WHERE partner_id = %s FOR KEY SHARE",
        (fence.partner_id,),
    ).fetchone()
    epoch, command, at = row if row else (0, None, None)
    if fence.epoch is not None and epoch != fence.epoch:
        when = f" at {at:%Y-%m-%d %H:%M:%S}Z" if at else ""
        raise PartnerChanged(
            fence.partner_id, request,
            f"`partner-harvest {command or 'an operator command'}` changed this partner{when} (epoch {epoch}) after "
            f"this run was planned (epoch {fence.epoch}); nothing of this run is applied and no cursor moves — "
            "the partner's next run plans from its new state",
        )
    if fence.applied_before is not None:
        newer = _newer_run_touching_staged(conn, fence)
        if newer is not None:
            run_id, applied_at, identifier = newer
            raise NewerRunApplied(
                fence.partner_id, request,
                f"run {run_id} applied at {applied_at:%Y-%m-%d %H:%M:%S}Z, after this run asked for approval "
                f"(of what it measured from {fence.applied_before:%Y-%m-%d %H:%M:%S}Z on), and changed {identifier}, "
                "which this run would purge: what was approved was measured against a state that is gone, so "
                "nothing of this run is applied and no cursor moves — run it again",
            )
    held = conn.execute(
        "SELECT 1 FROM partner_leases WHERE partner_id = %s AND holder = %s AND token = %s FOR KEY SHARE",
        (fence.partner_id, fence.holder, fence.token),
    ).fetchone()
    if held is None:
        fence.lose("it lapsed (its holder was frozen or cut off past the TTL) and was taken or removed")
        raise LeaseLost(fence.partner_id, request,
                        f"the lease of {fence.holder} (token {fence.token}) is no longer held: it lapsed and was "
                        "taken or removed; nothing of this write landed, a retry takes a new lease")


# Runs of the partner applied since the instant that changed something (change feed ranges).
_NEWER_CHANGING = """
SELECT DISTINCT run_id, applied_at, change_seq_after, change_seq_until FROM harvest_runs
 WHERE partner_id = %s AND run_id <> %s AND status = 'applied' AND applied_at > %s
   AND change_seq_until > change_seq_after
"""
# The first of those runs' changes (records keep their newest change_seq, deletions one
# row each) to a record the fenced run would purge (its staged tombstones). What it would
# upsert needs no such check: the apply lands a version only over an older one.
# Items and holdings (store/attached.py) the same way, each against its own table.
_TOUCHED = """
WITH staged AS (SELECT DISTINCT entity, identifier FROM staging WHERE partner_id = %(pid)s AND run_id = %(run)s
                AND kind = 'T'),
changed AS (
    SELECT r.identifier, r.change_seq FROM records r
     WHERE r.partner_id = %(pid)s AND r.change_seq > %(after)s
       AND r.identifier IN (SELECT identifier FROM staged WHERE entity IS NULL)
    UNION ALL
    SELECT d.identifier, d.change_seq FROM deletions d
     WHERE d.partner_id = %(pid)s AND d.change_seq > %(after)s
       AND d.identifier IN (SELECT identifier FROM staged WHERE entity IS NULL)
""" + "".join(f"""
    UNION ALL
    SELECT a.identifier, a.change_seq FROM {entity} a
     WHERE a.partner_id = %(pid)s AND a.change_seq > %(after)s
       AND a.identifier IN (SELECT identifier FROM staged WHERE entity = '{entity}')""" for entity in ENTITIES) + """
    UNION ALL
    SELECT a.identifier, a.change_seq FROM attached_deletions a
     WHERE a.partner_id = %(pid)s AND a.change_seq > %(after)s
       AND (a.entity, a.identifier) IN (SELECT entity, identifier FROM staged WHERE entity IS NOT NULL))
SELECT identifier, change_seq FROM changed ORDER BY change_seq LIMIT 1
"""


def _newer_run_touching_staged(conn: psycopg.Connection, fence: Fence) -> tuple[str, datetime, str] | None:
    """A run applied after ``fence.applied_before`` that changed a record the fenced run would
    purge: (its run_id, when it applied, the identifier). A run that changed nothing (a quiet
    night) or only other records leaves what was approved as it was measured."""
    newer = conn.execute(_NEWER_CHANGING, (fence.partner_id, fence.holder, fence.applied_before)).fetchall()
    if not newer:
        return None
    row = conn.execute(_TOUCHED, {"pid": fence.partner_id, "run": fence.holder,
                                  "after": min(after for _, _, after, _ in newer)}).fetchone()
    if row is None:
        return None
    identifier, seq = row
    run_id, applied_at = next(((r, at) for r, at, after, until in newer if after < seq <= until),
                              (newer[0][0], newer[0][1]))
    return run_id, applied_at, identifier


@contextmanager
def fenced(conn: psycopg.Connection, request: str) -> Iterator[None]:
    """A transaction that starts with the fence check: what it writes (and what the caller
    does inside it, such as the cursor Variable's write) happens while the fence is held."""
    with conn.transaction():
        check(conn, request)
        yield


def current_epoch(conn: psycopg.Connection, partner_id: str) -> int:
    row = conn.execute("SELECT epoch FROM partner_fences WHERE partner_id = %s", (partner_id,)).fetchone()
    return row[0] if row else 0


def next_token(conn: psycopg.Connection, partner_id: str) -> int:
    """A new lease token of the partner (inside the caller's transaction): it only grows."""
    conn.execute("INSERT INTO partner_fences (partner_id) VALUES (%s) ON CONFLICT DO NOTHING", (partner_id,))
    return scalar(conn.execute("UPDATE partner_fences SET last_token = last_token + 1 WHERE partner_id = %s"
                        " RETURNING last_token", (partner_id,)))


def bump_epoch(conn: psycopg.Connection, partner_id: str, command: str) -> int:
    """Inside the command's transaction: from its commit on, no run planned before writes.

    Waits (FOR UPDATE) for fenced writes in progress to commit; they were planned before
    and their write happened before the command.
    """
    conn.execute("INSERT INTO partner_fences (partner_id) VALUES (%s) ON CONFLICT DO NOTHING", (partner_id,))
    conn.execute("SELECT 1 FROM partner_fences WHERE partner_id = %s FOR UPDATE", (partner_id,))
    return scalar(conn.execute(
        "UPDATE partner_fences SET epoch = epoch + 1, epoch_command = %s, epoch_at = now() WHERE partner_id = %s"
        " RETURNING epoch", (command, partner_id),
    ))
