"""One run of one partner without Airflow: the harvest DAG's steps, in its order.

The DAG's tasks (airflow/tasks.py) freeze the window, plan the pieces, harvest each piece
and the extra channels, apply, then move the cursors; between them sit what only Airflow
gives (leases fenced by epochs, Variables, retries, Asset events). This module runs the
same steps through the same library calls in one process, with the cursors held by the
caller, so that tests, benchmarks and tools drive a partner the way a run does instead of
each retelling the recipe (and drifting from it when a step is added).

Which step does what:
  freeze   abandon stale runs, the resume point of each cursor (a restored database covers
           less than the cursor says), the clock high water, ``pipeline.freeze_window``
  stage    ``pipeline.plan_slices``, then ``pipeline.harvest_piece`` per piece and
           ``pipeline.poll_deletions`` for the deletions channel
  apply    ``pipeline.apply_changes``; channels whose staging was lost are staged again
  advance  ``window.next_cursor`` for the main cursor and each channel's own
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from partner_harvest import pipeline
from partner_harvest.adapters import Adapter
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store import ApplyResult, RunRef, ensure_schema, history
from partner_harvest.store.content import refresh_due
from partner_harvest.store.runs import abandon_stale_runs, clock_high_water
from partner_harvest.window import Window, channel_windows, next_cursor

log = logging.getLogger(__name__)

CHANGES = "changes"
DELETIONS = "deletions"
ABANDON_AFTER = timedelta(days=7)  # as the DAG's freeze task: a run not applied within it is closed

Cursors = dict[str, "datetime | None"]  # channel ('changes', 'deletions') -> the cursor's until


@dataclass
class RunResult:
    """What one run did: its window, its plan, each channel's harvest, the apply, the cursors after."""

    window: Window
    pieces: list[dict[str, Any]]
    staged: dict[str, HarvestStats]  # channel ('changes', 'changes/00N', 'deletions') -> its harvest
    applied: ApplyResult
    cursors: Cursors
    seconds: dict[str, float] = field(default_factory=dict)  # freeze, stage, apply: wall time of each step

    @property
    def changes(self) -> HarvestStats:
        """The changes channel's harvest; a sliced run's slices summed."""
        if CHANGES in self.staged and len(self.pieces) <= 1:
            return self.staged[CHANGES]
        total = HarvestStats()
        for channel, stats in self.staged.items():
            if channel.startswith(CHANGES):
                total.pages += stats.pages
                total.fetched += stats.fetched
                total.records += stats.records
                total.tombstones += stats.tombstones
                total.rejected += stats.rejected
                total.restarts += stats.restarts
        return total

    @property
    def deletions(self) -> HarvestStats | None:
        return self.staged.get(DELETIONS)


def extra_channels(adapter: Adapter) -> tuple[str, ...]:
    """Channels with cursors of their own (Sierra's deletion poll), as the DAG decides them."""
    return adapter.extra_channels


def freeze(
    partner: Partner, adapter: Adapter, conn: psycopg.Connection, cursors: Mapping[str, datetime | None] | None = None,
    request: pipeline.RunRequest | None = None,
) -> Window:
    """The freeze task without its lease: where each cursor resumes, then the partner's clock once."""
    request = request or pipeline.RunRequest()
    cursors = cursors or {}
    ensure_schema(conn)
    abandon_stale_runs(conn, partner.id, ABANDON_AFTER)
    history.prune(conn, partner.id, partner.history_retention)
    cursor = None
    refresh = refresh_due(conn, partner.id) if request.mode == "incremental" else None
    if request.mode == "incremental" and refresh is None:
        cursor = pipeline.resume_point(conn, partner.id, cursors.get(CHANGES), CHANGES)
    channels = {name: pipeline.resume_point(conn, partner.id, cursors.get(name), name)
                for name in extra_channels(adapter)}
    high_water = clock_high_water(conn, partner.id)
    conn.commit()
    window = pipeline.freeze_window(adapter, partner.lag, cursor, request, channels, high_water)
    return as_refresh(partner.id, window, refresh)


def as_refresh(partner_id: str, window: Window, refresh: str | None) -> Window:
    """A content refresh is due (content_check.py): this incremental night harvests everything
    (its cursor still moves, forward only), and its audit rows say why."""
    if refresh is None:
        return window
    log.warning("%s: this run is a content refresh, a full harvest: %s", partner_id, refresh)
    return window.with_facts(refresh=refresh)


def stage_channel(adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, window: Window,
                  channel: str) -> HarvestStats:
    """One channel into staging: the whole window, one slice, or the deletion poll."""
    if channel == DELETIONS:
        return pipeline.poll_deletions(adapter, conn, RunRef(partner_id, run_id, DELETIONS), window)
    return pipeline.harvest_piece(adapter, conn, partner_id, run_id, window, channel)


def stage(
    partner: Partner, adapter: Adapter, conn: psycopg.Connection, run_id: str, window: Window,
    on_staged: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, HarvestStats]]:
    """Plan the pieces, harvest each, then the extra channels the window planned.

    ``on_staged(channel)`` runs after each channel is staged: where a test changes the
    partner between two tasks of the same run."""
    pieces = pipeline.pieces(pipeline.plan_slices(adapter, conn, partner.id, run_id, window, partner.slicing))
    staged: dict[str, HarvestStats] = {}
    channels = [piece["channel"] for piece in pieces] + list(window.protocol.channels)
    for channel in channels:
        staged[channel] = stage_channel(adapter, conn, partner.id, run_id, window, channel)
        if on_staged is not None:
            on_staged(channel)
    return pieces, staged


def apply(adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, window: Window) -> ApplyResult:
    """The apply task: channels whose staging the database lost are harvested again first."""

    def reharvest(channels: list[str]) -> None:
        for channel in channels:
            stage_channel(adapter, conn, partner_id, run_id, window, channel)

    return pipeline.apply_changes(conn, partner_id, run_id, reharvest)


def advance(cursors: Mapping[str, datetime | None], window: Window) -> Cursors:
    """The cursors after the window applied: the main one and each channel's, forward only (I1)."""
    moved: Cursors = dict(cursors)
    moved[CHANGES] = next_cursor(cursors.get(CHANGES), window)
    for channel, own in channel_windows(window).items():
        moved[channel] = next_cursor(cursors.get(channel), own)
    return moved


def run_partner(
    partner: Partner, adapter: Adapter, conn: psycopg.Connection, run_id: str,
    cursors: Mapping[str, datetime | None] | None = None, request: pipeline.RunRequest | None = None,
    *, window: Window | None = None, on_staged: Callable[[str], None] | None = None,
) -> RunResult:
    """Freeze (unless ``window`` is given: a retried run reuses its frozen window), stage,
    apply and advance the cursors, as one DAG run does; the caller keeps the cursors."""
    cursors = dict(cursors or {})
    started = time.perf_counter()
    window = window or freeze(partner, adapter, conn, cursors, request)
    frozen = time.perf_counter()
    pieces, staged = stage(partner, adapter, conn, run_id, window, on_staged)
    harvested = time.perf_counter()
    applied = apply(adapter, conn, partner.id, run_id, window)
    done = time.perf_counter()
    return RunResult(window, pieces, staged, applied, advance(cursors, window),
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
