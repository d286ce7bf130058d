"""Building one harvest DAG per registry partner; the DAG file only calls this."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

import pendulum
from airflow.sdk import DAG, CronTriggerTimetable, Param, get_current_context, task

from partner_harvest.airflow import tasks
from partner_harvest.airflow.notifiers import PartnerAlertNotifier
from partner_harvest.registry import Partner

START_DATE = pendulum.datetime(2026, 1, 1, tz="UTC")

RUN_PARAMS = {
    "mode": Param(
        "incremental",
        type="string",
        enum=["incremental", "full", "window"],
        description="incremental: from the cursor (moves it); full: everything (cursor untouched); "
        "window: the from/until below (cursor untouched).",
    ),
    "from": Param(None, type=["null", "string"], format="date-time",
                  description="Start of the window (mode=window only)."),
    "until": Param(None, type=["null", "string"], format="date-time",
                   description="End of the window (mode=window; default: the partner's clock)."),
}

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "partner-harvest",
    "retries": 3,
    "retry_delay": timedelta(minutes=2),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=30),
    "execution_timeout": timedelta(hours=6),
}


def _doc(partner: Partner) -> str:
    return (
        f"### Harvest of partner `{partner.id}` ({partner.protocol})\n\n"
        f"{partner.description}\n\n"
        f"Connection `{partner.conn_id}`, cursor Variable `{partner.cursor_key}`, "
        f"lag {partner.lag}, schedule `{partner.schedule}` (UTC).\n\n"
        "`freeze_window` fixes the window from the partner's clock; `harvest_changes` streams "
        "it into staging (Sierra: `poll_deletions` too, on its own day cursor); `apply_changes` "
        "merges it in one transaction; `advance_cursor` moves the cursors forward, only for "
        "incremental runs."
    )


def default_args(partner: Partner) -> dict[str, Any]:
    return {
        **DEFAULT_ARGS,
        "retries": partner.retries,
        "on_failure_callback": [PartnerAlertNotifier(), partial(tasks.release_lease_after_final_failure, partner_id=partner.id)],
    }


def build_harvest_dag(partner: Partner) -> DAG:
    pid = partner.id
    pool = {"pool": partner.pool}  # tasks that send requests to the partner
    with DAG(
        dag_id=partner.dag_id,
        description=f"Incremental harvest of {pid} ({partner.protocol})",
        schedule=CronTriggerTimetable(partner.schedule, timezone="UTC", interval=timedelta(days=1)),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        params=RUN_PARAMS,
        default_args=default_args(partner),
        tags=["harvest", partner.protocol, f"partner:{pid}"],
        doc_md=_doc(partner),
    ) as dag:

        @task(task_id="freeze_window", **pool)
        def freeze_window() -> dict[str, Any]:
            return tasks.freeze_window(pid, get_current_context())

        @task(task_id="harvest_changes", **pool)
        def harvest_changes(window: dict[str, Any]) -> dict[str, Any]:
            return tasks.harvest_changes(pid, window, get_current_context())

        @task(task_id="poll_deletions", **pool)
        def poll_deletions(window: dict[str, Any]) -> dict[str, Any]:
            return tasks.poll_deletions(pid, window, get_current_context())

        @task(task_id="apply_changes")
        def apply_changes(window: dict[str, Any], *staged: dict[str, Any]) -> dict[str, int]:
            return tasks.apply_changes(pid, window, get_current_context())

        @task(task_id="advance_cursor")
        def advance_cursor(window: dict[str, Any], applied: dict[str, int]) -> dict[str, Any]:
            return tasks.move_cursor(pid, window, get_current_context())

        @task(task_id="check_quality")
        def check_quality(applied: dict[str, int]) -> list[str]:
            return tasks.check_quality(pid, get_current_context())

        window = freeze_window()
        staged = [harvest_changes(window)]
        if partner.protocol == "sierra":
            staged.append(poll_deletions(window))
        applied = apply_changes(window, *staged)
        advance_cursor(window, applied)
        check_quality(applied)
    return dag


RECONCILE_PARAMS = {
    "allow_mass_purge": Param(
        False, type="boolean",
        description="Apply even when the reconcile would remove more than the partner's "
        "max_purge_fraction of its records (only after checking the partner really removed them).",
    ),
}


def build_reconcile_dag(partner: Partner) -> DAG:
    pid = partner.id
    with DAG(
        dag_id=partner.reconcile_dag_id,
        description=f"Weekly full reconcile of {pid} ({partner.protocol})",
        schedule=CronTriggerTimetable(partner.reconcile_schedule, timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        params=RECONCILE_PARAMS,
        default_args=default_args(partner),
        tags=["reconcile", partner.protocol, f"partner:{pid}"],
        doc_md=(
            f"### Full reconcile of partner `{pid}`\n\nLists every identifier the partner holds "
            "(OAI-PMH ListIdentifiers, Sierra `fields=id`), purges local records that vanished "
            "(reason `reconcile`), fetches the ones missing locally, in one transaction. Refuses "
            f"to remove more than {partner.max_purge_fraction:.0%} of the records unless "
            "`allow_mass_purge` is set. Never moves a harvest cursor; never overlaps a harvest."
        ),
    ) as dag:

        @task(task_id="reconcile", pool=partner.pool)
        def reconcile() -> dict[str, Any]:
            return tasks.reconcile_partner(pid, get_current_context())

        reconcile()
    return dag
