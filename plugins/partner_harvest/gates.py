"""Approval gates, without Airflow: when a staged run must wait for a person, and what to show.

Two limits stop a run before its apply (docs/operator/approvals.md):

- a reconcile that would remove more than ``max_purge_fraction`` of the partner's records
  (reconcile.py's guard; with a gate it stages and waits instead of failing);
- a harvest whose apply would shrink the partner's live set by more than
  ``max_shrink_fraction``: the held records its tombstones purge, plus, for a run that
  covers the whole collection (a full harvest), the held records it did not return.

A quiet night must not pay for the gate: a run that staged no tombstone and does not cover
the whole collection cannot shrink anything, and is waved through without a query.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import psycopg

from partner_harvest import durations
from partner_harvest.registry import Partner
from partner_harvest.store import gates as sql
from partner_harvest.store import moves
from partner_harvest.store.gates import Request, Shrink
from partner_harvest.window import Window, parse_instant

PURGE, SHRINK = "purge", "shrink"
APPROVE, REJECT, MOVE = "Approve", "Reject", "Move"  # the answers a request offers (HITL options)


def covers_whole_collection(window: Window) -> bool:
    """A full harvest (or a first one), or a run whose changes list the whole collection (a
    file partner's full dump): everything the partner holds should have come."""
    return (window.is_full and window.mode != "window") or window.protocol.whole_list_at is not None


def staged_tombstones(staged: Iterable[Mapping[str, Any] | None]) -> int:
    """Tombstones the run's harvest tasks staged, from their XCom results."""
    return sum(int((piece or {}).get("tombstones") or 0) for piece in staged)


def harvest_shrink(conn: psycopg.Connection, partner: Partner, run_id: str, window: Window,
                   tombstones: int) -> Shrink | None:
    """The run's shrink when it crosses ``max_shrink_fraction``, else None.

    No query at all when nothing can shrink (no tombstone staged, not a full harvest)."""
    whole = covers_whole_collection(window)
    if tombstones == 0 and not whole:
        return None
    shrink = sql.measure_shrink(conn, partner.id, run_id, whole_collection=whole)
    if shrink.fraction > partner.max_shrink_fraction:
        return shrink
    for entity in sql.staged_entities(conn, partner.id, run_id):  # items, holdings: each against its own table
        shrink = sql.measure_shrink(conn, partner.id, run_id, whole_collection=False, entity=entity)
        if shrink.fraction > partner.max_shrink_fraction:
            return shrink
    return None


def reconcile_shrink(conn: psycopg.Connection, partner: Partner, run_id: str, outcome: Mapping[str, Any],
                     channel: str = "reconcile") -> Shrink:
    """A gated reconcile's request figures: what its plan held and what it staged to purge
    (of the records, or of the attached table, items or holdings, whose share is largest)."""
    candidates = [(int(outcome["local"]), int(outcome["staged_removals"]), channel),
                  *((int(f["local"]), int(f["staged_removals"]), f"{channel}/{entity}")
                    for entity, f in (outcome.get("attached") or {}).items())]
    held, removals, worst = max(candidates, key=lambda c: c[1] / c[0] if c[0] else 0.0)
    movable = moves.count_staged(conn, partner.id, run_id, whole_collection=False) if worst == channel else 0
    conn.commit()
    return Shrink(held, removals, 0, sql.reconcile_sample(conn, partner.id, run_id, worst), movable)


def approval_since(request: Request, outcome: Mapping[str, Any]) -> datetime:
    """From when no other run of the partner may have changed a record the approved apply
    purges (store/fences.Fence.applied_before): the request's instant, or a sliced reconcile's
    plan (``planned_at``) when earlier. Its lease ends with its settle task, before the gate
    asks: a harvest applied in between may have changed what the sweep compared, as one during the wait."""
    planned = outcome.get("planned_at")
    since = parse_instant(planned) if isinstance(planned, str) else planned
    return min(since, request.requested_at) if isinstance(since, datetime) else request.requested_at


def required_action_path(dag_id: str, dag_run_id: str, task_id: str = "approval_gate") -> str:
    """The request's page in the Airflow UI, from its root (Browse > Required Actions lists it too)."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}/tasks/{task_id}/required_actions"


def request_path(request: Request) -> str:
    """:func:`required_action_path` of a stored request (its run_id is ``<dag_id>/<Airflow run id>``)."""
    return required_action_path(request.dag_id, request.run_id.split("/", 1)[-1])


def subject(request: Request) -> str:
    what = "reconcile purge" if request.kind == PURGE else "shrinking harvest"
    share = (request.removals + request.absent) / request.held if request.held else 0.0
    moved = f"; {request.movable} reappear under new identifiers: Move?" if request.movable else ""
    return (f"{request.partner_id}: approve a {what}? {request.removals + request.absent} of {request.held} "
            f"records ({share:.1%}, limit {request.limit_fraction:.0%}){moved}")


def options(request: Request) -> list[str]:
    """The answers the request offers: Move beside Approve and Reject when records would move."""
    return [APPROVE, REJECT, MOVE] if request.movable else [APPROVE, REJECT]


def body(request: Request, partner: Partner, links: Mapping[str, str], timeout_note: str,
         whole_collection: bool = False) -> str:
    """The request's Markdown: partner, counts, a sample of what would go, links, what each answer does.
    ``whole_collection``: a full harvest, whose records not returned are counted (an incremental
    run returns only what changed: the row would mislead)."""
    share = (request.removals + request.absent) / request.held if request.held else 0.0
    if request.kind == PURGE:
        why = (f"The weekly reconcile would remove **{request.removals}** of the **{request.held}** records it holds "
               f"for `{partner.id}` ({share:.1%}), over `max_purge_fraction` ({request.limit_fraction:.0%}): "
               "these records are absent from the partner's identifier list or listed there as deleted.")
    else:
        why = (f"This harvest would shrink `{partner.id}`'s live set by **{request.removals + request.absent}** of "
               f"**{request.held}** records ({share:.1%}), over `max_shrink_fraction` ({request.limit_fraction:.0%}).")
    lines = [
        f"### {partner.id} ({partner.protocol}): {request.kind} over its limit",
        "",
        partner.description or "",
        "",
        why,
        "",
        "| | records |",
        "|---|---:|",
        f"| held now | {request.held} |",
        f"| purged by the apply (tombstones) | {request.removals} |",
    ]
    if request.kind == SHRINK and whole_collection:
        lines.append("| not returned by this full harvest (kept by the apply and left to a reconcile; a file "
                     f"partner's full dump purges them, reason not_listed) | {request.absent} |")
    if request.movable:
        lines += ["", f"**{request.movable} of these records come back under new identifiers** with identical content "
                  "(the same content hash): the partner renamed them (a new OAI base or identifier scheme?)."]
    lines += ["", f"**A sample of what would go** (first {len(request.sample)} by identifier):", ""]
    lines += [f"- `{item['identifier']}` {item.get('title') or '(no title)'}: {item['why']}" for item in request.sample]
    lines += [
        "",
        "**Approve** applies exactly this staged run (nothing harvested again). It refuses, and applies "
        "nothing, if the partner changed while it waited (`forget`, `reset-cursor`, or another run changed one of "
        "the records this run would purge; quiet nights and other records' changes do not count).",
        "**Reject** abandons the run: its staging is dropped, no record changes, no cursor moves; "
        "`harvest_runs` and `approval_requests` record it.",
        *(["**Move** applies the run too, but each matched record moves to its new identifier instead of a purge "
           "and an addition: it keeps its history and first-harvested time, and the change feed says `moved` "
           "(old → new). Unmatched records are purged and added as with Approve."] if request.movable else []),
        timeout_note,
        "",
        " · ".join(f"[{label}]({url})" for label, url in links.items()),
    ]
    return "\n".join(lines)


def timeout_note(partner: Partner) -> str:
    action = ("then it alerts and keeps waiting" if partner.approval_timeout_action == "wait"
              else "then it alerts and the run is abandoned as if rejected")
    return f"No answer within `approval_timeout` ({durations.human(partner.approval_timeout)}): {action}."
