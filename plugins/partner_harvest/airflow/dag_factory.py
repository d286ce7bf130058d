"""Building the DAGs of the registry's partners; the DAG files only call this.

A partner whose entry is invalid still gets its ``harvest_<id>``/``reconcile_<id>``: a
one-task DAG that shows the validation error (description, docs) and fails with it, so
the operator sees that partner's problem while every valid partner keeps running.
"""

from __future__ import annotations

import copy
import re
import zlib
from datetime import timedelta
from functools import partial
from typing import Any

import pendulum
from airflow.sdk import DAG, CronTriggerTimetable, Param, get_current_context, task
from airflow.sdk.definitions.callback import SyncCallback  # airflow.sdk exports them lazily
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
from airflow.sdk.definitions.mappedoperator import MappedOperator

from partner_harvest import durations, failures, protocols
from partner_harvest.airflow import compat, tasks
from partner_harvest.airflow.assets import partner_asset
from partner_harvest.airflow.gates import PartnerApprovalGate
from partner_harvest.airflow.notifiers import PartnerAlertNotifier, run_late_alert, run_overdue_alert
from partner_harvest.airflow.quiet import quiet_alias
from partner_harvest.protocols import Channel
from partner_harvest.registry import Partner, RegistryError, get_partner, load_registry

START_DATE = pendulum.datetime(2026, 1, 1, tz="UTC")

BACKFILL_RULE = (
    "A backfill ignores Mode, From and Until: each backfill run harvests the UTC day of its date, "
    "midnight to midnight, and never moves the cursor. Backfill From 2024-11-01 To 2024-11-04 (nightly "
    "02:00 schedule) makes the runs of Nov 1, 2 and 3, which harvest 2024-11-01T00:00Z .. 2024-11-04T00:00Z."
)

RUN_PARAMS = {
    "mode": Param(
        "incremental",
        type="string",
        enum=["incremental", "full", "window"],
        title="Mode (manual runs only; a backfill ignores it)",
        description="incremental: from the cursor, and moves it (with no cursor yet: everything, "
        "the partner's first harvest, which sets the cursor); full: everything, cursor untouched; "
        "window: the records the partner stamped between From and Until below, cursor untouched. "
        + BACKFILL_RULE,
    ),
    "from": Param(None, type=["null", "string"], format="date-time", title="From (mode=window only)",
                  description="mode=window: the window's start, an instant in UTC such as 2024-11-01T00:00:00Z "
                  "(a day-granular partner reads the day). Ignored by the other modes and by backfills."),
    "until": Param(None, type=["null", "string"], format="date-time", title="Until (mode=window only)",
                   description="mode=window: the window's end, such as 2024-11-04T00:00:00Z; empty: the "
                   "partner's clock. With From 2024-11-01T00:00:00Z this harvests Nov 1, 2 and 3. Ignored by the "
                   "other modes and by backfills."),
}

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "partner-harvest",
    "retries": 3,
    "retry_delay": failures.RETRY_DELAY,  # declared with the failure rules: the alerts page shows their timing
    "retry_exponential_backoff": failures.RETRY_BACKOFF,
    "max_retry_delay": failures.MAX_RETRY_DELAY,
    "execution_timeout": timedelta(hours=6),
}


WHEN_A_TASK_FAILS = (
    "**When a task fails** (an alert names the partner, the task, the window and the cause): read "
    "the cause in the alert or the task's log, fix what it names (the partner's server, the "
    "Connection, the registry), then **clear the failed task and its downstream tasks**: the rerun "
    "reuses the frozen window, so nothing is skipped or applied twice (or clear the whole failed run, "
    "only failed tasks). Clear `freeze_window` too only to start over from the cursor. The run deadline "
    "counts from the logical date, which Airflow's clear leaves alone (docs/operator/operating.md). "
    "docs/operator/alerts.md says what each cause means."
)

PARAMS_DOC = (
    "**Params** (Trigger DAG w/ config; manual runs only): `mode` = `incremental` (from the cursor, moves "
    "it; with no cursor yet everything, then sets it) | `full` (everything, cursor untouched) | `window` "
    "(`from`/`until`, cursor untouched). **Backfill:** " + BACKFILL_RULE
)


def _doc(partner: Partner) -> str:
    channels = protocols.channels_for(partner)
    tasks_line = (
        "`freeze_window` fixes the window from the partner's clock; `plan_slices` keeps it whole or "
        "cuts a big one into slices; `harvest_changes` (mapped: one, or one lane per pool slot taking slice "
        "after slice) streams it into staging"
        + "".join(f" and `{channel.task_id}` {channel.summary}" for channel in channels)
        + "; `approval_gate` passes unless the run would shrink the live set by more than "
        f"{partner.max_shrink_fraction:.0%} (then it waits for a person in Required Actions)"
        + "; `apply_changes` merges it in one transaction; `advance_cursor` moves the cursor"
        + ("s" if channels else "") + " (incremental runs only); `check_quality` alerts on "
        "data-quality findings without failing the run. Each task's own docs say more."
    )
    return (
        f"### Harvest of partner `{partner.id}` ({partner.protocol})\n\n"
        f"{partner.description}\n\n"
        f"Connection `{partner.conn_id}`, cursor Variable `{partner.cursor_key}`, "
        f"lag {durations.human(partner.lag)}, schedule `{partner.schedule}` (UTC), "
        f"pool `{partner.pool}`, run deadline {durations.human(partner.run_deadline)} after the logical date"
        + (f", nightly runs due by {partner.finish_by} UTC" if partner.finish_by else "")
        + ".\n\n"
        f"{tasks_line}\n\n"
        "**First harvest:** a scheduled run of a partner without a cursor skips (unpausing a new "
        "partner never starts its full harvest by itself): trigger the DAG once by hand.\n\n"
        f"{PARAMS_DOC}\n\n{WHEN_A_TASK_FAILS}"
    )


TASK_DOCS = {
    "freeze_window": (
        "Asks the partner for its clock and fixes the run's window (`until` = that clock, "
        "`from` = cursor − lag; no cursor or `mode=full`: from the beginning). Every later "
        "task, retry or clear reuses it (XCom; each task's Rendered Template shows it). A "
        "scheduled run of a partner without a cursor skips here. **Quiet night** (OAI-PMH, the newest "
        "applied run fetched nothing): one ListRecords of the window; when empty, this task applies it, "
        "moves the cursor and runs the quality checks itself, and the later tasks show *skipped* "
        "(docs/operator/many-partners.md). **Fails:** the partner is "
        "unreachable or answers nonsense; retried with backoff. Clear it to start over."
    ),
    "plan_slices": (
        "Decides whether the frozen window is harvested whole or as slices (registry `slicing`): "
        "a full harvest or a long window whose size (OAI `completeListSize`, Sierra's span of bib "
        "ids) is above the threshold is cut into slices of similar size, written to `harvest_runs` "
        "as channels `changes/001`... (status planned). **Fails:** the partner is unreachable; "
        "retried. Clearing it plans again and drops the slices' staging."
    ),
    "harvest_changes": (
        "Mapped over the plan: the whole window (one task instance, channel `changes`) or one "
        "instance per slice (`changes/001`...), each retried on its own and run in the partner's "
        "pool. Streams its range page by page into staging (COPY); `harvest_runs` shows its pages "
        "and records while it runs. Restarts on an expired resumptionToken; a Sierra slice resumes "
        "from its checkpoint. **Fails:** HTTP errors after retries, broken or hostile XML, "
        "pagination loops (no retries), a response over the limits. Nothing stored is touched; "
        "clear it (or one slice) to harvest it again."
    ),
    "apply_changes": (
        "Merges the run's staging into `records`, `deletions` and `quarantine` in one "
        "transaction and fills `harvest_runs`; harvests a channel again first if the database "
        "lost its staging (so it runs in the partner's pool). **Fails:** the database is "
        "unreachable, or a reconcile holds the partner (retried). Nothing half-applied is "
        "ever visible; clear it to apply again."
    ),
    "advance_cursor": (
        "Moves the cursor Variable(s) to the frozen `until`, only after the apply committed, "
        "only for incremental runs, never backwards. **Fails:** Airflow's Variables cannot be "
        "written; clear it (the data is already applied; the next run would re-harvest the "
        "window harmlessly)."
    ),
    "check_quality": (
        "Compares the applied run with the partner's thresholds (quarantine rate, purge "
        "fraction, completeness check, quiet period) and sends a data-quality alert when one "
        "is crossed; it never fails the run for a finding. **Fails:** only when the database "
        "is unreachable; clear it to check again."
    ),
    "reconcile": (
        "Lists every identifier the partner holds, purges the local records it no longer "
        "has (after asking the partner about each), fetches the missing ones, in one "
        "transaction; never moves a cursor. Over `max_purge_fraction` it stages all of it "
        "and `approval_gate` asks a person (Browse > Required Actions) before "
        "`apply_reconcile` applies it; `allow_mass_purge=true` applies at once. **Fails:** "
        "a harvest holding the partner (retried), or the partner's errors; nothing is half-applied."
    ),
    "approval_gate": (
        "Passes at once when nothing crosses a limit. Otherwise (a reconcile over "
        "`max_purge_fraction`, a harvest shrinking the live set by more than `max_shrink_fraction`) "
        "it waits in Browse > Required Actions, holding no worker slot and no lease: **Approve** "
        "applies exactly the staged run (refused if the partner changed meanwhile), **Reject** "
        "abandons it (staging dropped, cursor untouched). After `approval_timeout` it alerts and "
        "waits on or abandons (`approval_timeout_action`). **Fails:** only when the database is "
        "unreachable while it computes what would go (retried). docs/operator/approvals.md."
    ),
    "apply_reconcile": (
        "After `approval_gate`'s Approve: applies exactly what the reconcile staged, in one transaction "
        "(a reconcile within its limit applied already: skipped); **fails** without writing when "
        "an operator command or another run changed the partner during the wait, or, for a sliced "
        "reconcile, since its `plan_sweep` (run the reconcile again)."
    ),
    "plan_sweep": (
        "A big partner's reconcile (registry `slicing.reconcile_slices`): freezes the partner's clock, "
        "takes the reconcile lease the run's tasks share and cuts the id sweep into slices (OAI-PMH "
        "datestamp ranges, Sierra bib id ranges; table `reconcile_slices`). **Fails:** the partner is "
        "unreachable (retried), a harvest holds the partner (waits). Clearing it plans the sweep anew."
    ),
    "sweep_ids": (
        "Mapped, one per lane (the partner's pool slots, at most `reconcile_slices`): each lane takes "
        "the biggest slice left and lists its identifiers into `reconcile_ids`, slice after slice, so "
        "the lanes end together; a retry resumes at the slice that failed, from that slice's own start. "
        "**Fails:** the partner's errors (retried); refuses for good "
        "when another run applied since the plan (the sweep would be stale) or an operator command "
        "changed the partner: the next reconcile sweeps anew."
    ),
}

# A sliced reconcile (registry slicing.reconcile_slices): its `reconcile` task settles the swept slices.
SLICED_RECONCILE_DOCS = {
    "reconcile": (
        "Once every slice of `sweep_ids` is swept (a slice whose ids the database lost is swept again "
        "here): the mass-purge guard, the verification of vanished records, the removals and the "
        "missing records, applied in one transaction. Over `max_purge_fraction` it stages all of it "
        "and `approval_gate` asks a person (Browse > Required Actions) before `apply_reconcile` "
        "applies it; `allow_mass_purge=true` applies at once. **Fails:** a slice not swept, another "
        "run applied since `plan_sweep` (stale, not retried), or the partner's errors; nothing is half-applied."
    ),
}

# The frozen window, shown under each later task's "Rendered Template" (templates_dict): a DAG
# run note cannot be written from a task in Airflow 3.3 (the Execution API has no such call).
WINDOW_TEMPLATE = (
    "{% set w = ti.xcom_pull(task_ids='freeze_window') %}"
    "{% if w %}{{ w['mode'] }}: {{ w['from'] or 'from the beginning' }} .. {{ w['until'] }} "
    "({{ w['granularity'] }}){% if not w['advances_cursor'] %}, cursor untouched{% endif %}"
    "{% else %}not frozen{% endif %}"
)


def _describe_tasks(dag: DAG, show_window: bool = True, docs: dict[str, str] | None = None) -> None:
    """Per-task docs (``docs`` before TASK_DOCS), and the frozen window in every later task's rendered fields."""
    for task_ in dag.tasks:
        if isinstance(task_, MappedOperator):
            continue  # docs and templates given to the decorator (a mapped task's are read-only)
        task_.doc_md = (docs or {}).get(task_.task_id) or TASK_DOCS.get(task_.task_id)
        if show_window and task_.task_id != "freeze_window" and hasattr(task_, "templates_dict"):
            task_.templates_dict = {"harvested_window": WINDOW_TEMPLATE}


def default_args(partner: Partner) -> dict[str, Any]:
    registry_args = {k: v for k, v in (("execution_timeout", partner.execution_timeout),
                                       ("retry_delay", partner.retry_delay),
                                       ("max_retry_delay", partner.max_retry_delay)) if v is not None}
    return {
        **DEFAULT_ARGS,
        "retries": partner.retries,
        **registry_args,  # the registry's keys; unset ones keep DEFAULT_ARGS
        "on_failure_callback": [PartnerAlertNotifier(partner.id, conn_id=partner.conn_id),
                                partial(tasks.record_run_event, partner_id=partner.id),
                                partial(tasks.release_lease_after_final_failure, partner_id=partner.id)],
        # A failed try waiting for the next: alerted at once ("retrying, attempt n of m"), and the
        # health page and `status` say "retrying" with its cause until the run ends.
        "on_retry_callback": [PartnerAlertNotifier(partner.id, conn_id=partner.conn_id, retrying=True),
                              partial(tasks.record_run_event, partner_id=partner.id, kind="retry")],
    }


def run_deadline(partner: Partner, dag_id: str) -> DeadlineAlert:
    """Alert when a run has not finished ``run_deadline`` after its logical date.

    Airflow never schedules a task whose pool is missing and says so only in the
    scheduler's log; the run then waits forever. The scheduler checks deadlines itself,
    whatever the pool, and the executor runs the callback (no triggerer needed).

    Anchored on the logical date, not the queued-at time: clearing a run whose deadline is
    anchored on queued-at fails in Airflow 3.3 (docs/design/airflow-surface.md), and a
    failed run keeps its deadline, so every rerun of a failed night would. A nightly run's
    logical date is its cron tick, when it is queued; a run queued after its deadline (a
    backfill's day, a manual run dated in the past) is not alerted (``run_overdue_alert``).
    """
    compat.tolerate_encoded_deadline_alerts()  # else `airflow dags test` ends in a traceback
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=partner.run_deadline,
        callback=SyncCallback(run_overdue_alert, kwargs={
            "partner_id": partner.id, "dag_id": dag_id, "pool": partner.pool,
            "run_deadline": str(partner.run_deadline),
        }),
    )


def finish_by_deadline(partner: Partner) -> DeadlineAlert | None:
    """Alert when a scheduled run is unfinished at the registry's ``finish_by`` (UTC).

    A scheduled run's logical date is its cron tick (CronTriggerTimetable), so the
    deadline is that tick plus the offset to ``finish_by`` (registry.finish_by_offset).
    Airflow writes the Deadline row when it creates the run; a manual run without a
    logical date gets none, one with a logical date is ignored by the callback (the
    run_deadline covers it).
    """
    offset = partner.finish_by_offset
    if offset is None:
        return None
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=offset,
        callback=SyncCallback(run_late_alert, kwargs={
            "partner_id": partner.id, "dag_id": partner.dag_id, "finish_by": partner.finish_by,
        }),
    )


def harvest_deadlines(partner: Partner) -> list[DeadlineAlert]:
    late = finish_by_deadline(partner)
    return [run_deadline(partner, partner.dag_id), *([late] if late else [])]


def build_harvest_dag(partner: Partner) -> DAG:
    pid = partner.id
    channels = protocols.channels_for(partner)
    pool = partner.pool  # tasks that send requests to the partner
    with DAG(
        dag_id=partner.dag_id,
        deadline=harvest_deadlines(partner),
        description=f"Incremental harvest of {pid} ({partner.protocol})",
        schedule=CronTriggerTimetable(partner.schedule, timezone="UTC", interval=timedelta(days=1)),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        params=copy.deepcopy(RUN_PARAMS),  # Param objects of its own: a run's conf ends up in them
        default_args=default_args(partner),
        tags=["harvest", partner.protocol, f"partner:{pid}"],
        doc_md=_doc(partner),
    ) as dag:

        # Its alias carries the Asset event of a quiet night, which freeze applies itself (airflow/quiet.py).
        @task(task_id="freeze_window", pool=pool, outlets=[quiet_alias(pid)])
        def freeze_window() -> dict[str, Any]:
            return tasks.freeze_window(pid, get_current_context())

        @task(task_id="plan_slices", pool=pool)
        def plan_slices(window: dict[str, Any]) -> list[dict[str, Any]]:
            return tasks.plan_slices(pid, window, get_current_context())

        # Mapped over the plan: one piece (the whole window) or one lane per pool slot, each
        # taking slice after slice and retried on its own; the pool bounds what reaches the partner.
        @task(task_id="harvest_changes", map_index_template="{{ harvest_channel }}",
              doc_md=TASK_DOCS["harvest_changes"], templates_dict={"harvested_window": WINDOW_TEMPLATE}, pool=pool)
        def harvest_changes(window: dict[str, Any], piece: dict[str, Any]) -> dict[str, Any]:
            context = get_current_context()
            context["harvest_channel"] = (  # type: ignore[typeddict-unknown-key]
                f"lane {piece['lane']}" if "lane" in piece else piece.get("channel", "changes"))
            return tasks.harvest_changes(pid, window, context, piece)

        # In the pool too: a channel whose staging the database lost is harvested again here.
        # After the gate: runs when it passed (nothing over a limit) or approved; a Reject skips it.
        @task(task_id="apply_changes", outlets=[partner_asset(pid)], pool=pool)  # the event: airflow/assets.py
        def apply_changes(window: dict[str, Any], *staged: dict[str, Any]) -> dict[str, int]:
            return tasks.apply_changes(pid, window, get_current_context())

        @task(task_id="advance_cursor")
        def advance_cursor(window: dict[str, Any], applied: dict[str, int]) -> dict[str, Any]:
            return tasks.move_cursor(pid, window, get_current_context())

        @task(task_id="check_quality")
        def check_quality(applied: dict[str, int]) -> list[str]:
            return tasks.check_quality(pid, get_current_context())

        window = freeze_window()
        staged = [harvest_changes.partial(window=window).expand(piece=plan_slices(window))]
        staged += [_channel_task(pid, channel, pool)(window) for channel in channels]
        gate = PartnerApprovalGate(partner=partner, kind="shrink")  # airflow/gates.py
        staged >> gate
        applied = apply_changes(window, *staged)
        gate >> applied
        advance_cursor(window, applied)
        check_quality(applied)
    _describe_tasks(dag, docs={channel.task_id: channel.doc for channel in channels})
    return dag


def _channel_task(pid: str, channel: Channel, pool: str) -> Any:
    """The task that stages one of the protocol's extra channels (``poll_deletions``...)."""

    @task(task_id=channel.task_id, pool=pool)
    def stage_channel(window: dict[str, Any]) -> dict[str, Any]:
        return tasks.harvest_channel(pid, window, get_current_context(), channel.name)

    return stage_channel


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
        deadline=run_deadline(partner, partner.reconcile_dag_id),
        description=f"Weekly full reconcile of {pid} ({partner.protocol})",
        schedule=CronTriggerTimetable(partner.reconcile_schedule, timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        params=copy.deepcopy(RECONCILE_PARAMS),  # as above (tests/dags/test_dag_params_isolation.py)
        default_args=default_args(partner),
        tags=["reconcile", partner.protocol, f"partner:{pid}"],
        doc_md=(
            f"### Full reconcile of partner `{pid}`\n\nLists every identifier the partner holds "
            "(OAI-PMH ListIdentifiers, Sierra `fields=id`), purges local records that vanished "
            "(reason `reconcile`), fetches the ones missing locally, in one transaction. Removing more "
            f"than {partner.max_purge_fraction:.0%} of the records waits for a person's approval "
            "(`approval_gate`, Browse > Required Actions) unless `allow_mass_purge` is set. Never moves "
            "a harvest cursor; never overlaps a harvest."
        ),
    ) as dag:

        sliced = partner.slicing.reconcile_slices > 1
        if sliced:
            outcome = _sliced_reconcile_tasks(partner)
        else:
            @task(task_id="reconcile", pool=partner.pool, outlets=[partner_asset(pid)])
            def reconcile() -> dict[str, Any]:
                return tasks.reconcile_partner(pid, get_current_context())

            outcome = reconcile()

        # Both kinds: over the purge limit the reconcile staged it all; the gate asks a person.
        @task(task_id="apply_reconcile", outlets=[partner_asset(pid)])
        def apply_reconcile(outcome: dict[str, Any]) -> dict[str, Any]:
            return tasks.apply_approved_reconcile(pid, outcome, get_current_context())

        gate = PartnerApprovalGate(partner=partner, kind="purge")  # airflow/gates.py
        outcome >> gate
        gate >> apply_reconcile(outcome)
    _describe_tasks(dag, show_window=False, docs=SLICED_RECONCILE_DOCS if sliced else None)
    return dag


def _sliced_reconcile_tasks(partner: Partner) -> Any:
    """plan_sweep >> sweep_ids (mapped, one per lane, each taking slice after slice and retried
    alone) >> reconcile (the settle: guard, verify, removals, missing, apply); returns the
    settle's outcome (XCom)."""
    pid = partner.id

    # The plan's XCom is its list of pieces, each carrying the frozen plan (a mapped task maps
    # over a task's return value only): the settle reads the plan from the first.
    @task(task_id="plan_sweep", pool=partner.pool)
    def plan_sweep() -> list[dict[str, Any]]:
        return tasks.plan_reconcile_sweep(pid, get_current_context())

    @task(task_id="sweep_ids", pool=partner.pool, map_index_template="{{ sweep_lane }}",
          doc_md=TASK_DOCS["sweep_ids"])
    def sweep_ids(piece: dict[str, Any]) -> dict[str, Any]:
        context = get_current_context()
        context["sweep_lane"] = (  # type: ignore[typeddict-unknown-key]
            f"lane {piece['lane']}" if "lane" in piece else f"slice {piece['slice']}")
        return tasks.sweep_reconcile_lane(pid, piece["plan"], piece, context)

    @task(task_id="reconcile", pool=partner.pool, outlets=[partner_asset(pid)])
    def settle(pieces: list[dict[str, Any]], swept: list[dict[str, Any]]) -> dict[str, Any]:
        return tasks.settle_sliced_reconcile(pid, pieces[0]["plan"], get_current_context())

    pieces = plan_sweep()
    return settle(pieces, sweep_ids.expand(piece=pieces))


# -- the registry, partner by partner ------------------------------------------------------

KINDS = {"harvest": build_harvest_dag, "reconcile": build_reconcile_dag}


def build_dags(kind: str, wanted: str | None = None, shard: tuple[int, int] | None = None) -> list[DAG]:
    """Every ``<kind>_<id>`` DAG of the registry (only ``wanted`` when the parsing context
    names one; only the ``shard=(index, count)`` share by :func:`shard_of` for a shard file
    of partner-harvest shards): the real DAG for a valid entry, an error DAG for an
    invalid one. A file that is unusable as a whole raises, which Airflow shows as the DAG
    file's import error."""
    builder = KINDS[kind]
    if wanted is not None and wanted.startswith(f"{kind}_"):
        # A task process: build its one DAG from its one entry, not the whole registry.
        try:
            partner = get_partner(wanted[len(kind) + 1:])
        except RegistryError:
            partner = None  # an error DAG, or the file unusable: the full path below says which
        if partner is not None:
            return [builder(partner)]
    registry = load_registry()
    built: list[DAG] = []
    used = {f"{kind}_{p.id}" for p in registry.partners}
    for partner in registry.partners:
        if (wanted is None or wanted == f"{kind}_{partner.id}") and in_shard(partner.id, shard):
            built.append(builder(partner))
    for index, error in enumerate(registry.errors):
        dag_id = error_dag_id(kind, error, used, index)
        used.add(dag_id)
        if (wanted is None or wanted == dag_id) and in_shard(error.partner or dag_id, shard):
            built.append(build_error_dag(kind, dag_id, error))
    return built


def shard_of(partner_id: str, count: int) -> int:
    """The shard file a partner's DAGs live in: a stable hash of its id (not Python's hash(),
    which changes per process), so both of its DAGs stay in place while others come and go."""
    return zlib.crc32(partner_id.encode("utf-8")) % count


def in_shard(partner_id: str, shard: tuple[int, int] | None) -> bool:
    return shard is None or shard_of(partner_id, shard[1]) == shard[0]


def error_dag_id(kind: str, error: RegistryError, used: set[str], index: int) -> str:
    """``<kind>_<id>`` when the entry has a usable id (the DAG it would have been), else a
    name that cannot clash with a valid partner's DAG."""
    label = error.partner or ""
    if label.startswith("#"):  # an entry without a readable id: its position
        label = f"entry{label[1:]}"
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:200].strip("_") or f"invalid{index + 1}"
    dag_id = f"{kind}_{label}"
    if dag_id in used:
        dag_id = f"{kind}_{label}__invalid{index + 1}"
    return dag_id


def build_error_dag(kind: str, dag_id: str, error: RegistryError) -> DAG:
    """A DAG whose only task fails with the registry error (and so alerts, like any
    failure) on the default schedule; its description carries the error for the DAG list."""
    message = str(error)
    with DAG(
        dag_id=dag_id,
        description=f"INVALID REGISTRY ENTRY: {message}"[:1000],
        schedule=CronTriggerTimetable("0 2 * * *" if kind == "harvest" else "0 4 * * 0", timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={**DEFAULT_ARGS, "retries": 0, "on_failure_callback": [PartnerAlertNotifier(error.partner or dag_id)]},
        tags=[kind, "registry-error", f"partner:{error.partner}"[:100]],
        doc_md=(
            f"### Invalid registry entry\n\n`{message}`\n\nThis partner is not {kind}ed until "
            f"its entry in `{error.path}` is fixed; every other partner runs as usual. Fix "
            "the entry; the next parse replaces this DAG with the real one."
        ),
    ) as dag:

        @task(task_id="registry_error")
        def registry_error() -> None:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(message) from error  # the alert's cause: "registry entry invalid"

        registry_error()
    return dag


def registry_problems() -> list[RegistryError]:
    """The invalid entries; [] when the file as a whole is unusable (the DAG files report that)."""
    try:
        return load_registry().errors
    except RegistryError:
        return []


class InvalidRegistryEntries(RegistryError):
    """Raised at parse time of dags/partner_registry_check.py: one line per invalid entry."""

    def __init__(self, errors: list[RegistryError]):
        listing = "\n".join(f"- {error}" for error in errors)
        ValueError.__init__(
            self,
            f"{len(errors)} invalid partner entr{'y' if len(errors) == 1 else 'ies'} in {errors[0].path}; "
            "their DAGs only fail with this error, every other partner runs:\n" + listing,
        )
        self.path = errors[0].path
        self.partner = errors[0].partner if len(errors) == 1 else None
        self.field = errors[0].field if len(errors) == 1 else None
        self.problem = listing
        self.errors = errors


def raise_registry_problems() -> None:
    problems = registry_problems()
    if problems:
        raise InvalidRegistryEntries(problems)
