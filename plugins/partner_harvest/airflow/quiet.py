"""Quiet nights in one task process.

Most nights most partners changed nothing, and a task process costs more than the work:
about 0.2 CPU-s in the task and 0.3 in Airflow around it, six tasks a run. So
``freeze_window`` asks once more when a quiet night is likely (the protocol's spec allows it
and the partner's newest applied run fetched nothing): the adapter's one cheap look
(``window_is_empty``; OAI-PMH: one ListRecords of the frozen window). When it is empty,
freeze runs the rest of the run itself (``run.quiet_night``: the window staged, then the
same ``run.finish`` as every run: the apply, its metrics, lineage and Asset event, the cursor
after the apply committed, through the same outlets, under the same lease and fences), runs
the quality checks, then skips the later tasks: Airflow marks them skipped without starting
a process, and the run keeps its shape in the grid. A window that holds changes goes the
usual way (that night costs the one extra request).
"""

from __future__ import annotations

from typing import Any, NoReturn

from airflow.sdk import AssetAlias, Context
from airflow.sdk.exceptions import DownstreamTasksSkipped

from partner_harvest import protocols
from partner_harvest.airflow.assets import partner_asset
from partner_harvest.pipeline import RunRequest
from partner_harvest.registry import Partner
from partner_harvest.window import Window


def quiet_alias(partner_id: str) -> AssetAlias:
    """freeze_window's outlet: an event through it lands on the partner's Asset, and only a
    quiet night adds one (a busy night's event comes from apply_changes)."""
    return AssetAlias(name=f"partner_{partner_id}_quiet_night", group="partner-harvest")


def may_be_quiet(partner: Partner, window: Window, request: RunRequest) -> bool:
    """A nightly incremental window of a partner whose newest applied run fetched nothing on
    any channel; never a full, window or backfill run, a set-back clock, slices or a channel
    without a window of its own yet (a first load of it); only for a protocol whose spec says
    a quiet night applies (its adapter's window_is_empty can tell, channels included)."""
    facts = window.protocol
    return (request.mode == "incremental" and request.may_advance_cursor and window.advances_cursor
            and window.from_ is not None and not facts.clock_regressed and facts.clock_behind_cursor is None
            and all(plan.from_ is not None or plan.skip for plan in facts.channels.values())
            and facts.slice is None and protocols.spec_of(partner.protocol).quiet_night
            and _newest_run_fetched_nothing(partner.id))


def _newest_run_fetched_nothing(partner_id: str) -> bool:
    from partner_harvest.airflow.tasks import aggregation

    with aggregation() as conn:
        row = conn.execute(
            "SELECT sum(h.fetched) FROM harvest_runs h WHERE h.partner_id = %(pid)s AND h.run_id = ("
            " SELECT run_id FROM harvest_runs WHERE partner_id = %(pid)s AND channel = 'changes'"
            " AND status = 'applied' AND mode = 'incremental' ORDER BY started_at DESC LIMIT 1)",
            {"pid": partner_id}).fetchone()
        conn.commit()
    return row is not None and row[0] == 0


def emit_event(context: Context, partner_id: str, extra: dict[str, Any]) -> None:
    """The event apply_changes would have emitted, through freeze_window's alias."""
    events = context.get("outlet_events")
    if events is not None:  # absent only when a task body is called outside Airflow
        events[quiet_alias(partner_id)].add(partner_asset(partner_id), extra=extra)


def skip_the_rest(context: Context, window_data: dict[str, Any]) -> NoReturn:
    """Succeed with the frozen window as the task's XCom and every later task skipped."""
    ti = context["ti"]
    ti.xcom_push("return_value", window_data)  # the window later tasks' templates show
    task = context["task"]
    raise DownstreamTasksSkipped(tasks=sorted(task.get_flat_relative_ids(upstream=False)))
