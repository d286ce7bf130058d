"""One run of one partner, told once: the recipe the Airflow tasks, the tests and the benchmarks call.

    freeze  ->  plan  ->  stage_lane / stage_channel (each piece, each extra channel)  ->  apply  ->  move_cursors
                                                                                        \\___ finish ____________/

Each Airflow task (airflow/tasks.py) is its lease, its fence and Airflow's plumbing around
exactly one of these functions; a quiet night (airflow/quiet.py) stages its one channel and
calls :func:`finish`, as :func:`run_partner` does, so an ordinary and a quiet night end the
same way. What a run hands beyond the aggregation goes to its :class:`Outlets`: the cursors
(read by freeze, moved by finish), the staging and apply it reports (metrics, lineage, the
Asset event). Airflow's are the cursor Variables, its Stats, its hook lineage collector and
the partner's Asset (airflow/outlets.py); a plain run's (:class:`Kept`) keep the cursors in a
dict and report nothing.

Which step does what:
  freeze        abandon stale runs, the resume point of each cursor (a restored database covers
                less than the cursor says), the clock high water, ``pipeline.freeze_window``
  plan          ``pipeline.plan_slices``: the pieces of the changes channel (XCom form): the whole
                window, or the lanes of its slices
  stage_lane    one lane: slice after slice (``pipeline.harvest_lane``), each merged into the run's batch
  stage_channel the whole window, one slice (``pipeline.harvest_piece``) or one extra channel
                (``pipeline.harvest_channel``)
  apply         ``pipeline.apply_changes``; channels whose staging was lost are staged again
  move_cursors  the main cursor and each channel's own, forward only (I1), in a fenced transaction
  wait          instead of apply and move_cursors: the partner was still publishing what the run read
                (errors.PartnerNotReady): the run closed without applying, saying why
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg

from partner_harvest import pipeline
from partner_harvest.adapters import Adapter
from partner_harvest.errors import PartnerNotReady
from partner_harvest.protocols import Channel, channels_for
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner, cursor_key, cursor_value
from partner_harvest.store import ApplyResult, RunRef, ensure_schema, fences, history
from partner_harvest.store.content import refresh_due
from partner_harvest.store.runs import abandon_stale_runs, clock_high_water, close_waiting
from partner_harvest.store.staging import NOT_LISTED
from partner_harvest.window import Window, channel_windows, format_instant, next_cursor, parse_instant

log = logging.getLogger(__name__)

CHANGES = "changes"
ABANDON_AFTER = timedelta(days=7)  # a run not applied within it is closed by the next freeze

Cursors = dict[str, "datetime | None"]  # channel ('changes', or an extra channel's name) -> the cursor's until


class Outlets(Protocol):
    """Where a run's results go beyond the aggregation, and where its cursors live."""

    def cursor(self, channel: str) -> datetime | None:
        """The cursor of ``channel`` ('changes' or an extra channel), None when unset."""

    def write_cursor(self, channel: str, value: dict[str, str]) -> None:
        """Store the cursor of ``channel`` (registry.cursor_value's dict)."""

    def staging(self, conn: psycopg.Connection, channel: str) -> None:
        """``channel`` of the run is about to be staged."""

    def applied(self, conn: psycopg.Connection, partner_id: str, run_id: str, result: ApplyResult) -> None:
        """The run applied (its transaction committed): report it. Never fails the run."""

    def moved(self, partner_id: str, moved: dict[str, dict[str, Any]]) -> None:
        """The cursors moved (or were left, and why): report it. Never fails the run."""


@dataclass
class Kept:
    """A plain run's outlets: the cursors in a dict, nothing reported (tests, benchmarks, tools)."""

    cursors: Cursors = field(default_factory=dict)
    values: dict[str, dict[str, str]] = field(default_factory=dict)  # what each cursor write stored
    staged: list[str] = field(default_factory=list)  # the channels staged, in order (a lost one again)

    def cursor(self, channel: str) -> datetime | None:
        return self.cursors.get(channel)

    def write_cursor(self, channel: str, value: dict[str, str]) -> None:
        self.values[channel] = value
        self.cursors[channel] = parse_instant(value["until"])

    def staging(self, conn: psycopg.Connection, channel: str) -> None:
        self.staged.append(channel)

    def applied(self, conn: psycopg.Connection, partner_id: str, run_id: str, result: ApplyResult) -> None:
        pass

    def moved(self, partner_id: str, moved: dict[str, dict[str, Any]]) -> None:
        pass


def channels_of(partner: Partner) -> tuple[Channel, ...]:
    """The partner's extra channels: those of its protocol's it asks for (protocols.channels_for)."""
    return channels_for(partner)


def freeze(partner: Partner, adapter: Adapter, conn: psycopg.Connection, outlets: Outlets | None = None,
           request: pipeline.RunRequest | None = None, *, epoch: int | None = None) -> Window:
    """Where each cursor resumes (none given: no cursor), then the partner's clock once;
    ``epoch``: the operator epoch the run's later writes are fenced by (the freeze task's lease)."""
    request = request or pipeline.RunRequest()
    outlets = outlets or Kept()
    ensure_schema(conn)
    abandoned = abandon_stale_runs(conn, partner.id, ABANDON_AFTER)
    if abandoned:
        log.warning("%s: %d run channel(s) never applied within %s were abandoned and their staging dropped",
                    partner.id, abandoned, ABANDON_AFTER)
    history.prune(conn, partner.id, partner.history_retention)
    cursor = None
    refresh = refresh_due(conn, partner.id) if request.mode == "incremental" else None
    if request.mode == "incremental" and refresh is None:
        cursor = pipeline.resume_point(conn, partner.id, outlets.cursor(CHANGES), CHANGES)
    channels = {c.name: pipeline.resume_point(conn, partner.id, outlets.cursor(c.name), c.name)
                for c in channels_of(partner)}
    high_water = clock_high_water(conn, partner.id)
    conn.commit()
    window = as_refresh(partner.id, pipeline.freeze_window(adapter, partner.lag, cursor, request, channels,
                                                           high_water), refresh)
    window = adapter.settle_window(window, conn)
    conn.commit()
    return window.with_facts(epoch=epoch) if epoch is not None else window


def as_refresh(partner_id: str, window: Window, refresh: str | None) -> Window:
    """A content refresh is due (content_check.py): this incremental night harvests everything
    (its cursor still moves, forward only), and its audit rows say why."""
    if refresh is None:
        return window
    log.warning("%s: this run is a content refresh, a full harvest: %s", partner_id, refresh)
    return window.with_facts(refresh=refresh)


def plan(partner: Partner, adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window) -> list[dict[str, Any]]:
    """The pieces the changes channel is harvested in: the whole window, or the lanes that
    harvest its slices (XCom form)."""
    planned = pipeline.plan_slices(adapter, conn, partner.id, run_id, window, partner.slicing)
    return pipeline.pieces(planned, pipeline.lanes_of(partner, partner.slicing))


def stage_lane(adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window, lane: int,
               outlets: Outlets | None = None,
               on_slice: Callable[[str, HarvestStats], None] | None = None,
               merging: Callable[[], psycopg.Connection] | None = None) -> HarvestStats:
    """One lane of a sliced run: its slices one after another (pipeline.harvest_lane), summed;
    ``merging``: a connection for merging slices beside the harvest (else on ``conn``)."""
    if outlets is not None:
        outlets.staging(conn, f"lane {lane}")
    total = HarvestStats()

    def each(channel: str, stats: HarvestStats) -> None:
        add_up(total, stats)
        if on_slice is not None:
            on_slice(channel, stats)

    pipeline.harvest_lane(adapter, conn, adapter.partner_id, run_id, window, lane, each, merging)
    return total


def add_up(total: HarvestStats, stats: HarvestStats) -> None:
    """``stats`` added into ``total`` (a lane's slices, a sliced run's channels)."""
    total.pages += stats.pages
    total.fetched += stats.fetched
    total.records += stats.records
    total.tombstones += stats.tombstones
    total.rejected += stats.rejected
    total.restarts += stats.restarts


def stage_channel(adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window, channel: str,
                  outlets: Outlets | None = None) -> HarvestStats:
    """One channel into staging: the whole window (``changes``), one slice, or an extra channel."""
    if outlets is not None:
        outlets.staging(conn, channel)
    run = RunRef(adapter.partner_id, run_id, channel)
    if channel in {c.name for c in channels_of(adapter.partner)}:
        return pipeline.harvest_channel(adapter, conn, run, window)
    return pipeline.harvest_piece(adapter, conn, adapter.partner_id, run_id, window, channel)


def stage(
    partner: Partner, adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window,
    on_staged: Callable[[str], None] | None = None, outlets: Outlets | None = None,
) -> tuple[list[dict[str, Any]], dict[str, HarvestStats]]:
    """Plan the pieces, harvest each, then the extra channels the window planned; returns the
    pieces as the plan cut them (a sliced run's slices, whichever lane took each).

    ``on_staged(channel)`` runs after each channel is staged: where a test changes the
    partner between two tasks of the same run."""
    pieces = plan(partner, adapter, conn, run_id, window)
    staged: dict[str, HarvestStats] = {}

    def done(channel: str, stats: HarvestStats) -> None:
        staged[channel] = stats
        if on_staged is not None:
            on_staged(channel)

    for piece in pieces:
        if "lane" in piece:
            stage_lane(adapter, conn, run_id, window, int(piece["lane"]), outlets, done)
        else:
            done(piece["channel"], stage_channel(adapter, conn, run_id, window, piece["channel"], outlets))
    if any("lane" in piece for piece in pieces):  # what the plan cut: the slices the lanes took
        pieces = [{"channel": channel} for channel in sorted(staged) if channel.startswith(CHANGES + "/")]
    for channel in window.protocol.channels:
        done(channel, stage_channel(adapter, conn, run_id, window, channel, outlets))
    return pieces, staged


def apply(conn: psycopg.Connection, partner_id: str, run_id: str, window: Window, outlets: Outlets,
          reharvest: Callable[[], Adapter] | None) -> ApplyResult:
    """Apply the run in one transaction, then report it. A run that lists the partner's whole
    collection first stages what it did not list (``pipeline.stage_unlisted``). Channels whose
    staging the database lost are staged again first (the same frozen window) by the adapter ``reharvest`` builds,
    only then; without it (an approved run applies exactly what was approved) the apply fails."""

    def again(channels: list[str]) -> None:
        assert reharvest is not None
        adapter = reharvest()
        for channel in channels:
            if channel != NOT_LISTED:
                stage_channel(adapter, conn, run_id, window, channel, outlets)
        pipeline.stage_unlisted(conn, partner_id, run_id, window)  # after what it compares with

    pipeline.stage_unlisted(conn, partner_id, run_id, window)
    result = pipeline.apply_changes(conn, partner_id, run_id, again if reharvest is not None else None)
    outlets.applied(conn, partner_id, run_id, result)
    return result


def move_cursors(conn: psycopg.Connection, partner_id: str, window: Window, run_id: str,
                 outlets: Outlets) -> dict[str, dict[str, Any]]:
    """The main cursor, then each channel's own, to the frozen ``until``: only after the apply
    committed, only for incremental runs, never backwards (I1). ``run_id`` names the run in
    the cursor's value (registry.cursor_value: Airflow's DAG run id).

    Fenced like every other write, though the cursors may live outside the aggregation (Airflow
    Variables): they are written inside an aggregation transaction that checked the run's lease
    and epoch first and holds them locked until after the writes (store/fences.fenced). A
    command's epoch bump (``reset-cursor``, ``forget``) waits for it; a move that starts after
    the bump fails naming the command."""
    with fences.fenced(conn, f"cursor move of run {run_id}"):
        moved = {CHANGES: _move(outlets, partner_id, window, run_id, CHANGES)}
        for channel, own in channel_windows(window).items():
            moved[channel] = _move(outlets, partner_id, own, run_id, channel)
    outlets.moved(partner_id, moved)
    return moved


def _move(outlets: Outlets, partner_id: str, window: Window, run_id: str, channel: str) -> dict[str, Any]:
    """One cursor to ``window.until`` when that is later; what happened, for the task's XCom."""
    key = cursor_key(partner_id, None if channel == CHANGES else channel)
    current = outlets.cursor(channel)
    shown = format_instant(current) if current else None
    if not window.advances_cursor:
        log.info("%s: %s run leaves %s where it is (%s)", partner_id, window.mode, key, shown or "unset")
        return {"key": key, "moved": False, "cursor": shown, "reason": f"{window.mode} runs never move the cursor"}
    target = next_cursor(current, window)
    if target is None or target == current:
        log.info("%s: %s already at %s; not moving it backwards to %s", partner_id, key, shown or "unset",
                 format_instant(window.until))
        return {"key": key, "moved": False, "cursor": shown, "reason": "never backwards"}
    value = cursor_value(target, window.granularity, run_id)
    outlets.write_cursor(channel, value)
    log.info("%s: %s moved from %s to %s", partner_id, key, shown or "unset", value["until"])
    return {"key": key, "moved": True, "cursor": value["until"], "previous": shown}


def wait(conn: psycopg.Connection, partner: Partner, run_id: str, not_ready: PartnerNotReady, task_id: str,
         try_number: int | None = None) -> None:
    """The end of a run that found the partner still publishing what it froze (a file not
    matching its published checksum): a wait, as for a delivery without its done-marker, not
    a failure. Nothing of the run applies (never a delivery that does not match, never one
    past it), its staging is dropped, its channels are closed ``abandoned`` with the cause and
    ``run_events`` says it skipped (``task_id``: who says so); no cursor moves. The next run
    freezes again and applies once the partner's files match."""
    dropped = close_waiting(conn, partner.id, partner.dag_id, run_id, task_id, try_number, not_ready.cause)
    log.warning("%s: run %s waits, nothing applied (%d staged rows dropped), the cursor stays: %s", partner.id,
                run_id, dropped, not_ready.cause)


@dataclass(frozen=True)
class Finished:
    """What the end of a run did: the apply, and each cursor's move."""

    applied: ApplyResult
    moved: dict[str, dict[str, Any]]


def finish(adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window, outlets: Outlets, *,
           writer: str | None = None) -> Finished:
    """The end of every run that applies: the apply (lost staging staged again), its report,
    then the cursors (``writer``: the run's name in their values; default ``run_id``). An
    ordinary night's DAG runs the two halves as two tasks (apply_changes, advance_cursor)."""
    applied = apply(conn, adapter.partner_id, run_id, window, outlets, lambda: adapter)
    return Finished(applied, move_cursors(conn, adapter.partner_id, window, writer or run_id, outlets))


def quiet_night(adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window, outlets: Outlets, *,
                writer: str | None = None) -> Finished | None:
    """A window the adapter's one cheap look (``window_is_empty``: of the changes and of every
    extra channel the window planned) shows empty: each staged whole (without asking again)
    and finished at once, as any run; None when it holds changes (the usual way harvests
    them). airflow/quiet.py says when the look is worth it."""
    if not adapter.window_is_empty(window):
        return None
    for channel in [CHANGES, *window.protocol.channels]:
        stage_channel(adapter, conn, run_id, window, channel, outlets)
    return finish(adapter, conn, run_id, window, outlets, writer=writer)


@dataclass
class RunResult:
    """What one run did: its window, its plan, each channel's harvest, the apply, the cursors after."""

    window: Window
    pieces: list[dict[str, Any]]
    staged: dict[str, HarvestStats]  # channel ('changes', 'changes/00N', an extra channel) -> its harvest
    applied: ApplyResult
    cursors: Cursors
    seconds: dict[str, float] = field(default_factory=dict)  # freeze, stage, apply: wall time of each step
    waiting: str | None = None  # why the run applied nothing and waits for the partner (:func:`wait`)

    @property
    def changes(self) -> HarvestStats:
        """The changes channel's harvest; a sliced run's slices summed."""
        if CHANGES in self.staged and len(self.pieces) <= 1:
            return self.staged[CHANGES]
        total = HarvestStats()
        for channel, stats in self.staged.items():
            if channel.startswith(CHANGES):
                add_up(total, stats)
        return total


def run_partner(
    partner: Partner, adapter: Adapter, conn: psycopg.Connection, run_id: str,
    cursors: Mapping[str, datetime | None] | None = None, request: pipeline.RunRequest | None = None,
    *, window: Window | None = None, on_staged: Callable[[str], None] | None = None,
) -> RunResult:
    """Freeze (unless ``window`` is given: a retried run reuses its frozen window), stage and
    finish, as one DAG run does; the caller keeps the cursors (``RunResult.cursors``)."""
    outlets = Kept(dict(cursors or {}))
    started = time.perf_counter()
    window = window or freeze(partner, adapter, conn, outlets, request)
    frozen = time.perf_counter()
    try:
        pieces, staged = stage(partner, adapter, conn, run_id, window, on_staged, outlets)
        harvested = time.perf_counter()
        finished = finish(adapter, conn, run_id, window, outlets)
    except PartnerNotReady as not_ready:
        wait(conn, partner, run_id, not_ready, "run_partner")
        return RunResult(window, [], {}, ApplyResult(0, 0, 0, 0, 0), outlets.cursors,
                         {"freeze": frozen - started}, waiting=not_ready.cause)
    done = time.perf_counter()
    return RunResult(window, pieces, staged, finished.applied, outlets.cursors,
                     {"freeze": frozen - started, "stage": harvested - frozen, "apply": done - harvested})


def rollback(conn: psycopg.Connection, partner_id: str, to_before: str, cursors: Cursors, *,
             requested_by: str, via: str = "run.rollback") -> history.RollbackResult:
    """Roll the partner back to before run ``to_before`` (store/history.py), its cursors in
    ``cursors`` (changed in place: each set back to where it was before that run)."""

    def set_back(places: dict[str, history.CursorPlace]) -> dict[str, Any]:
        done: dict[str, Any] = {}
        for channel, place in places.items():
            before = cursors.get(channel)
            cursors[channel] = place[0] if place else None
            done[channel] = {"from": before.isoformat() if before else None,
                             "to": place[0].isoformat() if place else None}
        return done

    return history.rollback(conn, partner_id, to_before, requested_by, via, set_back)
