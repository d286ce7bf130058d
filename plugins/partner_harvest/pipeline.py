"""The steps of one harvest run, protocol-agnostic and free of Airflow.

Airflow tasks are thin wrappers around these functions, so the whole data path can be
run and tested with plain Python: freeze a window, stream it into staging, apply it in
one transaction, then (in Airflow) move the cursor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from typing import Any

import psycopg

from partner_harvest.adapters import Adapter
from partner_harvest.errors import HarvestError, PartnerAsksToWait
from partner_harvest.records import HarvestStats
from partner_harvest.registry import SliceSettings
from partner_harvest.store import (
    ApplyResult,
    RunRef,
    StagingWriter,
    apply_run,
    begin_run,
    ensure_schema,
    fail_apply,
    fail_run,
    finish_harvest,
    record_check,
    run_batch,
    slices,
)
from partner_harvest.store.apply import StagingIncomplete
from partner_harvest.store.runs import last_applied_until, record_failed_try
from partner_harvest.store.slices import Resumable
from partner_harvest.store.staging import NOT_LISTED, holds_any, stage_not_listed
from partner_harvest.window import (
    ClockBehind,
    Slice,
    Window,
    WindowFacts,
    channel_window,
    format_instant,
    plan_window,
)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # 'from the start' for a channel's own cursor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRequest:
    """What the operator (or the schedule) asked for."""

    mode: str = "incremental"
    requested_from: datetime | None = None
    requested_until: datetime | None = None
    may_advance_cursor: bool = True


def freeze_window(
    adapter: Adapter,
    lag: Any,
    cursor_until: datetime | None,
    request: RunRequest,
    channel_cursors: dict[str, datetime | None] | None = None,
    clock_high_water: datetime | None = None,
) -> Window:
    """Ask the partner for its clock once and fix the run's bounds (and its channels').

    A partner clock behind our cursor by more than the lag (a reset, a failover to a server
    with another clock) stamps its changes since the jump before our cursor, at a point
    nobody knows: that run harvests the whole list up to the partner's clock (and every
    channel from the start) instead of trusting the timestamps, and alerts. The cursor
    never moves backwards; the next run resumes from the partner's clock (resume_point).

    A clock behind ``clock_high_water`` (the highest clock or record stamp applied runs saw) by
    more than the lag marks the run ``clock_regressed``, in any mode, for as long as the
    clock stays behind: its versions may carry stamps older than versions we hold, and
    the apply then orders them by observation (store/apply.py).
    """
    clock = adapter.clock()
    behind = request.mode == "incremental" and cursor_until is not None and clock.now < cursor_until - lag
    regressed = behind or (clock_high_water is not None and clock.now < clock_high_water - lag)
    if behind and cursor_until is not None:
        log.warning("%s: the partner's clock %s is behind the cursor %s by more than the lag %s: its changes since "
                    "the jump carry stamps before the cursor, so this run harvests the whole list up to the "
                    "partner's clock (and every channel from the start)", adapter.partner_id,
                    format_instant(clock.now), format_instant(cursor_until), lag)
    window = plan_window(
        mode=request.mode,
        partner_clock=clock.now,
        granularity=clock.granularity,
        lag=lag,
        cursor_until=None if behind else cursor_until,
        requested_from=request.requested_from,
        requested_until=request.requested_until,
        may_advance_cursor=request.may_advance_cursor,
    )
    facts = WindowFacts.model_validate({**clock.protocol, "partner_clock": clock.now, "clock_regressed": regressed})
    if regressed:
        if not behind:
            log.warning("%s: the partner's clock %s is still behind the highest clock or record datestamp an applied "
                        "run saw (%s) by more than the lag %s: versions it stamps now may be older than versions held, "
                        "so this run's versions are ordered by when we observed them. If no clock was ever that far "
                        "ahead, a record is stamped in the future: this repeats until the partner's clock passes it",
                        adapter.partner_id, format_instant(clock.now),
                        format_instant(clock_high_water) if clock_high_water else "?", lag)
    if behind and cursor_until is not None:
        facts = facts.with_(clock_behind_cursor=ClockBehind(clock=format_instant(clock.now),
                                                            cursor=format_instant(cursor_until)))
        channel_cursors = {name: EPOCH for name in (channel_cursors or {})}
    window = replace(window, protocol=facts)
    channels = adapter.plan_channels(window, channel_cursors or {})
    if channels:  # each channel's audit row remembers the clock too
        window = window.with_facts(channels={
            name: plan.model_copy(update={"partner_clock": plan.partner_clock or clock.now,
                                          "clock_regressed": plan.clock_regressed or regressed})
            for name, plan in channels.items()})
    log.info("%s: frozen %s", adapter.partner_id, window.describe())
    return window


def resume_point(
    conn: psycopg.Connection, partner_id: str, cursor: datetime | None, channel: str = "changes",
) -> datetime | None:
    """Where an incremental window starts: the cursor, unless this database covers less.

    Less when the database was restored from a backup (the cursor Variable, in Airflow's
    database, is then ahead of it) or when the partner's clock was behind our cursor the
    last time (its changes since carry stamps before the cursor): then the earlier bound,
    and the log says why. The cursor itself never moves backwards (I1).
    """
    if cursor is None:
        return None
    covered = last_applied_until(conn, partner_id, channel)
    if covered is not None and covered >= cursor:
        return cursor
    log.warning(
        "%s: the %s cursor says %s but what the aggregation database applied covers the partner only up to %s "
        "(the partner's clock was behind the cursor, or the database was restored from a backup / runs were "
        "removed from harvest_runs); harvesting from the earlier. The cursor itself is left as it is.",
        partner_id, channel, format_instant(cursor), format_instant(covered) if covered else "nowhere (no applied run)",
    )
    return covered


def harvest_window(
    adapter: Adapter, conn: psycopg.Connection, run: RunRef, window: Window
) -> HarvestStats:
    """Stream the window's changes into staging; on failure the audit row says why."""
    return _stage(adapter, adapter.harvest, conn, run, window)


def harvest_channel(adapter: Adapter, conn: psycopg.Connection, run: RunRef, window: Window) -> HarvestStats:
    """Stream one of the protocol's extra channels (``run.channel``, e.g. Sierra's deletion
    poll) into the same run's staging; its audit row carries the channel's own window."""
    return _stage(adapter, partial(adapter.harvest_channel, run.channel), conn, run, window,
                  audit_window=channel_window(window, run.channel))


def _stage(
    adapter: Adapter, source: Callable[[Window, StagingWriter, HarvestStats], None], conn: psycopg.Connection,
    run: RunRef, window: Window, audit_window: Window | None = None, resume: Resumable | None = None,
) -> HarvestStats:
    partner_id = adapter.partner_id
    ensure_schema(conn)
    stats = HarvestStats()
    if resume is None:
        # An unsliced Sierra export keeps an unfinished try's staging (Adapter.resumes_staging).
        attempt = begin_run(conn, run, audit_window or window, window.protocol.metadata_prefix,
                            keep_staging=adapter.resumes_staging(run.channel, window))
    else:  # a Sierra slice picks up where it failed, with what it staged before
        attempt = slices.reopen(conn, run)
        stats.pages, stats.fetched = resume.pages, resume.fetched
        stats.records, stats.tombstones, stats.rejected = resume.records, resume.tombstones, resume.rejected
    writer = StagingWriter(conn, run, max_record_bytes=max_record_bytes(adapter), max_run_bytes=max_run_bytes(adapter),
                           progress=stats,
                           seq=resume.last_seq if resume else 0, attempt=attempt)
    try:
        source(window, writer, stats)
    except BaseException as exc:  # Airflow's task timeout is a BaseException: it ends the try too
        record_failed_try(conn, exc, lambda e: fail_run(conn, run, _one_line(e), attempt,
                                                    "waiting" if isinstance(e, PartnerAsksToWait) else "failed"))
        raise
    finish_harvest(conn, run, stats, attempt)
    for check in stats.checks:  # second witnesses the adapter ran (I12)
        record_check(conn, run, *check, attempt=attempt)
    if stats.complete_list_size is not None and stats.complete_list_size != stats.fetched:
        log.warning(
            "%s: the repository announced completeListSize=%d but %d items were fetched",
            partner_id, stats.complete_list_size, stats.fetched,
        )
    log.info(
        "%s: %s channel of %s: %d pages, %d fetched (%d records, %d deleted, %d rejected), %d restarts",
        partner_id, run.channel, window.describe(), stats.pages, stats.fetched, stats.records,
        stats.tombstones, stats.rejected, stats.restarts,
    )
    return stats


# -- slices ---------------------------------------------------------------------

WHOLE = {"channel": slices.PARENT}  # the plan of a run that is not sliced: one piece, the window (XCom)
# Pieces asked of the adapter per lane, merged into slices of falling size: the lanes start on
# the big ones and end on small ones, so they finish within about one small slice of each other.
PIECES_PER_LANE = 8
# Never pieces smaller than this (by target_records): each slice ends in a part-filled page and
# its own transactions; 5,000 records are ten pages of 500, two seconds at 200 ms a page.
MIN_PIECE_RECORDS = 5_000


def lanes_of(partner: Any, settings: SliceSettings) -> int:
    """How many slices of a run harvest at once: the partner's pool (its concurrent
    requests), at most ``max_slices``."""
    return max(1, min(settings.max_slices, partner.pool_slots))


def plan_slices(
    adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, window: Window,
    settings: SliceSettings,
) -> list[Slice]:
    """Decide whether the run is harvested whole or as slices, and record the plan.

    Returns the slices planned (none: the window stays whole, the unsliced path), each with
    its channel ``changes/00N``, numbered biggest first (the order lanes take them in);
    :func:`pieces` turns them into the lanes the mapped harvest task runs. With more than one
    lane the adapter cuts up to ``PIECES_PER_LANE`` times finer (pieces of at least
    ``MIN_PIECE_RECORDS`` by ``target_records``) and :func:`graded` joins neighbouring pieces
    into slices of falling size. The slices' rows are written
    ``planned`` in one transaction, so the apply refuses until every one of them harvested (I4).
    """
    ensure_schema(conn)
    lanes = lanes_of(adapter.partner, settings)
    finer = max(1, min(PIECES_PER_LANE, settings.target_records // MIN_PIECE_RECORDS)) if lanes > 1 else 1
    asked = settings if finer == 1 else settings.model_copy(update={
        "max_slices": min(settings.max_slices * finer, 256),
        "target_records": max(1, settings.target_records // finer),
        "without_count": min(settings.without_count * finer, 256) if settings.without_count > 1 else 1})
    planned = list(adapter.plan_slices(window, asked))
    if len(planned) < 2:
        planned = []
    joined = graded(planned, lanes) if finer > 1 else planned
    bounds = [p.model_copy(update={"channel": slices.slice_channel(i + 1)}) for i, p in enumerate(joined)]
    slices.write_plan(conn, partner_id, run_id, window, window.protocol.metadata_prefix, bounds)
    if bounds:
        log.info("%s: %s harvested as %d slices in %d lanes: %s", partner_id, window.describe(), len(bounds),
                 min(lanes, len(bounds)), "; ".join(_describe_slice(b) for b in bounds))
    return bounds


def graded(pieces: list[Slice], lanes: int) -> list[Slice]:
    """Neighbouring pieces joined into slices of falling size, biggest first: each round
    gives every lane a slice of about half of what is left per lane (32 pieces, 4 lanes:
    4 slices of 4 pieces, 4 of 2, 8 of 1). Pieces of different sets are never joined. The
    lanes take them in this order, so the lanes free first take the bigger ones left."""
    sizes: list[int] = []
    left = len(pieces)
    while left > 0:
        size = max(1, -(-left // (2 * lanes)))
        for _ in range(lanes if size > 1 else left):
            if left == 0:
                break
            sizes.append(min(size, left))
            left -= sizes[-1]
    joined: list[tuple[Slice, int]] = []  # (slice, pieces in it)
    at = 0
    for size in sizes:
        group = pieces[at:at + size]
        at += size
        runs = [[group[0]]]
        for piece in group[1:]:
            if piece.set_spec == runs[-1][-1].set_spec:
                runs[-1].append(piece)
            else:
                runs.append([piece])
        joined.extend((_join(run), len(run)) for run in runs)
    # biggest first: by estimate where every slice has one, else by the pieces joined; of
    # equals, an unbounded slice first (it holds at least its estimate); stable otherwise
    counted = all(s.estimate is not None for s, _ in joined)
    joined.sort(key=lambda pair: (-(pair[0].estimate or 0) if counted else -pair[1], not pair[0].unbounded))
    return [s for s, _ in joined]


def _join(run: list[Slice]) -> Slice:
    """Neighbouring pieces of one list as one slice: from the first's start to the last's end."""
    first, last = run[0], run[-1]
    if len(run) == 1:
        return first
    estimates = [p.estimate for p in run]
    return first.model_copy(update={
        "until": last.until, "hi": last.hi, "open_end": last.open_end,
        "estimate": None if None in estimates else sum(e for e in estimates if e is not None),
        "pages": tuple(page for p in run for page in p.pages),
        "page_items": tuple(n for p in run for n in p.page_items)})


def pieces(planned: list[Slice], lanes: int = 1) -> list[dict[str, Any]]:
    """What the mapped harvest task runs over, as JSON (XCom): ``[{"channel": "changes"}]``
    for a window that stays whole, else one lane each (``{"lane": n, "lanes": m, "slices": k}``),
    at most one per slice."""
    if not planned:
        return [dict(WHOLE)]
    count = max(1, min(lanes, len(planned)))
    return [{"lane": n, "lanes": count, "slices": len(planned)} for n in range(1, count + 1)]


def _describe_slice(bounds: Slice) -> str:
    if bounds.pages:
        return f"{bounds.channel} pages {bounds.lo}..{bounds.hi} (~{bounds.estimate} activities)"
    if bounds.lo is not None:
        return f"{bounds.channel} ids {bounds.lo}..{bounds.hi}"
    start = format_instant(bounds.from_) if bounds.from_ else "the beginning"
    where = f"{start}..{format_instant(bounds.until)}"
    if bounds.set_spec is not None:  # a set, whole or a range of it
        where = f"set {bounds.set_spec} {where}"
    return f"{bounds.channel} {where}" + (f" (~{bounds.estimate})" if bounds.estimate is not None else "")


def slice_window(window: Window, bounds: Slice, resume_at: int | None = None) -> Window:
    """The sub-window one slice harvests: its own range, the run's frozen facts."""
    piece = bounds.model_copy(update={"resume_at": resume_at,
                                      "of_full": window.is_full})  # a slice of a full harvest proves its own range (I12)
    return replace(window, from_=bounds.from_, until=bounds.until, protocol=window.protocol.with_(slice=piece))


def harvest_piece(
    adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, window: Window, channel: str,
) -> HarvestStats:
    """Harvest one piece of the plan: the whole window (``changes``) or one slice.

    A slice reads its bounds from harvest_runs (so a reharvest after lost staging needs
    nothing else), clears and re-stages only its own channel, except that a Sierra slice
    interrupted mid-way resumes from its checkpoint when staging still holds what it
    counted (store/slices.resumable), as does an IIIF slice (at its next page). OAI slices
    restart from their own start: a token cannot be resumed after its session died.
    """
    run = RunRef(partner_id, run_id, channel)
    if not slices.is_slice(channel):
        whole = slices.resumable(conn, run) if adapter.resumes_window else None
        if whole is None:
            return harvest_window(adapter, conn, run, window)
        log.info("%s: the window resumes at its checkpoint %d with %d items already staged",
                 partner_id, whole.checkpoint, whole.fetched)
        return _stage(adapter, adapter.harvest, conn, run, window.with_facts(resume_at=whole.checkpoint),
                      resume=whole)
    ensure_schema(conn)
    bounds = slices.read_bounds(conn, run)
    resume = slices.resumable(conn, run) if adapter.resumes_slices else None
    if resume is not None:
        log.info("%s: slice %s resumes at its checkpoint %d with %d items already staged",
                 partner_id, channel, resume.checkpoint, resume.fetched)
    sub = slice_window(window, bounds, resume.checkpoint if resume else None)
    return _stage(adapter, adapter.harvest, conn, run, sub, resume=resume)


def harvest_lane(
    adapter: Adapter, conn: psycopg.Connection, partner_id: str, run_id: str, window: Window, lane: int,
    on_slice: Callable[[str, HarvestStats], None] | None = None,
    merging: Callable[[], psycopg.Connection] | None = None,
) -> list[str]:
    """One lane of a sliced run: slice after slice (store/slices.claim: its own unfinished
    one first, then the biggest nobody took), each harvested as :func:`harvest_piece` does
    and merged into the run's batch as it ends (store/run_batch.py), until none is left.
    A lane that finishes early takes what would have kept another waiting: the lanes end
    together. With ``merging`` (a fenced connection of its own), a slice's merge runs on a
    thread beside the next slice's harvest, which mostly waits on the partner. Returns the
    channels it harvested; ``on_slice(channel, stats)`` after each."""
    done: list[str] = []
    with _Merges(conn, merging) as merges:
        while (channel := slices.claim(conn, partner_id, run_id, lane)) is not None:
            stats = harvest_piece(adapter, conn, partner_id, run_id, window, channel)
            merges.add(RunRef(partner_id, run_id, channel))
            done.append(channel)
            if on_slice is not None:
                on_slice(channel, stats)
    if done:
        run_batch.analyze(conn, partner_id, run_id)
    log.info("%s: lane %d of run %s harvested %s", partner_id, lane, run_id, ", ".join(done) or "no slice (none left)")
    return done


class _Merges:
    """A lane's merges: on the lane's own connection, one after the other; or, given a
    connection of their own, on a thread of their own, at most one at a time, each beside
    the next slice's harvest. Leaving waits for the last one; a merge's error is raised."""

    def __init__(self, conn: psycopg.Connection, own: Callable[[], psycopg.Connection] | None) -> None:
        self.conn, self.own = conn, own
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future[int] | None = None
        self.merging: psycopg.Connection | None = None

    def __enter__(self) -> _Merges:
        if self.own is not None:
            self.merging = self.own()
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="lane-merge")
        return self

    def add(self, run: RunRef) -> None:
        if self.pool is None or self.merging is None:
            run_batch.merge(self.conn, run)
            return
        self._wait()
        self.pending = self.pool.submit(run_batch.merge, self.merging, run)

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._wait()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            if self.merging is not None:
                self.merging.close()


def stage_unlisted(conn: psycopg.Connection, partner_id: str, run_id: str, window: Window) -> int | None:
    """A run whose changes list the partner's whole collection (``whole_list_at``: a file
    partner's full dump): the held records none of its pieces staged become tombstones in a
    channel of their own (``not_listed``), as the reconcile stages what vanished. Staged again
    before every try of the apply; None for any other run."""
    at = window.protocol.whole_list_at
    if at is None:
        return None
    ensure_schema(conn)
    if not holds_any(conn, partner_id):  # a first load: nothing held, nothing to compare
        return 0
    run = RunRef(partner_id, run_id, NOT_LISTED)
    attempt = begin_run(conn, run, window, window.protocol.metadata_prefix)
    staged = stage_not_listed(conn, run, at, attempt)
    finish_harvest(conn, run, HarvestStats(pages=1, fetched=staged, tombstones=staged), attempt)
    if staged:
        log.info("%s: %d held records stamped no later than %s are not in the run's whole list: staged for the "
                 "purge (reason %s)", partner_id, staged, format_instant(at), NOT_LISTED)
    return staged


def max_record_bytes(adapter: Adapter) -> int:
    """The partner's payload limit (registry ``options.limits.max_record_bytes``)."""
    return adapter.partner.options.limits.max_record_bytes


def max_run_bytes(adapter: Adapter) -> int:
    """What one run may stage (registry ``options.limits.max_run_bytes``)."""
    return adapter.partner.options.limits.max_run_bytes


def apply_changes(
    conn: psycopg.Connection, partner_id: str, run_id: str,
    reharvest: Callable[[list[str]], None] | None = None,
) -> ApplyResult:
    """Merge the run's staging into the live tables in one transaction.

    When staging no longer holds what the harvest recorded (the database lost it), the
    channels named are harvested again through ``reharvest`` (the same frozen window),
    then applied; without ``reharvest`` the apply fails and nothing moves.
    """
    ensure_schema(conn)
    try:
        try:
            return apply_run(conn, partner_id, run_id)
        except StagingIncomplete as lost:
            conn.rollback()
            if reharvest is None:
                raise
            channels = sorted(lost.channels)
            log.warning("%s: %s; harvesting channel(s) %s of the frozen window again",
                        partner_id, lost.cause, ", ".join(channels))
            reharvest(channels)
            return apply_run(conn, partner_id, run_id)
    except BaseException as exc:  # Airflow's task timeout is a BaseException: it ends the try too
        record_failed_try(conn, exc, lambda e: fail_apply(conn, partner_id, run_id, _one_line(e)))
        raise


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, HarvestError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())
