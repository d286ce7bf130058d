"""The Sierra adapter: change poll, separate deletion poll, and the MARC export full load.

Ordering of a deletion against edits: ``deletedDate`` is a day, so a tombstone is stamped
at the last microsecond of that day (D 23:59:59.999999Z). Sierra stamps versions in whole
seconds, so it beats every edit stamped on D or earlier (ties are impossible) and loses to
a version stamped D+1 or later (a record re-created later).

Full load: the ``bibs/marc`` export, keyset over id blocks; then the JSON API's list of
live ids is the second witness (I12), and the bibs the export left out are fetched.

Suppressed bibs (``options.sierra.suppressed``): ``purge`` (the default) holds only public
bibs: one the change poll shows suppressed is a deletion with reason ``suppressed``, the
full load turns the suppressed ids of its range (listed first, ``suppressed=true``) into
deletions, and its witness and the reconcile count public bibs only. ``flag`` holds them
carrying the warning ``sierra.suppressed``; ``keep`` holds them as any bib. A bib the API
lists without MARC (deleted in Sierra, still listed) is a deletion with reason ``no_marc``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from datetime import time as dtime
from typing import Any, NamedTuple, TypeVar

from partner_harvest import durations
from partner_harvest.adapters import Adapter, IdSink, ItemSink, PartnerClock, StagingSink, SweptId
from partner_harvest.errors import ConfigurationError, HarvestError, HarvestLoopError, PartnerAsksToWait
from partner_harvest.formats.checks import Finding, policy_of
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.registry import Partner, SliceSettings
from partner_harvest.sierra import marc, resume
from partner_harvest.sierra.client import (
    EXPORT_FAILED,
    MAX_LIMIT,
    ExportBlock,
    RateLimited,
    SierraClient,
    SierraServerError,
    _id_range,
)
from partner_harvest.store import completeness, record_check
from partner_harvest.window import SECONDS, ChannelPlan, Slice, SliceFacts, Window, format_instant

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_FIELDS = ("id", "updatedDate", "createdDate", "deleted", "suppressed", "marc")
REQUIRED_FIELDS = ("id", "updatedDate", "marc")
DELETION_FIELDS = "id,deletedDate"
EXPORT_SIZE_CEILING = 99_999
TRUNCATION_SUSPECT = 0.95  # records this close to the ceiling may have lost their tail
# Record numbers have no fixed width: 7 digits on most catalogues, 8 on large ones
# (907 $a ".b116512684"). Nothing here assumes a highest id: the export ends on 404/107
# or an empty block, and the slice plan probes upwards for the highest id.
CHECK_KIND = "sierra-id-enumeration"
MISSING_BATCH = 500  # missing ids read back from PostgreSQL at a time (fetched 25 per request)
_RAW_907 = re.compile(rb"\x1fa\.b(\d+)[\dx]", re.IGNORECASE)
SUPPRESSED = "suppressed"  # deletions.reason: the bib became suppressed (options.sierra.suppressed: purge)
NO_MARC = "no_marc"  # deletions.reason: the API lists the bib without MARC (deleted, still listed)
FLAGGED = Finding("sierra.suppressed", "the bib is suppressed in the catalogue (not public)")


def sierra_timestamp(value: datetime) -> str:
    """Sierra wants Z-suffixed UTC timestamps in date ranges."""
    return format_instant(value)


def parse_sierra_timestamp(text: str) -> datetime:
    return datetime.strptime(text.strip().replace("Z", ""), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def _midnight(day: date) -> datetime:
    """A day as the instant a day-granular channel window carries."""
    return datetime.combine(day, dtime(0), tzinfo=timezone.utc)


def end_of_day(day: date) -> datetime:
    """A deletion on `day` sorts after every whole-second version of that day, before D+1."""
    return datetime.combine(day, dtime(23, 59, 59, 999_999), tzinfo=timezone.utc)


class SierraAdapter(Adapter):
    """Harvests one Sierra catalogue through a :class:`SierraClient`."""

    extra_channels = ("deletions",)  # the deletion poll, on its own day cursor

    fetch_chunk = 25  # ids per bibs?id=a,b,c request: long id lists fail on real servers
    isolated_bibs = 0  # bibs the export could not build (code 135), fetched or quarantined one by one

    def __init__(self, partner: Partner, client: SierraClient, *, sleep: Callable[[float], None] = time.sleep):
        super().__init__(partner)
        self.client = client
        self.sleep = sleep
        self.validation = policy_of(partner.options.validation)
        self.suppressed = partner.options.sierra.suppressed
        self.fields = tuple(partner.fields) or DEFAULT_FIELDS
        if self.suppressed != "keep" and "suppressed" not in self.fields:
            self.fields = (*self.fields, "suppressed")  # the poll must say which bibs are suppressed
        self._suppressed_ids = array("q")  # a full load's suppressed ids of its range, ascending
        missing = [f for f in REQUIRED_FIELDS if f not in self.fields]
        if missing:
            raise ConfigurationError(partner.id, "registry", f"'fields' must include {', '.join(missing)}")
        export = partner.options.export
        # Above Sierra's 2000 the client pages at 2000: the loop never compares with the limit.
        self.export_limit = export.limit or partner.page_size
        self.rate_limit_wait = export.rate_limit_wait
        self.max_rate_limit_waits = export.max_rate_limit_waits
        self.max_sleep_seconds = export.max_sleep_seconds
        self.now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
        # Extra export query parameters (mapping, locations...) come ONLY from options.export.params
        # (the registry refuses the keyset's own: registry.RESERVED_EXPORT_PARAMS).
        self.export_params = {str(k): str(v) for k, v in export.params.items()}

    # -- window ----------------------------------------------------------------------

    def clock(self) -> PartnerClock:
        now = self.client.server_time()
        log.info("%s: Sierra server clock %s", self.partner_id, format_instant(now))
        return PartnerClock(now=now, granularity=SECONDS, protocol={"fields": ",".join(self.fields)})

    def plan_channels(self, window: Window, cursors: dict[str, datetime | None]) -> dict[str, ChannelPlan]:
        """The deletion poll's own day window: from its day cursor minus the overlap."""
        overlap = timedelta(days=self.partner.deletion_overlap_days)
        until_day = window.until.date()
        cursor = cursors.get("deletions")
        if window.mode == "window" and window.from_ is not None:
            start = window.from_.date() - overlap
        elif cursor is not None:
            start = cursor.date() - overlap
        elif window.from_ is not None:
            start = window.from_.date() - overlap
        else:
            # A full load from scratch: the export is the live set; deletions start tomorrow.
            return {"deletions": ChannelPlan(until=_midnight(until_day), skip=True)}
        start = min(start, until_day)
        return {"deletions": ChannelPlan(from_=_midnight(start), until=_midnight(until_day))}

    # -- slices ----------------------------------------------------------------------

    def plan_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """A full load: export id ranges over the span of bib ids; a long change poll:
        updatedDate ranges of ``long_window`` each. [] keeps the run whole."""
        if settings.max_slices < 2:
            return []
        if window.is_full:
            return self._id_slices(window, settings)
        if window.from_ is not None and window.until - window.from_ > settings.long_window:
            return _time_slices(window, settings)
        return []

    def _first_id_from(self, start: int) -> int | None:
        body = self.client.get_json("/bibs", {"fields": "id", "limit": 1, "id": f"[{start},]"}, empty_ok=True)
        entries = (body or {}).get("entries") or []
        try:
            return int(entries[0]["id"]) if entries else None
        except (KeyError, TypeError, ValueError):
            return None

    def _id_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """Equal id ranges: Sierra record numbers are handed out in sequence, so an id range
        holds about as many bibs as it is wide. The span comes from ``fields=id&limit=1``
        probes: the lowest id, then the highest: doubling steps up until no id lies above
        (ids have no fixed width), then bisection (about 2 x log2(span) requests)."""
        low = self._first_id_from(0)
        above = None if low is None else self._first_id_from(low + settings.threshold_records)
        if low is None or above is None:
            return []  # no id that far above the lowest: small enough to stay whole (two requests)
        high, probes = self._highest_id(above, max(1, settings.threshold_records))
        probes += 2
        span = high - low + 1
        count = min(settings.max_slices, math.ceil(span / settings.target_records))
        log.info("%s: bib ids %d..%d (span %d, %d probes)", self.partner_id, low, high, span, probes)
        if span <= settings.threshold_records or count < 2:
            return []
        size = math.ceil(span / count)
        pieces: list[Slice] = []
        for index in range(count):
            lo = 0 if index == 0 else low + index * size
            hi = None if index == count - 1 else low + (index + 1) * size - 1  # the last one is open-ended
            pieces.append(Slice(until=window.until, lo=lo, hi=hi, estimate=size))
        return pieces

    def _highest_id(self, high: int, step: int) -> tuple[int, int]:
        """The highest bib id, given one that exists: doubling steps up until no id lies above
        (ids have no fixed width), then bisection. Returns it and the probes it took."""
        probes = 0
        while True:  # an id exists at or above ``high``: find a probe with none above it
            found = self._first_id_from(high + step)
            probes += 1
            if found is None:
                top = high + step - 1
                break
            high, step = found, step * 2
        while high < top:
            mid = (high + top + 1) // 2
            found = self._first_id_from(mid)
            probes += 1
            if found is None:
                top = mid - 1
            else:
                high = found
        return high, probes

    # -- changes ---------------------------------------------------------------------

    # A slice (window.protocol.slice) writes its keyset position with every page and,
    # retried, resumes from it (``resume_at``) keeping what it staged (pipeline.harvest_piece).
    resumes_slices = True

    @contextmanager
    def _rate_limit_frees_the_slot(self) -> Iterator[None]:
        """A rate limit outside the export loop (a poll, the id enumeration) reschedules too.

        The transport leaves Sierra's 429 to the client, so no request sleeps its
        Retry-After; here the task gives its slot back for the wait the server named.
        """
        try:
            yield
        except RateLimited as exc:
            wait = exc.retry_after if exc.retry_after is not None else self.rate_limit_wait
            raise PartnerAsksToWait(self.partner_id, exc.request, f"rate limited: {exc.cause}",
                                    self.now() + timedelta(seconds=wait)) from exc

    def harvest(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        piece = window.protocol.slice
        with self._rate_limit_frees_the_slot():
            if window.is_full:
                self._export_full_load(window, sink, stats, piece)
            else:
                self._change_poll(window, sink, stats, piece)

    def _change_poll(self, window: Window, sink: ItemSink, stats: HarvestStats, piece: SliceFacts | None = None) -> None:
        assert window.from_ is not None
        params = {
            "deleted": "false",
            "updatedDate": f"[{sierra_timestamp(window.from_)},{sierra_timestamp(window.until)}]",
            "fields": ",".join(self.fields),
        }
        start = (piece.resume_at or 0) if piece is not None else 0
        if piece is not None and start:
            log.info("%s: slice %s resumes its change poll at id %d", self.partner_id, piece.channel, start)
        for entries in self.client.bib_pages(params, self.partner.page_size, start_id=start):
            items = [self._entry_to_item(entry, window.until) for entry in entries]
            self._write(items, sink, stats, "changes", checkpoint=_after_last(entries) if piece is not None else None)

    def _entry_to_item(self, entry: dict[str, Any], fallback: datetime | None = None) -> HarvestItem:
        """One ``GET bibs`` entry as a record, deletion or reject.

        A bib is identified by its ``id``. An entry without a usable ``updatedDate``
        (recorded sandbox answers omit it) is stamped with its MARC's 005, else with
        ``fallback`` (the window's until), as an export record without 005 is.
        """
        bib_id = str(entry.get("id", "")).strip() or "(missing id)"
        if entry.get("deleted") is True:
            # Older Sierra versions return deleted stubs (id, deleted, deletedDate) here.
            return self._tombstone(entry, bib_id)
        fallback = fallback or self.now()
        try:
            updated: datetime | None = parse_sierra_timestamp(str(entry["updatedDate"]))
        except (KeyError, ValueError):
            updated = None
        if entry.get("suppressed") is True and self.suppressed == "purge":
            return Tombstone(bib_id, updated or fallback, SUPPRESSED)
        if not entry.get("marc"):
            unasked = sorted(set(entry) - set(self.fields))
            if unasked:  # an answer of other fields than asked (recorded servers do): nothing says the MARC is gone
                return Rejected(bib_id, f"bib without its 'marc' field, in an answer of fields not asked for "
                                f"({', '.join(unasked[:6])})", _json(entry), updated or fallback, marc.PREFIX)
            # Asked for and absent: deleted in Sierra but still listed. What was held of it must not stay.
            log.warning("%s: bib %s is listed without MARC: a deletion (no_marc)", self.partner_id, bib_id)
            return Tombstone(bib_id, updated or fallback, NO_MARC)
        try:
            record = marc.from_marc_json(entry["marc"])
        except Exception as exc:
            return Rejected(bib_id, f"MARC-in-JSON unreadable: {type(exc).__name__}: {exc}", _json(entry),
                            updated or fallback, marc.PREFIX)
        item = marc.to_item(record, bib_id, updated or marc.stamp_of(record) or fallback, self.validation)
        return self._flagged(item) if entry.get("suppressed") is True else item

    def _flagged(self, item: HarvestItem) -> HarvestItem:
        """A suppressed bib's record with ``suppressed: flag``: it carries the warning."""
        if self.suppressed == "flag" and isinstance(item, Record):
            return replace(item, warnings=(*item.warnings, FLAGGED))
        return item

    def _public_only(self, params: dict[str, Any]) -> dict[str, Any]:
        """A listing of live ids: with ``purge``, of public bibs only (suppressed ones are not held)."""
        return {**params, "suppressed": "false"} if self.suppressed == "purge" else params

    def _list_suppressed(self, start: int, end: int | None) -> array[int]:
        """The suppressed live ids of a full load's range, ascending (8 bytes each): the export
        does not say which bibs are suppressed."""
        ids = array("q")
        if self.suppressed == "keep":
            return ids
        for entries in self.client.bib_pages({"suppressed": "true", "deleted": "false", "fields": "id"}, MAX_LIMIT,
                                             start_id=start, end_id=end):
            ids.extend(int(e["id"]) for e in entries if str(e.get("id", "")).isdigit())
        log.info("%s: %d suppressed bibs in the full load's range (options.sierra.suppressed: %s)",
                 self.partner_id, len(ids), self.suppressed)
        return ids

    def _exported(self, item: HarvestItem, bib_id: str, stamp: datetime) -> HarvestItem:
        """An exported bib as the partner's suppression choice has it."""
        ids = self._suppressed_ids
        at = bisect_left(ids, int(bib_id)) if bib_id.isdigit() else len(ids)
        if at == len(ids) or ids[at] != int(bib_id):
            return item
        if self.suppressed == "purge":
            return Tombstone(bib_id, stamp, SUPPRESSED)
        return self._flagged(item)

    def _tombstone(self, entry: dict[str, Any], bib_id: str) -> HarvestItem:
        try:
            day = date.fromisoformat(str(entry["deletedDate"])[:10])
        except (KeyError, ValueError):
            return Rejected(bib_id, f"deleted bib without a usable deletedDate: {entry.get('deletedDate')!r}", _json(entry))
        return Tombstone(bib_id, end_of_day(day))

    # -- deletions -------------------------------------------------------------------

    def poll_deletions(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        with self._rate_limit_frees_the_slot():
            self._poll_deletions(window, sink, stats)

    def _poll_deletions(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        plan = window.protocol.channels.get("deletions")
        if plan is None or plan.skip or plan.from_ is None:
            log.info("%s: no deletion poll for this window (full load from scratch)", self.partner_id)
            return
        days = f"[{plan.from_.date().isoformat()},{plan.until.date().isoformat()}]"
        params = {"deleted": "true", "deletedDate": days, "fields": DELETION_FIELDS}
        for entries in self.client.bib_pages(params, self.partner.page_size):
            items = [self._tombstone(entry, str(entry.get("id", "")).strip() or "(missing id)") for entry in entries]
            self._write(items, sink, stats, "deletions")

    # -- full load -------------------------------------------------------------------

    def _export_full_load(self, window: Window, sink: ItemSink, stats: HarvestStats,
                          piece: SliceFacts | None = None) -> None:
        """The export, then the proof that it delivered every live bib (of the slice's ids).

        A slice resumes at its checkpoint (``resume_at``, pipeline.harvest_piece). An unsliced
        try that follows a rescheduled (rate-limited) or killed one finds that try's staging
        kept (pipeline ``resumes_staging``) and resumes after its highest staged id.
        """
        if piece is not None:
            start = piece.resume_at or piece.lo or 0
            if piece.resume_at:
                log.info("%s: slice %s resumes its export at id %d", self.partner_id, piece.channel, start)
        else:
            start = self._resume_point(sink, stats)
            stats.expected = self._expected_bibs()
        if piece is not None and piece.estimate is not None:
            stats.expected = piece.estimate  # the plan's id span, already in harvest_runs
        self._suppressed_ids = self._list_suppressed(start, piece.hi if piece is not None else None)
        self._progress_since = (time.monotonic(), stats.fetched)  # the time left counts this try's rate
        self._export(window, sink, stats, start, piece)
        self._prove_complete(window, sink, stats, piece)

    def _expected_bibs(self) -> int | None:
        """About how many items an unsliced full load brings, for its progress and time left only.

        Sierra's ``total`` is the size of one page, not of the result set, so the estimate is
        the span of bib ids (``fields=id&limit=1`` probes: the lowest id, then the highest,
        about 2 x log2(span) requests): record numbers are handed out in sequence, so it is
        an upper bound (deleted ids count). The export never stops on it: it ends on 404/107
        or an empty block. A probe that fails leaves the load without an estimate.
        """
        try:
            low = self._first_id_from(0)
            if low is None:
                return None
            high, probes = self._highest_id(low, max(1, self.export_limit))
        except HarvestError as exc:
            log.warning("%s: no estimate of the full load's size (the id probe failed: %s); its progress shows "
                        "no time left", self.partner_id, exc)
            return None
        span = high - low + 1
        log.info("%s: full load expects about %d bibs: an estimate from the id range %d..%d (%d probes; an upper "
                 "bound, deleted ids count; Sierra's total counts only a page), for the progress and the time "
                 "left, never to end the export", self.partner_id, span, low, high, probes + 1)
        return span

    def resumes_staging(self, channel: str, window: Window) -> bool:
        """Whether a new try of this channel keeps what an unfinished try staged (pipeline).

        Only the unsliced full load: a slice resumes from its own checkpoint."""
        return channel == "changes" and window.is_full and window.protocol.slice is None

    def _resume_point(self, sink: ItemSink, stats: HarvestStats) -> int:
        conn, run = getattr(sink, "conn", None), getattr(sink, "run", None)
        if conn is None or run is None:
            return 0
        kept = resume.staged_so_far(conn, run)
        if kept.count == 0:
            return 0
        stats.fetched += kept.count
        stats.records += kept.records
        stats.tombstones += kept.tombstones
        stats.rejected += kept.rejected
        if hasattr(sink, "seq"):
            sink.seq = max(sink.seq, kept.max_seq)
        start = (kept.max_id + 1) if kept.max_id is not None else 0
        log.info("%s: resuming the export at id %d: an earlier try of this run staged %d items (up to bib %s)",
                 self.partner_id, start, kept.count, kept.max_id)
        return start

    def _export(self, window: Window, sink: ItemSink, stats: HarvestStats, start: int = 0,
                piece: SliceFacts | None = None) -> None:
        """Keyset over id blocks through the two-phase export (up to a slice's ``hi``); one block fetched ahead.

        A block is the lowest ids from the cursor, deleted ones included: ``inputRecords``
        counts them, ``outputRecords`` does not. Every id in [cursor, cursor + inputRecords)
        that exists was in the block, so the next block starts at
        max(cursor + inputRecords, highest exported id + 1): a block of deleted (or
        omitted suppressed) bibs moves on, and the cursor strictly rises. The export ends
        only on 404/107 or an empty block.

        Once a block's ids are decoded its successor is requested from a second thread
        while this block is validated and copied into staging (the server builds the next
        file meanwhile); at most one block is ahead. Not when a block must be re-fetched
        record by record (the session then serves those requests alone). The COPY of a
        block runs in a third thread while the next block is decoded: blocks are copied
        in order, one at a time, each in its own transaction, so what is staged is always
        a prefix of the export (a rescheduled try resumes after it).
        """
        end_id = piece.hi if piece is not None else None  # an id slice: [lo, hi]; else open-ended
        last = end_id
        cursor = start
        waits = 0
        blocks = 0
        limit = self.export_limit  # smaller while a block that fails with code 135 is bisected
        failing: _Failing | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"export-{self.partner_id}") as ahead, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"staging-{self.partner_id}") as copier:
            pending: Future[ExportBlock | None] | None = None
            writing: Future[None] | None = None  # the previous block's COPY, in order, one at a time
            while last is None or cursor <= last:
                try:
                    if pending is not None:
                        block, pending = pending.result(), None
                    else:
                        block = self.client.export_block(cursor, limit, self.export_params, end_id=end_id,
                                                         tries=1 if failing else None)
                except RateLimited as exc:
                    pending = None
                    waits += 1
                    self._wait_for_rate_limit(exc, cursor, waits)
                    continue
                except SierraServerError as exc:
                    pending = None
                    if exc.code != EXPORT_FAILED:
                        raise
                    if limit > 1:  # bisect: the lower half of the block first
                        if failing is None:
                            failing = _Failing(limit)
                            log.warning("%s: export block from id %d (limit %d) fails with code 135 on every try; "
                                        "bisecting it to isolate the bib(s) bib2Marc cannot export: %s",
                                        self.partner_id, cursor, limit, exc.cause)
                        limit //= 2
                        continue
                    items, after = self._isolate(cursor, end_id, exc, window)
                    if after is None:
                        _finish(writing)
                        log.info("%s: export ends at id %d (no ids left after a failing block)", self.partner_id, cursor)
                        return
                    if writing is not None:
                        done, writing = writing, None
                        done.result()
                    if items or piece is not None:
                        writing = copier.submit(self._write, items, sink, stats, "isolated bib",
                                                checkpoint=after if piece is not None else None)
                    self.isolated_bibs += 1
                    cursor, limit, failing = after, self.export_limit, None
                    continue
                if block is None:
                    _finish(writing)
                    log.info("%s: export ends at id %d (404/107: no ids left) after %d blocks", self.partner_id, cursor, blocks)
                    return
                blocks += 1
                decoded, last_id = self._decode_block(block)
                covered = block.input_records
                if covered is None:  # a summary without inputRecords: only what came is known
                    covered = block.output_records
                if covered == 0 and last_id is None:
                    _finish(writing)
                    log.info("%s: export ends at id %d (empty block) after %d blocks", self.partner_id, cursor, blocks)
                    return
                next_cursor = max(cursor + covered, last_id + 1 if last_id is not None else 0)
                if next_cursor <= cursor:
                    raise HarvestLoopError(self.partner_id, f"GET bibs/marc?id=[{cursor},]",
                                           f"export ids did not ascend (highest id {last_id}, inputRecords {covered})")
                if failing is not None:  # past the whole block that failed: it was not one bib's fault
                    failing.covered += covered
                    if failing.covered >= failing.limit:
                        limit, failing = self.export_limit, None
                if failing is None and not block.errors and (last is None or next_cursor <= last):
                    pending = ahead.submit(self.client.export_block, next_cursor, self.export_limit, self.export_params,
                                           end_id=end_id)
                items = self._items(decoded, block, window, cursor)
                if writing is not None:
                    done, writing = writing, None
                    done.result()  # a failed COPY fails the export here
                if items or piece is not None:  # a slice stores its checkpoint with every block, even an empty one
                    writing = copier.submit(self._write, items, sink, stats, "export",
                                            checkpoint=next_cursor if piece is not None else None)
                if block.output_records < covered:
                    log.info("%s: export block from id %d: %d ids in, %d records out (%s deleted)", self.partner_id,
                             cursor, covered, block.output_records, block.deleted_records)
                cursor = next_cursor
            _finish(writing)

    def _isolate(self, cursor: int, end_id: Any, failure: SierraServerError,
                 window: Window) -> tuple[list[HarvestItem], int | None]:
        """The one bib a block of ``limit=1`` from ``cursor`` covers, fetched without the export.

        bib2Marc fails on it (code 135) however small the block: its id comes from
        ``GET bibs?id=[cursor,]&limit=1``, the bib through ``GET bibs`` (MARC-in-JSON);
        if that fails too, it is quarantined by id with both servers' errors. Returns the
        items and the cursor after the bib (None: no id left from ``cursor``).
        """
        probe = self.client.get_json("/bibs", {"id": _id_range(cursor, end_id), "limit": 1, "fields": "id,deleted"},
                                     empty_ok=True)
        entries = (probe or {}).get("entries") or []
        if not entries:
            return [], None
        bib_id = str(entries[0].get("id", "")).strip()
        if not bib_id.isdigit() or int(bib_id) < cursor:
            raise HarvestLoopError(self.partner_id, f"GET bibs?id=[{cursor},]&limit=1",
                                   f"the lowest id from {cursor} is {bib_id!r}")
        after = int(bib_id) + 1
        if entries[0].get("deleted") is True:
            return [], after  # a deleted bib is not in any export; the deletion poll or purge handles it
        try:
            items = self.fetch_records(window, [bib_id])
        except RateLimited:
            raise
        except HarvestError as exc:
            reason = (f"bibs/marc cannot export this bib ({failure.cause}) and GET bibs failed too: {exc.cause}")
            log.error("%s: bib %s quarantined: %s", self.partner_id, bib_id, reason)
            return [Rejected(bib_id, reason, "", window.until, marc.PREFIX)], after
        log.warning("%s: bib %s is one bibs/marc cannot export (code 135); fetched it through GET bibs "
                    "(%d item(s)); the export goes on at id %d", self.partner_id, bib_id, len(items), after)
        return items, after

    def _wait_for_rate_limit(self, exc: RateLimited, cursor: int, waits: int) -> None:
        """A short wait sleeps here; a longer one gives the worker slot back (PartnerAsksToWait).

        The wait is the one the server names (Retry-After, "try again in N minutes"), else
        ``options.export.rate_limit_wait``. Up to ``options.export.max_sleep_seconds`` the
        task sleeps (at most ``max_rate_limit_waits`` times per try); longer, the task is
        rescheduled and its next try resumes after what this one staged.
        """
        wait = exc.retry_after if exc.retry_after is not None else self.rate_limit_wait
        if wait > self.max_sleep_seconds:
            resume_at = self.now() + timedelta(seconds=wait)
            log.warning("%s: export rate limited (%s); %.0f s is longer than the %.0f s a task may sleep: "
                        "freeing the worker slot until %s, then resuming at id %d", self.partner_id, exc.cause,
                        wait, self.max_sleep_seconds, format_instant(resume_at), cursor)
            raise PartnerAsksToWait(self.partner_id, exc.request, f"export rate limited: {exc.cause}",
                                    resume_at) from exc
        if waits > self.max_rate_limit_waits:
            raise exc
        log.warning("%s: export rate limited (%s); waiting %.0f s, then resuming at id %d (wait %d of %d)",
                    self.partner_id, exc.cause, wait, cursor, waits, self.max_rate_limit_waits)
        self.sleep(wait)

    def _block_items(self, block: ExportBlock, window: Window, cursor: int) -> tuple[list[HarvestItem], int | None]:
        decoded, last_id = self._decode_block(block)
        return self._items(decoded, block, window, cursor), last_id

    def _decode_block(self, block: ExportBlock) -> tuple[list[_Decoded], int | None]:
        """Every record of the block decoded (fast UTF-8 path, else pymarc) and the highest bib id."""
        decoded: list[_Decoded] = []
        last_id: int | None = None
        for raw, problem in marc.split_iso2709(block.marc):
            fast = record = None
            if problem is None:
                fast = marc.decode_fast(raw)
                if fast is None:
                    record, problem = marc.decode_record(raw)
            if fast is not None:
                bib_id, stamp = fast.bib_id, fast.stamp
            elif record is not None:
                bib_id, stamp = marc.bib_id_of(record), marc.stamp_of(record)
            else:
                bib_id, stamp = _raw_bib_id(raw), None
            if bib_id and bib_id.isdigit():
                last_id = max(last_id or 0, int(bib_id))
            decoded.append(_Decoded(raw, problem, fast, record, bib_id, stamp))
        return decoded, last_id

    def _items(self, decoded: list[_Decoded], block: ExportBlock, window: Window, cursor: int) -> list[HarvestItem]:
        suspects: set[int] = set()
        if block.errors:
            suspects = {i for i, d in enumerate(decoded) if len(d.raw) >= EXPORT_SIZE_CEILING * TRUNCATION_SUSPECT}
            if len(suspects) < block.errors:
                log.warning("%s: export reported %d errors but only %d records are near the size ceiling; "
                            "re-fetching the whole block one by one", self.partner_id, block.errors, len(suspects))
                suspects = set(range(len(decoded)))
        items: list[HarvestItem] = []
        for index, d in enumerate(decoded):
            stamp = d.stamp or window.until
            if (d.fast is None and d.record is None) or not d.bib_id:
                where = f"(no bib id: export block from id {cursor}, record {index + 1})"
                reason = d.problem or "MARC: no bib id (neither 907 $a nor 001)"
                items.append(Rejected(d.bib_id or where, reason, marc.escape_raw(d.raw), stamp, marc.PREFIX))
            elif index in suspects:
                items.append(self._exported(self._refetch(d.bib_id, stamp), d.bib_id, stamp))
            elif d.fast is not None:
                items.append(self._exported(marc.fast_item(d.fast, d.bib_id, stamp, self.validation), d.bib_id, stamp))
            else:
                assert d.record is not None
                items.append(self._exported(marc.to_item(d.record, d.bib_id, stamp, self.validation), d.bib_id, stamp))
        return items

    def _prove_complete(self, window: Window, sink: ItemSink, stats: HarvestStats,
                        piece: SliceFacts | None = None) -> None:
        """I12: list the live ids through the JSON API, compare in SQL, fetch what is missing.

        The enumeration (``deleted=false``; with ``purge`` only public bibs) is staged with COPY and
        compared with this channel's staged records and rejects; the missing bibs are
        fetched in id-list batches into the same staging, and the check is recorded.
        """
        conn, run = getattr(sink, "conn", None), getattr(sink, "run", None)
        if conn is None or run is None:
            raise TypeError(f"{self.partner_id}: a Sierra full load needs a staging sink (conn, run) to prove completeness")
        staging: StagingSink = sink  # type: ignore[assignment]
        listed = completeness.listed_ids_writer(conn, run)
        pages = 0
        start_id, end_id = (piece.lo or 0, piece.hi) if piece is not None else (0, None)
        # One page fetched ahead: the server lists the next ids while this page is copied.
        listing = self._public_only({"deleted": "false", "fields": "id"})
        for entries in one_ahead(self.client.bib_pages(listing, MAX_LIMIT, start_id, end_id), f"ids-{self.partner_id}"):
            listed.write_page([(str(e["id"]), None, False) for e in entries if e.get("id")])
            pages += 1
        gap = completeness.measure_gap(conn, run)
        log.info("%s: id enumeration: %d live ids listed in %d pages; the export staged %d of them, %d missing, "
                 "%d staged records not listed", self.partner_id, gap.expected, pages, gap.found, gap.missing, gap.extra)
        fetched = deleted_since = 0
        for batch in completeness.missing_batches(conn, run, MISSING_BATCH):
            items = self.fetch_records(window, batch)
            fetched += len(items)
            got = {item.identifier for item in items}
            gone = self._deleted_since([i for i in batch if i not in got])
            deleted_since += len(gone)
            if items or gone:
                self._write(items + gone, staging, stats, "completeness fetch")
        purged = self._stage_vanished(conn, run, staging, stats, piece)
        left, sample = completeness.still_missing(conn, run)
        detail = f"fetched {fetched} missing of {gap.missing}"
        if purged:
            detail += f"; {purged}"
        if deleted_since:
            detail += f"; {deleted_since} deleted since they were listed (staged as deletions)"
        if gap.missing:
            detail += f" (export staged {gap.found} of {gap.expected} listed)"
        if left:
            detail += f"; still missing {left}: {', '.join(sample)}"
        if gap.extra:
            detail += f"; {gap.extra} staged records not listed live (deleted since the export?)"
        record_check(conn, run, CHECK_KIND, expected=gap.expected, found=gap.found, ok=left == 0, detail=detail,
                     attempt=getattr(staging, "attempt", None))
        completeness.clear(conn, run)
        (log.info if left == 0 else log.error)("%s: completeness check %s: %s", self.partner_id,
                                               "passed" if left == 0 else "FAILED", detail)

    def _stage_vanished(self, conn: Any, run: Any, staging: StagingSink, stats: HarvestStats,
                        piece: SliceFacts | None) -> str:
        """A full load leaves the mirror equal to the live set, whatever it held before.

        The export and the enumeration list only live bibs, and a load from the beginning
        polls no deletions: a bib the mirror holds (in this slice's id range) that the
        enumeration did not list and the run did not stage was deleted upstream since.
        It is staged as a tombstone at its stored version's datestamp (as a reconcile
        does), so the one-transaction apply purges exactly that version (I3, I10). More
        than the partner's ``max_purge_fraction`` of what is held is not staged (the
        weekly reconcile, with its guard and override, decides): returns what was done.
        """
        lo, hi, sliced = (piece.lo, piece.hi, True) if piece is not None else (None, None, False)
        gone, held = completeness.held_not_listed(conn, run, lo=lo, hi=hi, sliced=sliced)
        if not gone:
            return ""
        if gone > self.partner.max_purge_fraction * held:
            log.error("%s: %d of the %d bibs held were not listed live by the full load; more than the %.0f%% "
                      "mass-purge limit, so none is purged (a reconcile decides)", self.partner_id, gone, held,
                      100 * self.partner.max_purge_fraction)
            return f"{gone} held bibs not listed live left alone (above the mass-purge limit)"
        staged = 0
        for batch in completeness.held_not_listed_batches(conn, run, MISSING_BATCH, lo=lo, hi=hi, sliced=sliced):
            items: list[HarvestItem] = [Tombstone(identifier, datestamp) for identifier, datestamp in batch]
            self._write(items, staging, stats, "deleted since held")
            staged += len(items)
        log.info("%s: %d bibs held by the mirror are no longer live upstream: staged as deletions", self.partner_id, staged)
        return f"{staged} held bibs no longer live staged as deletions"

    def _refetch(self, bib_id: str, stamp: datetime) -> HarvestItem:
        """A record the export may have truncated: fetch it whole, or quarantine it."""
        try:
            record = marc.from_marc_json(self.client.bib_marc_json(bib_id))
        except (HarvestError, ValueError) as exc:
            cause = exc.cause if isinstance(exc, HarvestError) else str(exc)
            return Rejected(bib_id, f"truncated in the bibs/marc export and the re-fetch failed: {cause}",
                            "", stamp, marc.PREFIX)
        log.info("%s: bib %s was truncated by the export; re-fetched it whole", self.partner_id, bib_id)
        return marc.to_item(record, bib_id, marc.stamp_of(record) or stamp, self.validation)

    # -- reconcile -------------------------------------------------------------------

    def plan_sweep(self, window: Window, slices: int, threshold: int) -> list[Slice]:
        """Equal bib id ranges of the sweep (as a full load's slices; the last open-ended)."""
        settings = SliceSettings(threshold_records=threshold, target_records=1, max_slices=slices)
        return self._id_slices(window, settings) if slices >= 2 else []

    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """Every live bib id (keyset, ``fields=id``): the upstream set for a reconcile, or the
        ids of one slice's range."""
        piece = window.protocol.slice
        start, end = (piece.lo or 0, piece.hi) if piece is not None else (0, None)
        with self._rate_limit_frees_the_slot():
            for entries in self.client.bib_pages(self._public_only({"deleted": "false", "fields": "id"}),
                                                 self.partner.page_size, start_id=start, end_id=end):
                stats.pages += 1
                rows: list[SweptId] = [(str(e["id"]), None, False) for e in entries if e.get("id")]
                stats.fetched += len(rows)
                sink.write_page(rows)
        log.info("%s: reconcile sweep: %d live ids in %d pages", self.partner_id, stats.fetched, stats.pages)

    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """The bibs the aggregation lacks, by id list, with the harvest's own fields."""
        items: list[HarvestItem] = []
        for start in range(0, len(identifiers), self.fetch_chunk):
            chunk = identifiers[start:start + self.fetch_chunk]
            params = {"id": ",".join(chunk), "fields": ",".join(self.fields), "deleted": "false", "limit": len(chunk)}
            body = self.client.get_json("/bibs", params, empty_ok=True) or {}
            items.extend(self._entry_to_item(entry, window.until) for entry in body.get("entries") or [])
        return items

    def _deleted_since(self, identifiers: list[str]) -> list[HarvestItem]:
        """Listed live, gone by the fetch: deleted meanwhile? Their tombstones, from one id-list query per chunk."""
        items: list[HarvestItem] = []
        for start in range(0, len(identifiers), self.fetch_chunk):
            chunk = identifiers[start:start + self.fetch_chunk]
            params = {"id": ",".join(chunk), "fields": "id,deleted,deletedDate", "limit": len(chunk)}
            body = self.client.get_json("/bibs", params, empty_ok=True) or {}
            items.extend(self._tombstone(entry, str(entry.get("id", "")))
                         for entry in body.get("entries") or [] if entry.get("deleted") is True)
        return items

    # -- shared ----------------------------------------------------------------------

    def _write(self, items: list[HarvestItem], sink: ItemSink, stats: HarvestStats, what: str,
               checkpoint: int | None = None) -> None:
        stats.pages += 1
        for item in items:
            stats.add(item)
        if checkpoint is None:
            sink.write_page(items)
        else:  # a slice's staging sink: the position is stored with the page (store/staging.py)
            sink.write_page(items, checkpoint=checkpoint)  # type: ignore[call-arg]
        log.info("%s: %s page %d: %d items; %d fetched%s (%d records, %d deleted, %d rejected)%s",
                 self.partner_id, what, stats.pages, len(items), stats.fetched,
                 f" of ~{stats.expected} (id range)" if stats.expected is not None else "", stats.records,
                 stats.tombstones, stats.rejected, self._time_left(stats))

    _progress_since: tuple[float, int] | None = None  # (monotonic start, items fetched then) of this try

    def _time_left(self, stats: HarvestStats) -> str:
        """``, 120/s, about 4m 10s left`` at this try's rate, against the estimate (else empty)."""
        if stats.expected is None or self._progress_since is None:
            return ""
        began, before = self._progress_since
        rate = (stats.fetched - before) / max(time.monotonic() - began, 1e-6)
        if rate <= 0:
            return ""
        return f", {rate:.0f}/s, about {durations.human(max(stats.expected - stats.fetched, 0) / rate)} left"


def _after_last(entries: list[dict[str, Any]]) -> int | None:
    """The keyset position after a page: its last id + 1 (None when unusable)."""
    try:
        return int(entries[-1]["id"]) + 1 if entries else None
    except (KeyError, TypeError, ValueError):
        return None


def one_ahead(pages: Iterator[T], name: str) -> Iterator[T]:
    """The pages of ``pages``, the next one fetched in a second thread while the caller
    works on the current one: at most one page ahead (memory stays O(page)).

    The iterator runs in that thread only, so its HTTP session is used by one thread at
    a time; its errors are raised here, at the page they would have been raised for.
    """
    done = object()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as ahead:
        pending = ahead.submit(next, pages, done)
        while True:
            page = pending.result()
            if page is done:
                return
            pending = ahead.submit(next, pages, done)
            yield page  # type: ignore[misc]


def _finish(writing: Future[None] | None) -> None:
    """The last block's COPY is done (or its error raised) before the export returns."""
    if writing is not None:
        writing.result()


class _Failing:
    """A block that failed with code 135 while it is bisected: its size, and the ids the
    smaller blocks have covered since (past all of them, the full block size returns)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.covered = 0


class _Decoded(NamedTuple):
    """One export record after decoding: raw bytes, the why of a failure, either decoding."""

    raw: bytes
    problem: str | None
    fast: marc.FastBib | None
    record: Any  # pymarc.Record | None
    bib_id: str | None
    stamp: datetime | None


def _raw_bib_id(raw: bytes) -> str | None:
    """The 907 $a id of a record pymarc could not decode, so its quarantine row names the bib."""
    match = _RAW_907.search(raw)
    return match.group(1).decode("ascii") if match else None


def _time_slices(window: Window, settings: SliceSettings) -> list[Slice]:
    """Equal updatedDate ranges (whole seconds, inclusive, disjoint) covering the window."""
    assert window.from_ is not None
    seconds = int((window.until - window.from_).total_seconds()) + 1
    count = min(settings.max_slices, math.ceil((window.until - window.from_) / settings.long_window))
    if count < 2:
        return []
    size = math.ceil(seconds / count)
    pieces: list[Slice] = []
    start = window.from_
    while start <= window.until:
        end = min(start + timedelta(seconds=size - 1), window.until)
        pieces.append(Slice(from_=start, until=end))
        start = end + timedelta(seconds=1)
    return pieces


def _json(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False, sort_keys=True)[:200000]

