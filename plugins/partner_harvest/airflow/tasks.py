"""Bodies of the harvest DAG's tasks: each is the run's lease, its fence and Airflow's plumbing
(context, Params, XCom, skips, alerts) around one call of the run recipe (partner_harvest.run),
whose results leave through the task's outlets (airflow/outlets.py).

Errors that retrying cannot fix (bad configuration, pagination loops) fail the task at
once; everything else is left to the task's retries with exponential backoff.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn, TypeVar

import psycopg
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException, AirflowSkipException

from partner_harvest import failures, pipeline, quality, run, sliced_reconcile
from partner_harvest.adapters import Adapter
from partner_harvest.airflow import assets, lineage, metrics, quiet
from partner_harvest.airflow.connections import aggregation_conninfo, read_once_per_task
from partner_harvest.airflow.cursor import read_cursor
from partner_harvest.airflow.hooks import AGGREGATION, hook_for
from partner_harvest.airflow.notifiers import event_message, failed_at_once, failure_fields, next_try, send_alert
from partner_harvest.airflow.outlets import TaskOutlets
from partner_harvest.errors import ConfigurationError, PartnerAsksToWait, PartnerNotReady
from partner_harvest.factory import build_adapter
from partner_harvest.gates import approval_since
from partner_harvest.reconcile import apply_staged as reconcile_apply_staged
from partner_harvest.reconcile import reconcile
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner, get_partner
from partner_harvest.store import connect, ensure_schema, events, fences, gates, leases, prefix_choices, runs
from partner_harvest.store.pacing import PgPacingStore
from partner_harvest.store.quality import run_figures
from partner_harvest.store.runs import last_applied_until
from partner_harvest.window import ClockBehind, Window, WindowError, backfill_day, format_instant, parse_instant

log = logging.getLogger(__name__)
T = TypeVar("T")
# How long a dead task's lease blocks its partner; the deployment may shorten it.
LEASE_TTL = timedelta(seconds=float(os.environ.get("HARVEST_LEASE_TTL_SECONDS") or leases.DEFAULT_TTL.total_seconds()))


def _fail_fast(func: Callable[..., T]) -> Callable[..., T]:
    """Fail a try at once, without Airflow's retries, when no retry can fix its error
    (``failures.classify``: an undefined or wrong Connection, 401/403, a certificate, the
    registry, a pagination loop...); the log's first line names the short cause.

    PartnerAsksToWait becomes a reschedule at its ``resume_at``: the task is not failed,
    uses no retry, and holds no worker slot while it waits.
    """

    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            with read_once_per_task():
                return func(*args, **kwargs)
        except PartnerAsksToWait as exc:  # a long rate limit, another run's lease: free the slot
            log.warning("%s; the task gives its worker slot back until then", exc)
            raise AirflowRescheduleException(reschedule_date=exc.resume_at) from exc
        except (AirflowFailException, AirflowSkipException, AirflowRescheduleException):
            raise  # decided already
        except Exception as exc:
            failure = failures.classify(exc)
            if not failure.retry:
                log.error("FAILED: %s (no retry can fix this: %s)", failure.short, failure.rule)
                raise AirflowFailException(str(exc)) from exc
            log.error("FAILED: %s (Airflow retries it while tries are left)", failure.short)
            raise
        finally:
            metrics.TRAFFIC.send(args[0] if args else kwargs.get("partner_id", "unknown"))

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


@contextmanager
def aggregation(fence: fences.Fence | None = None) -> Iterator[psycopg.Connection]:
    """A connection to the aggregation; with ``fence``, its fenced writes check it."""
    conn = fences.bind(connect(aggregation_conninfo()), fence)
    try:
        yield conn
    finally:
        conn.close()


def host_pacing(conninfo: str) -> Callable[[], PgPacingStore]:
    """The shared pacing state of the partners' hosts, opened when a request first needs it
    (from whichever thread sends it: the conninfo is read here, in the task's own thread)."""
    return lambda: PgPacingStore(conninfo)


def run_request(context: Context) -> pipeline.RunRequest:
    """Params and run type decide the mode; a backfill harvests the day of the date in its name
    (window.backfill_day), never moving the cursor. That date is its cron tick, the end of its
    data interval (a backfill run's logical date is the interval's start, the day before)."""
    params = context.get("params") or {}
    dag_run = context["dag_run"]
    run_type = getattr(dag_run, "run_type", None)
    if getattr(run_type, "value", run_type) == "backfill":
        tick = context.get("data_interval_end") or getattr(dag_run, "run_after", None)
        if tick is None:
            raise WindowError("a backfill run needs a data interval")
        start, end = backfill_day(tick)
        return pipeline.RunRequest("window", start, end, may_advance_cursor=False)
    mode = params.get("mode") or "incremental"
    requested_from = parse_instant(params["from"]) if params.get("from") else None
    requested_until = parse_instant(params["until"]) if params.get("until") else None
    return pipeline.RunRequest(mode, requested_from, requested_until, may_advance_cursor=True)


def _partner(partner_id: str) -> Partner:
    return get_partner(partner_id)


def _adapter(partner: Partner, conninfo: str) -> Adapter:
    """The partner's adapter, its endpoint read through its connection type's hook: the
    task's requests and bytes are counted (metrics), the endpoint reported as its input
    (hook-level lineage), and its requests paced per host through the aggregation at
    ``conninfo`` (read in the task's own thread)."""
    hook = hook_for(partner.protocol, partner.conn_id)
    try:
        endpoint = hook.endpoint()
    except ValueError as exc:
        raise ConfigurationError(partner.id, f"Connection '{partner.conn_id}'", str(exc)) from None
    lineage.read_endpoint(hook, partner.protocol, endpoint.base_url)
    return build_adapter(partner, endpoint, on_response=metrics.TRAFFIC.observe, pacing=host_pacing(conninfo))


def run_key(context: Context) -> str:
    """The run's key in the aggregation (staging, audit, leases): DAG and run together.

    A harvest and a reconcile scheduled at the same instant share Airflow's run id
    (``scheduled__<time>``); keyed by run id alone they would share staging and leases.
    """
    dag_run = context["dag_run"]
    return f"{dag_run.dag_id}/{dag_run.run_id}"


def hold_lease(partner_id: str, context: Context, kind: str = leases.HARVEST,
               window_data: dict[str, Any] | None = None) -> leases.LeaseKeeper:
    """Every task that reads or writes the partner's data holds the run's lease while it runs.

    ``window_data``: the run's frozen window, whose epoch its writes are fenced by (a
    command like ``forget`` after the freeze stops them); without it, the epoch the lease
    was taken at (the freeze itself, a reconcile).
    """
    conninfo = aggregation_conninfo()
    with connect(conninfo) as conn:
        ensure_schema(conn)
    epoch = Window.from_dict(window_data).protocol.epoch if window_data else None
    return leases.LeaseKeeper(conninfo, partner_id, run_key(context), kind, ttl=LEASE_TTL, epoch=epoch)


def release_lease(partner_id: str, holder: str) -> None:
    with aggregation() as conn:
        leases.release(conn, partner_id, holder)


def release_lease_after_final_failure(context: Context, partner_id: str) -> None:
    """on_failure_callback: a failed run lets a reconcile in at once, not after the TTL.

    Not while a sibling slice of the run is still planned or harvesting: it holds the same
    lease, and a reconcile let in beside it would compare the partner's ids with records
    the run is about to change. The last of them to stop renewing ends the lease in one TTL.
    """
    holder = run_key(context)
    try:
        with aggregation() as conn, conn.transaction():
            working = runs.channels_still_harvesting(conn, partner_id, holder)
            if working:
                log.info("%s: the run's lease is kept: %s still harvesting", partner_id, ", ".join(working))
                return
            leases.release(conn, partner_id, holder)
    except Exception as exc:  # never mask the task's own failure
        log.warning("could not release the lease of %s: %s", partner_id, exc)


def record_run_event(context: Context, partner_id: str, kind: str = events.FAILED) -> None:
    """on_failure_callback / on_retry_callback: the try's error, as the alert names it, in
    ``run_events`` for the health page and ``partner-harvest status`` (a run that fails before
    it writes harvest_runs, e.g. an unreachable endpoint, is otherwise only in the task's log):
    the short cause, the task and the attempt on the first line, the full text after it."""
    fields = failure_fields(context, partner_id)
    if kind == events.RETRY:
        outcome = f"failed; {next_try(context)}"
    else:
        outcome = "failed at once: no retry can fix this" if failed_at_once(fields) else "failed, the last"
    _record_event(context, partner_id, kind, event_message(fields, outcome))


def _record_event(context: Context, partner_id: str, kind: str, message: str) -> None:
    ti = context.get("ti") or context.get("task_instance")
    try:
        with aggregation() as conn:
            ensure_schema(conn)
            events.record(conn, partner_id, context["dag_run"].dag_id, run_key(context),
                          getattr(ti, "task_id", "?"), getattr(ti, "try_number", None), kind, message)
            if kind in (events.FAILED, events.RETRY):  # a remembered `auto` prefix may be the cause: ask again next run
                prefix_choices.forget(conn, partner_id)
    except Exception as exc:  # never mask the task's own failure or skip
        log.warning("%s: could not record the run's %s event: %s", partner_id, kind, exc)


def _skip(partner_id: str, context: Context, kind: str, reason: str) -> NoReturn:
    """Skip the run saying why: first in the task's log (not at its end, in a folded group),
    then in ``run_events`` for the health page."""
    log.warning("SKIPPED: %s", reason)
    _record_event(context, partner_id, kind, reason)
    raise AirflowSkipException(reason)


def is_scheduled(context: Context) -> bool:
    run_type = getattr(context["dag_run"], "run_type", None)
    return getattr(run_type, "value", run_type) == "scheduled"


def first_harvest_waits(partner: Partner, context: Context, request: pipeline.RunRequest) -> None:
    """A partner's first full harvest is a deliberate act, never a side effect of the schedule.

    Unpausing a new partner's DAG (the UI's "unpause on trigger" does it) creates a
    scheduled run at once; with no cursor it would be a full harvest, possibly hours
    long, before the run the operator asked for. So a scheduled incremental run of a
    partner that has no cursor Variable and no applied incremental run skips, saying
    what to do. Manual runs keep "no cursor: everything, then set the cursor".
    """
    if request.mode != "incremental" or not is_scheduled(context) or read_cursor(partner.id) is not None:
        return
    with aggregation() as conn:
        ensure_schema(conn)
        if last_applied_until(conn, partner.id, "changes") is not None:
            return  # the Variable was deleted on purpose (docs/operator/operating.md, "Everyday actions"): full harvest as before
    _skip(partner.id, context, events.SKIPPED,
        f"{partner.id}: no cursor yet (Variable {partner.cursor_key} unset, no applied run in harvest_runs): "
        "a scheduled run never starts a partner's first full harvest. Trigger "
        f"{partner.dag_id} once by hand (mode=incremental harvests everything and sets the cursor); "
        "the nightly runs continue from there. This run is skipped."
    )


@_fail_fast
def freeze_window(partner_id: str, context: Context) -> dict[str, Any]:
    """The run's window (its XCom). A quiet night: the run, whole (quiet.py)."""
    partner = _partner(partner_id)
    request = run_request(context)
    first_harvest_waits(partner, context, request)
    with hold_lease(partner_id, context) as keeper:
        asked = partner.metadata_prefix == "auto" and request.mode != "full"
        if asked:  # a fresh remembered choice spares the ListMetadataFormats
            with aggregation() as conn:
                chosen = prefix_choices.remembered(conn, partner_id)
            if chosen is not None:
                partner, asked = partner.evolve(metadata_prefix=chosen), False
        else:
            asked = partner.metadata_prefix == "auto"
        adapter = _adapter(partner, keeper.conninfo)
        fence = keeper.fence  # set once the lease is held: every later write of the run is fenced by its epoch
        with aggregation(fence) as conn:
            window = run.freeze(partner, adapter, conn, TaskOutlets(partner_id, context), request,
                                epoch=fence.epoch if fence else None)
        if asked and window.protocol.metadata_prefix:
            with aggregation() as conn:
                prefix_choices.remember(conn, partner_id, window.protocol.metadata_prefix)
        empty = _empty_window(partner_id, window, request)
        if empty is None:
            behind = window.protocol.clock_behind_cursor
            if behind:
                _alert_clock_behind(partner, context, behind)
            if quiet.may_be_quiet(partner, window, request):
                _quiet_night(partner, adapter, window, context, keeper)  # the rest is skipped when it was
            return window.to_dict()
    release_lease(partner_id, run_key(context))  # nothing follows: let a reconcile in now
    _skip(partner_id, context, events.EMPTY, empty)


def _quiet_night(partner: Partner, adapter: Adapter, window: Window, context: Context,
                 keeper: leases.LeaseKeeper) -> None:
    """When the adapter's one look shows the window empty: the run staged and finished here
    (``run.quiet_night``: the apply, its metrics, lineage and Asset event, the cursor, through
    the outlets every run reports through), under the freeze's lease and fence, then the
    quality checks; the later tasks are skipped (no process). Returns when it holds changes."""
    with aggregation(keeper.fence) as conn:
        finished = run.quiet_night(adapter, conn, run_key(context), window,
                                   TaskOutlets(partner.id, context, quiet=True), writer=context["dag_run"].run_id)
    if finished is None:
        return
    log.info("%s: quiet night: the window %s holds no change; applied (%s) here, so the later tasks are skipped",
             partner.id, window.describe(), finished.applied.as_dict())
    _check_quality(partner, context)
    keeper.release_on_exit = True  # nothing follows: let a reconcile in now
    quiet.skip_the_rest(context, window.to_dict())


def _empty_window(partner_id: str, window: Window, request: pipeline.RunRequest) -> str | None:
    """Why a window run (a backfill's day) has nothing to harvest: it starts after the partner's clock."""
    clock = window.partner_clock
    if window.mode != "window" or window.from_ is None or clock is None or window.from_ <= clock:
        return None
    kind = "backfill" if not request.may_advance_cursor else "window"
    return (f"{partner_id}: nothing to harvest: this {kind} run's window {window.describe()} starts after the "
            f"partner's clock ({format_instant(clock)}): the partner has stamped no change there. "
            "This run is skipped.")


def _alert_clock_behind(partner: Partner, context: Context, behind: ClockBehind) -> None:
    lines = [
        f"Partner: {partner.id}", f"DAG: {partner.dag_id}   run: {context['dag_run'].run_id}",
        f"The partner's clock ({behind.clock}) is behind our cursor ({behind.cursor}) by more than the lag "
        f"({partner.lag}). The window was harvested up to the cursor again; nothing was skipped, but check the "
        "partner's clock (a reset, a failover to a server with another clock).",
    ]
    send_alert(f"[partner harvest] {partner.id}: partner clock moved backwards", lines,
               {"kind": "clock_behind", "partner": partner.id, "dag_id": partner.dag_id, **behind.model_dump()})


@_fail_fast
def plan_slices(partner_id: str, window_data: dict[str, Any], context: Context) -> list[dict[str, Any]]:
    """The pieces the mapped harvest runs over: the whole window, or its slices."""
    partner = _partner(partner_id)
    with hold_lease(partner_id, context, window_data=window_data) as keeper:
        adapter = _adapter(partner, keeper.conninfo)
        with aggregation(keeper.fence) as conn:
            return run.plan(partner, adapter, conn, run_key(context), Window.from_dict(window_data))


@_fail_fast
def harvest_changes(partner_id: str, window_data: dict[str, Any], context: Context,
                    piece: dict[str, Any] | None = None) -> dict[str, Any]:
    """One piece of the plan (mapped): the whole window, or one lane of a sliced run (its
    slices one after another; a retry takes its unfinished slice again, then the rest)."""
    if piece and "lane" in piece:
        return _stage_lane(partner_id, window_data, context, int(piece["lane"]))
    channel = (piece or {}).get("channel") or run.CHANGES
    return {"channel": channel, **_stage_channel(partner_id, window_data, context, channel)}


def _stage_lane(partner_id: str, window_data: dict[str, Any], context: Context, lane: int) -> dict[str, Any]:
    """A lane's slices into staging; the instance is named by them in the grid
    (``harvest_channel``: the mapped task's map_index_template)."""
    channels: list[str] = []

    def named(channel: str, _: HarvestStats) -> None:
        channels.append(channel)
        context["harvest_channel"] = f"lane {lane}: {', '.join(channels)}"  # type: ignore[typeddict-unknown-key]

    with hold_lease(partner_id, context, window_data=window_data) as keeper:
        adapter = _adapter(_partner(partner_id), keeper.conninfo)
        conninfo, fence = keeper.conninfo, keeper.fence  # read here: the merges' thread opens its own connection
        with aggregation(fence) as conn:
            stats = run.stage_lane(adapter, conn, run_key(context), Window.from_dict(window_data), lane,
                                   TaskOutlets(partner_id, context), named,
                                   lambda: fences.bind(connect(conninfo), fence))
    return {"channel": f"lane {lane}", "slices": channels, **_figures(stats)}


@_fail_fast
def harvest_channel(partner_id: str, window_data: dict[str, Any], context: Context, channel: str) -> dict[str, Any]:
    """One of the protocol's extra channels (Sierra's deletion poll), on its own cursor."""
    return _stage_channel(partner_id, window_data, context, channel)


@contextmanager
def waits_for_partner(partner_id: str, context: Context) -> Iterator[None]:
    """A task that found the partner still publishing what the run froze (PartnerNotReady: a
    file not matching its published checksum) ends the run as a wait (``run.wait``: nothing
    applied, staging dropped, the run's ``skipped`` event), gives the lease back unless a
    slice still harvests, and is skipped: the approval gate, the apply, the cursor and the
    quality check are skipped after it. No failure, no alert; the next run tries again."""
    try:
        yield
    except PartnerNotReady as exc:
        ti = context.get("ti") or context.get("task_instance")
        with aggregation() as conn:
            run.wait(conn, _partner(partner_id), run_key(context), exc, getattr(ti, "task_id", "?"),
                     getattr(ti, "try_number", None))
        release_lease_after_final_failure(context, partner_id)
        log.warning("SKIPPED: %s", exc.cause)
        raise AirflowSkipException(exc.cause) from exc


def _stage_channel(partner_id: str, window_data: dict[str, Any], context: Context, channel: str) -> dict[str, Any]:
    """Stream one channel of the frozen window into staging (retries reuse the window)."""
    with waits_for_partner(partner_id, context), hold_lease(partner_id, context, window_data=window_data) as keeper:
        adapter = _adapter(_partner(partner_id), keeper.conninfo)
        with aggregation(keeper.fence) as conn:
            stats = run.stage_channel(adapter, conn, run_key(context), Window.from_dict(window_data), channel,
                                      TaskOutlets(partner_id, context))
    return _figures(stats)


def _figures(stats: HarvestStats) -> dict[str, Any]:
    """A staged piece's figures (its XCom; the approval gate sums the tombstones)."""
    return {
        "pages": stats.pages, "fetched": stats.fetched, "records": stats.records,
        "tombstones": stats.tombstones, "rejected": stats.rejected,
        "complete_list_size": stats.complete_list_size, "restarts": stats.restarts,
    }


@_fail_fast
def apply_changes(partner_id: str, window_data: dict[str, Any], context: Context) -> dict[str, int]:
    """Apply the run; channels whose staging the database lost are harvested again first."""
    with waits_for_partner(partner_id, context), hold_lease(partner_id, context, window_data=window_data) as keeper, \
            aggregation(keeper.fence) as conn:
        with approved_apply(conn, partner_id, run_key(context), keeper.fence) as approved:
            # An approved run applies exactly what was staged: lost staging fails, never re-harvests.
            return run.apply(conn, partner_id, run_key(context), Window.from_dict(window_data),
                             TaskOutlets(partner_id, context),
                             None if approved else lambda: _adapter(_partner(partner_id), keeper.conninfo)).as_dict()


@_fail_fast
def move_cursor(partner_id: str, window_data: dict[str, Any], context: Context) -> dict[str, Any]:
    """The main cursor, then each channel's own (run.move_cursors: fenced, forward only)."""
    with hold_lease(partner_id, context, window_data=window_data) as keeper, aggregation(keeper.fence) as conn:
        moved = run.move_cursors(conn, partner_id, Window.from_dict(window_data), context["dag_run"].run_id,
                                 TaskOutlets(partner_id, context))
        keeper.release_on_exit = True  # nothing of the run follows: let a reconcile in now
    return moved


@_fail_fast
def check_quality(partner_id: str, context: Context) -> list[str]:
    """Alert (without failing) when a successful run crossed a data-quality threshold."""
    return _check_quality(_partner(partner_id), context)


def _check_quality(partner: Partner, context: Context) -> list[str]:
    run_id = context["dag_run"].run_id
    with aggregation() as conn:
        figures = run_figures(conn, partner.id, run_key(context))
    found = quality.findings(partner, figures, datetime.now(timezone.utc))
    if found:
        send_alert(
            f"[partner harvest] {partner.id}: data-quality warning ({len(found)})",
            [f"Partner: {partner.id}", f"DAG: {partner.dag_id}   run: {run_id}", *found],
            {"kind": "quality", "partner": partner.id, "dag_id": partner.dag_id, "run_id": run_id, "findings": found},
        )
    else:
        log.info("%s: run %s passed the data-quality checks", partner.id, run_id)
    return found


@_fail_fast
def reconcile_partner(partner_id: str, context: Context) -> dict[str, Any]:
    """The weekly full reconcile; never moves a harvest cursor, never overlaps a harvest.

    Over the purge limit (and without ``allow_mass_purge``) it stages everything and returns
    ``awaiting_approval``: the DAG's approval gate asks a person, ``apply_approved_reconcile`` applies."""
    partner = _partner(partner_id)
    allow = bool((context.get("params") or {}).get("allow_mass_purge"))
    keeper = hold_lease(partner_id, context, leases.RECONCILE)
    keeper.release_on_exit = True
    with keeper:
        adapter = _adapter(partner, keeper.conninfo)
        with aggregation(keeper.fence) as conn:
            outcome = reconcile(adapter, conn, partner, run_key(context), allow_mass_purge=allow, gate=True).as_dict()
            return _reconcile_settled(conn, partner_id, context, outcome, keeper.fence)


def _reconcile_settled(conn: psycopg.Connection, partner_id: str, context: Context, outcome: dict[str, Any],
                       fence: fences.Fence | None, **facts: Any) -> dict[str, Any]:
    """A reconcile's settle (the one task's, or a sliced one's) as the approval gate reads it:
    applied within its limit (metrics, lineage, the Asset event), or staged over it and
    ``awaiting_approval``, with the epoch (and ``facts``: a sliced plan's ``planned_at``) that
    the approved apply is fenced by (apply_approved_reconcile)."""
    _alert_unreliable_datestamps(partner_id, context, outcome.get("content") or {})
    if outcome["awaiting_approval"]:  # the task's Asset event says so: nothing applied yet
        assets.emit(context, partner_id, {"partner_id": partner_id, "run_id": run_key(context),
                                          "changed": False, "awaiting_approval": True})
        return {**outcome, "epoch": fence.epoch if fence else None, **facts}
    _reconcile_applied(conn, partner_id, outcome)
    assets.emit(context, partner_id, assets.event_extra(conn, partner_id, run_key(context), context["dag_run"].run_id))
    return outcome


def _alert_unreliable_datestamps(partner_id: str, context: Context, found: dict[str, Any]) -> None:
    """The content check found records changed without a new datestamp (content_check.py)."""
    if not found.get("silent"):
        return
    dag_run = context["dag_run"]
    examples = [f"  {e['identifier']} (datestamp {e['datestamp']}, held {e['held_hash']}, partner {e['partner_hash']})"
                for e in found.get("examples") or []]
    send_alert(f"[partner harvest] {partner_id}: datestamps unreliable", [
        f"Partner: {partner_id}", f"DAG: {dag_run.dag_id}   run: {dag_run.run_id}",
        f"{found['refresh']}.", "Examples (identifier, datestamp, content hash held / at the partner):", *examples,
        "A content refresh (a full harvest, through the shrink gate) runs on the partner's next incremental night; "
        "docs/operator/content-check.md.",
    ], {"kind": "datestamps_unreliable", "partner": partner_id, "dag_id": dag_run.dag_id, "run_id": dag_run.run_id,
        "sampled": found.get("sampled"), "silent": found.get("silent"),
        "examples": [e["identifier"] for e in found.get("examples") or []]})


def _reconcile_applied(conn: psycopg.Connection, partner_id: str, outcome: dict[str, Any]) -> None:
    """An applied reconcile's lineage (the live tables it wrote) and metrics, whichever task
    applied it: the reconcile itself, the approved apply, or a sliced reconcile's apply."""
    lineage.wrote(AGGREGATION, lineage.tables(conn, lineage.APPLIED[:2]))
    metrics.count("purged", partner_id, int(outcome.get("purged", 0)))
    metrics.count("upserted", partner_id, int(outcome.get("upserted", 0)))
    metrics.count("runs_applied", partner_id, 1)


# -- a sliced reconcile (registry slicing.reconcile_slices; sliced_reconcile.py) -----------

@_fail_fast
def plan_reconcile_sweep(partner_id: str, context: Context) -> list[dict[str, Any]]:
    """Freeze the reconcile's window and plan its sweep's slices, under the reconcile lease
    the run's later tasks join (fenced by the epoch it is taken at): one piece per slice,
    each with the plan (XCom)."""
    partner = _partner(partner_id)
    with hold_lease(partner_id, context, leases.RECONCILE) as keeper:
        adapter = _adapter(partner, keeper.conninfo)
        with aggregation(keeper.fence) as conn:
            epoch = keeper.fence.epoch if keeper.fence else None
            plan = sliced_reconcile.plan_sweep(adapter, conn, partner, run_key(context), epoch).to_dict()
    return [{**piece, "plan": plan} for piece in plan["pieces"]]


@_fail_fast
def sweep_reconcile_lane(partner_id: str, plan: dict[str, Any], piece: dict[str, Any],
                         context: Context) -> dict[str, Any]:
    """One lane of the sweep (mapped): slice after slice, retried on its own (the retry resumes
    at the slice that failed); refuses once the plan is stale. A piece of a plan made before
    lanes names its one slice."""
    partner = _partner(partner_id)
    with hold_lease(partner_id, context, leases.RECONCILE, window_data=plan["window"]) as keeper:
        adapter = _adapter(partner, keeper.conninfo)
        with aggregation(keeper.fence) as conn:
            sweep = sliced_reconcile.SweepPlan.from_dict(plan)
            if "lane" in piece:
                done = sliced_reconcile.sweep_lane(adapter, conn, partner_id, run_key(context), sweep, int(piece["lane"]))
            else:
                index = int(piece["slice"])
                done = [(index, sliced_reconcile.sweep_slice(adapter, conn, partner_id, run_key(context), sweep, index))]
    return {**{k: piece[k] for k in ("lane", "slice") if k in piece}, "slices": [index for index, _ in done],
            "pages": sum(stats.pages for _, stats in done), "ids": sum(stats.fetched for _, stats in done)}


@_fail_fast
def settle_sliced_reconcile(partner_id: str, plan: dict[str, Any], context: Context) -> dict[str, Any]:
    """Guard, verify, removals, missing records, one-transaction apply; releases the lease.
    Over the purge limit (without ``allow_mass_purge``) it stages all of it and returns
    ``awaiting_approval``, as ``reconcile_partner``: the same gate and approved apply follow."""
    partner = _partner(partner_id)
    allow = bool((context.get("params") or {}).get("allow_mass_purge"))
    keeper = hold_lease(partner_id, context, leases.RECONCILE, window_data=plan["window"])
    keeper.release_on_exit = True
    with keeper:
        adapter = _adapter(partner, keeper.conninfo)
        with aggregation(keeper.fence) as conn:
            outcome = sliced_reconcile.apply_sweep(adapter, conn, partner, run_key(context),
                                                   sliced_reconcile.SweepPlan.from_dict(plan),
                                                   allow_mass_purge=allow, gate=True).as_dict()
            return _reconcile_settled(conn, partner_id, context, outcome, keeper.fence, planned_at=plan["planned_at"])


@_fail_fast
def apply_approved_reconcile(partner_id: str, outcome: dict[str, Any], context: Context) -> dict[str, Any]:
    """After the gate's Approve: apply exactly what the reconcile staged, at the epoch it was
    planned at, only if no other run of the partner applied during the wait (for a sliced
    reconcile: since its plan, gates.approval_since). A reconcile within its limit applied
    in its own task: skipped, so the run has one Asset event."""
    if not outcome.get("awaiting_approval"):  # skipped: the reconcile task's Asset event is the run's only one
        raise AirflowSkipException(f"{partner_id}: the reconcile applied within its purge limit; nothing waits")
    keeper = leases.LeaseKeeper(aggregation_conninfo(), partner_id, run_key(context), leases.RECONCILE,
                                ttl=LEASE_TTL, epoch=outcome.get("epoch"), release_on_exit=True)
    with keeper, aggregation(keeper.fence) as conn:
        with approved_apply(conn, partner_id, run_key(context), keeper.fence, required=True, outcome=outcome):
            applied = reconcile_apply_staged(conn, partner_id, run_key(context))
        _reconcile_applied(conn, partner_id, applied)
        assets.emit(context, partner_id, assets.event_extra(conn, partner_id, run_key(context), context["dag_run"].run_id))
        return applied


@contextmanager
def approved_apply(conn: psycopg.Connection, partner_id: str, run_id: str, fence: fences.Fence | None,
                   required: bool = False, outcome: dict[str, Any] | None = None) -> Iterator[gates.Request | None]:
    """An apply behind an approval gate (airflow/gates.py) writes only what a person approved.

    No request for the run (the gate skipped: nothing crossed a limit): the apply is as
    always. An approved one: the fence also refuses if another run of the partner applied
    since the request, or since a sliced reconcile's plan (``outcome``; Fence.applied_before),
    and a refusal abandons the run. A request still pending, rejected or abandoned (the gate
    marked success by hand): nothing applies.
    """
    request = gates.get_request(conn, partner_id, run_id)
    if request is None:
        if required:
            raise AirflowFailException(f"{partner_id}: run {run_id} has no approval request; nothing applied")
        yield None
        return
    if request.state not in (gates.APPROVED, gates.APPLIED):
        raise AirflowFailException(
            f"{partner_id}: the approval request of run {run_id} is {request.state}, not approved; nothing applied "
            "(answer it in Required Actions; docs/operator/approvals.md)")
    if fence is not None:
        fence.applied_before = approval_since(request, outcome or {})
    try:
        yield request
    except (fences.NewerRunApplied, fences.PartnerChanged) as exc:
        conn.rollback()
        gates.abandon(conn, partner_id, run_id, gates.REFUSED, f"approved, then refused: {exc.cause}")
        raise
    gates.decide(conn, partner_id, run_id, gates.APPLIED)

