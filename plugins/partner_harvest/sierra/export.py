"""Sierra's full load: the bibs/marc export with its resume and bisection, then the proof (I12).

The export is a keyset over id blocks through the two-phase export (a summary naming a
file, the file, its deletion). A try resumes after what an earlier try of the same frozen
window staged (a rescheduled rate limit, a killed worker), or a slice at its checkpoint. A
block that fails with code 135 on every try is bisected down to the one bib bib2Marc cannot
build, which is fetched through ``GET bibs`` instead (or quarantined). Then the JSON API's
list of live ids is the second witness: the bibs the export left out are fetched, those
deleted since are staged as deletions, and the check is recorded on the run.
"""

from __future__ import annotations

import logging
import re
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from partner_harvest.adapters import StagingSink
from partner_harvest.errors import HarvestError, HarvestLoopError, PartnerAsksToWait
from partner_harvest.records import HarvestItem, HarvestStats, Rejected, Tombstone
from partner_harvest.sierra import marc, resume
from partner_harvest.sierra.client import EXPORT_FAILED, MAX_LIMIT, ExportBlock, RateLimited, SierraServerError, _id_range
from partner_harvest.store import completeness, record_check
from partner_harvest.window import Slice, Window, format_instant

if TYPE_CHECKING:
    from partner_harvest.sierra.harvester import SierraAdapter

log = logging.getLogger(__name__)
T = TypeVar("T")

EXPORT_SIZE_CEILING = 99_999
TRUNCATION_SUSPECT = 0.95  # records this close to the ceiling may have lost their tail
CHECK_KIND = "sierra-id-enumeration"
SUPPRESSED = "suppressed"  # deletions.reason: the bib became suppressed (options.sierra.suppressed: purge)
MISSING_BATCH = 500  # missing ids read back from PostgreSQL at a time (fetched 25 per request)
_RAW_907 = re.compile(rb"\x1fa\.b(\d+)[\dx]", re.IGNORECASE)


class FullLoad:
    """One try of a full load, or of one id slice of it (``piece``): export, then prove."""

    def __init__(self, adapter: SierraAdapter, window: Window, sink: StagingSink, stats: HarvestStats,
                 piece: Slice | None) -> None:
        self.adapter, self.client, self.partner_id = adapter, adapter.client, adapter.partner_id
        self.window, self.sink, self.stats, self.piece = window, sink, stats, piece
        export = adapter.partner.options.export
        # Above Sierra's 2000 the client pages at 2000: the loop never compares with the limit.
        self.limit: int = export.limit or adapter.partner.page_size
        self.rate_limit_wait: float = export.rate_limit_wait
        self.max_rate_limit_waits: int = export.max_rate_limit_waits
        self.max_sleep_seconds: float = export.max_sleep_seconds
        # Extra export query parameters (mapping, locations...) come ONLY from options.export.params
        # (the registry refuses the keyset's own: sierra.spec.RESERVED_EXPORT_PARAMS).
        self.params = {str(k): str(v) for k, v in export.params.items()}
        self.suppressed_ids = array("q")  # the suppressed ids of the load's range, ascending (run lists them)

    def run(self) -> None:
        """The export, then the proof that it delivered every live bib (of the slice's ids).

        A slice resumes at its checkpoint (``resume_at``, pipeline.harvest_piece). An unsliced
        try that follows a rescheduled (rate-limited) or killed one finds that try's staging
        kept (pipeline ``resumes_staging``) and resumes after its highest staged id.
        """
        piece = self.piece
        if piece is not None:
            start = piece.resume_at or piece.lo or 0
            if piece.resume_at:
                log.info("%s: slice %s resumes its export at id %d", self.partner_id, piece.channel, start)
        else:
            start = self._resume_point()
            self.stats.expected = expected_bibs(self.adapter, self.limit)
        self.suppressed_ids = self._list_suppressed(start, piece.hi if piece is not None else None)
        self.adapter.progress_since = (time.monotonic(), self.stats.fetched)  # the time left counts this try's rate
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"export-{self.partner_id}") as ahead, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"staging-{self.partner_id}") as copier:
            _Keyset(self, start, ahead, copier).run()
        self._prove_complete()

    # -- where to start, how far --------------------------------------------------------

    def _resume_point(self) -> int:
        """After the highest bib an earlier try of this window staged (0 without a database sink)."""
        kept = resume.resume_after(self.sink, self.stats)
        if kept is None:
            return 0
        start = (kept.max_id + 1) if kept.max_id is not None else 0
        log.info("%s: resuming the export at id %d: an earlier try of this run staged %d items (up to bib %s)",
                 self.partner_id, start, kept.count, kept.max_id)
        return start

    def _list_suppressed(self, start: int, end: int | None) -> array[int]:
        """The suppressed live ids of the load's range, ascending (8 bytes each): the export
        does not say which bibs are suppressed."""
        ids = array("q")
        if self.adapter.suppressed == "keep":
            return ids
        for entries in self.client.bib_pages({"suppressed": "true", "deleted": "false", "fields": "id"}, MAX_LIMIT,
                                             start_id=start, end_id=end):
            ids.extend(int(e["id"]) for e in entries if str(e.get("id", "")).isdigit())
        log.info("%s: %d suppressed bibs in the full load's range (options.sierra.suppressed: %s)",
                 self.partner_id, len(ids), self.adapter.suppressed)
        return ids

    def _exported(self, item: HarvestItem, bib_id: str, stamp: datetime) -> HarvestItem:
        """An exported bib as the partner's suppression choice has it."""
        ids = self.suppressed_ids
        at = bisect_left(ids, int(bib_id)) if bib_id.isdigit() else len(ids)
        if at == len(ids) or ids[at] != int(bib_id):
            return item
        if self.adapter.suppressed == "purge":
            return Tombstone(bib_id, stamp, SUPPRESSED)
        return self.adapter.flagged(item)

    # -- one block ------------------------------------------------------------------------

    def wait_for_rate_limit(self, exc: RateLimited, cursor: int, waits: int) -> None:
        """A short wait sleeps here; a longer one gives the worker slot back (PartnerAsksToWait).

        The wait is the one the server names (Retry-After, "try again in N minutes"), else
        ``options.export.rate_limit_wait``. Up to ``options.export.max_sleep_seconds`` the
        task sleeps (at most ``max_rate_limit_waits`` times per try); longer, the task is
        rescheduled and its next try resumes after what this one staged.
        """
        wait = exc.retry_after if exc.retry_after is not None else self.rate_limit_wait
        if wait > self.max_sleep_seconds:
            resume_at = self.adapter.now() + timedelta(seconds=wait)
            log.warning("%s: export rate limited (%s); %.0f s is longer than the %.0f s a task may sleep: "
                        "freeing the worker slot until %s, then resuming at id %d", self.partner_id, exc.cause,
                        wait, self.max_sleep_seconds, format_instant(resume_at), cursor)
            raise PartnerAsksToWait(self.partner_id, exc.request, f"export rate limited: {exc.cause}",
                                    resume_at) from exc
        if waits > self.max_rate_limit_waits:
            raise exc
        log.warning("%s: export rate limited (%s); waiting %.0f s, then resuming at id %d (wait %d of %d)",
                    self.partner_id, exc.cause, wait, cursor, waits, self.max_rate_limit_waits)
        self.adapter.sleep(wait)

    def isolate(self, cursor: int, end_id: int | None, failure: SierraServerError) -> tuple[list[HarvestItem], int | None]:
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
            items = self.adapter.fetch_records(self.window, [bib_id])
        except RateLimited:
            raise
        except HarvestError as exc:
            reason = f"bibs/marc cannot export this bib ({failure.cause}) and GET bibs failed too: {exc.cause}"
            log.error("%s: bib %s quarantined: %s", self.partner_id, bib_id, reason)
            return [Rejected(bib_id, reason, "", self.window.until, marc.PREFIX)], after
        log.warning("%s: bib %s is one bibs/marc cannot export (code 135); fetched it through GET bibs "
                    "(%d item(s)); the export goes on at id %d", self.partner_id, bib_id, len(items), after)
        return items, after

    def items(self, decoded: list[Decoded], block: ExportBlock, cursor: int) -> list[HarvestItem]:
        """A decoded block as items: records, rejects, and what the export may have truncated fetched whole."""
        suspects: set[int] = set()
        if block.errors:
            suspects = {i for i, d in enumerate(decoded) if len(d.raw) >= EXPORT_SIZE_CEILING * TRUNCATION_SUSPECT}
            if len(suspects) < block.errors:
                log.warning("%s: export reported %d errors but only %d records are near the size ceiling; "
                            "re-fetching the whole block one by one", self.partner_id, block.errors, len(suspects))
                suspects = set(range(len(decoded)))
        validation = self.adapter.validation
        items: list[HarvestItem] = []
        for index, d in enumerate(decoded):
            stamp = d.stamp or self.window.until
            if (d.fast is None and d.record is None) or not d.bib_id:
                where = f"(no bib id: export block from id {cursor}, record {index + 1})"
                reason = d.problem or "MARC: no bib id (neither 907 $a nor 001)"
                items.append(Rejected(d.bib_id or where, reason, marc.escape_raw(d.raw), stamp, marc.PREFIX))
            elif index in suspects:
                items.append(self._exported(self._refetch(d.bib_id, stamp), d.bib_id, stamp))
            elif d.fast is not None:
                items.append(self._exported(marc.fast_item(d.fast, d.bib_id, stamp, validation), d.bib_id, stamp))
            else:
                assert d.record is not None
                items.append(self._exported(marc.to_item(d.record, d.bib_id, stamp, validation), d.bib_id, stamp))
        return items

    def _refetch(self, bib_id: str, stamp: datetime) -> HarvestItem:
        """A record the export may have truncated: fetch it whole, or quarantine it."""
        try:
            record = marc.from_marc_json(self.client.bib_marc_json(bib_id))
        except (HarvestError, ValueError) as exc:
            cause = exc.cause if isinstance(exc, HarvestError) else str(exc)
            return Rejected(bib_id, f"truncated in the bibs/marc export and the re-fetch failed: {cause}",
                            "", stamp, marc.PREFIX)
        log.info("%s: bib %s was truncated by the export; re-fetched it whole", self.partner_id, bib_id)
        return marc.to_item(record, bib_id, marc.stamp_of(record) or stamp, self.adapter.validation)

    def write(self, items: list[HarvestItem], what: str, checkpoint: int | None) -> None:
        self.adapter.write(items, self.sink, self.stats, what, checkpoint)

    # -- the proof ------------------------------------------------------------------------

    def _prove_complete(self) -> None:
        """I12: list the live ids through the JSON API, compare in SQL, fetch what is missing.

        The enumeration (``deleted=false``; with ``purge`` only public bibs) is staged with COPY and
        compared with this channel's staged records and rejects; the missing bibs are
        fetched in id-list batches into the same staging, and the check is recorded.
        """
        conn, run, piece = self.sink.conn, self.sink.run, self.piece
        if conn is None or run is None:
            raise TypeError(f"{self.partner_id}: a Sierra full load needs a staging sink in PostgreSQL to prove "
                            "its completeness")
        listed = completeness.listed_ids_writer(conn, run)
        pages = 0
        start_id, end_id = (piece.lo or 0, piece.hi) if piece is not None else (0, None)
        # One page fetched ahead: the server lists the next ids while this page is copied.
        listing = self.adapter.public_only({"deleted": "false", "fields": "id"})
        for entries in one_ahead(self.client.bib_pages(listing, MAX_LIMIT, start_id, end_id), f"ids-{self.partner_id}"):
            listed.write_page([(str(e["id"]), None, False) for e in entries if e.get("id")])
            pages += 1
        gap = completeness.measure_gap(conn, run)
        log.info("%s: id enumeration: %d live ids listed in %d pages; the export staged %d of them, %d missing, "
                 "%d staged records not listed", self.partner_id, gap.expected, pages, gap.found, gap.missing, gap.extra)
        fetched = deleted_since = 0
        for batch in completeness.missing_batches(conn, run, MISSING_BATCH):
            items = self.adapter.fetch_records(self.window, batch)
            fetched += len(items)
            got = {item.identifier for item in items}
            gone = self.adapter.deleted_since([i for i in batch if i not in got])
            deleted_since += len(gone)
            if items or gone:
                self.write(items + gone, "completeness fetch", None)
        purged = self._stage_vanished(conn, run)
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
                     attempt=self.sink.attempt)
        completeness.clear(conn, run)
        (log.info if left == 0 else log.error)("%s: completeness check %s: %s", self.partner_id,
                                               "passed" if left == 0 else "FAILED", detail)

    def _stage_vanished(self, conn: Any, run: Any) -> str:
        """A full load leaves the mirror equal to the live set, whatever it held before.

        The export and the enumeration list only live bibs, and a load from the beginning
        polls no deletions: a bib the mirror holds (in this slice's id range) that the
        enumeration did not list and the run did not stage was deleted upstream since.
        It is staged as a tombstone at its stored version's datestamp (as a reconcile
        does), so the one-transaction apply purges exactly that version (I3, I10). More
        than the partner's ``max_purge_fraction`` of what is held is not staged (the
        weekly reconcile, with its guard and override, decides): returns what was done.
        """
        piece, limit = self.piece, self.adapter.partner.max_purge_fraction
        lo, hi, sliced = (piece.lo, piece.hi, True) if piece is not None else (None, None, False)
        gone, held = completeness.held_not_listed(conn, run, lo=lo, hi=hi, sliced=sliced)
        if not gone:
            return ""
        if gone > limit * held:
            log.error("%s: %d of the %d bibs held were not listed live by the full load; more than the %.0f%% "
                      "mass-purge limit, so none is purged (a reconcile decides)", self.partner_id, gone, held,
                      100 * limit)
            return f"{gone} held bibs not listed live left alone (above the mass-purge limit)"
        staged = 0
        for batch in completeness.held_not_listed_batches(conn, run, MISSING_BATCH, lo=lo, hi=hi, sliced=sliced):
            items: list[HarvestItem] = [Tombstone(identifier, datestamp) for identifier, datestamp in batch]
            self.write(items, "deleted since held", None)
            staged += len(items)
        log.info("%s: %d bibs held by the mirror are no longer live upstream: staged as deletions", self.partner_id, staged)
        return f"{staged} held bibs no longer live staged as deletions"


class _Keyset:
    """The keyset loop of one export try, up to a slice's ``hi``; one block fetched ahead.

    A block is the lowest ids from the cursor, deleted ones included: ``inputRecords``
    counts them, ``outputRecords`` does not. Every id in [cursor, cursor + inputRecords)
    that exists was in the block, so the next block starts at
    max(cursor + inputRecords, highest exported id + 1): a block of deleted (or omitted
    suppressed) bibs moves on, and the cursor strictly rises. The export ends only on
    404/107 or an empty block.

    Once a block's ids are decoded its successor is requested from a second thread (``ahead``)
    while this block is validated and copied into staging (the server builds the next file
    meanwhile); at most one block is ahead. Not when a block must be re-fetched record by
    record (the session then serves those requests alone). The COPY of a block runs in a
    third thread (``copier``) while the next block is decoded: blocks are copied in order,
    one at a time, each in its own transaction, so what is staged is always a prefix of the
    export (a rescheduled try resumes after it).
    """

    def __init__(self, load: FullLoad, start: int, ahead: ThreadPoolExecutor, copier: ThreadPoolExecutor) -> None:
        self.load, self.client, self.partner_id = load, load.client, load.partner_id
        self.ahead, self.copier = ahead, copier
        self.end_id = load.piece.hi if load.piece is not None else None  # an id slice: [lo, hi]; else open-ended
        self.cursor = start
        self.limit = load.limit  # smaller while a block that fails with code 135 is bisected
        self.failing: _Failing | None = None
        self.pending: Future[ExportBlock | None] | None = None  # the next block, requested ahead
        self.writing: Future[None] | None = None  # the previous block's COPY, in order, one at a time
        self.waits = self.blocks = 0

    def run(self) -> None:
        while self.end_id is None or self.cursor <= self.end_id:
            try:
                block = self._next_block()
            except RateLimited as exc:
                self.waits += 1
                self.load.wait_for_rate_limit(exc, self.cursor, self.waits)
                continue
            except SierraServerError as exc:
                if exc.code != EXPORT_FAILED:
                    raise
                if self._bisect(exc) or self._isolated(exc):
                    continue
                log.info("%s: export ends at id %d (no ids left after a failing block)", self.partner_id, self.cursor)
                break
            if block is None:
                log.info("%s: export ends at id %d (404/107: no ids left) after %d blocks", self.partner_id,
                         self.cursor, self.blocks)
                break
            if not self._take(block):
                break
        self._copied()

    def _next_block(self) -> ExportBlock | None:
        pending, self.pending = self.pending, None
        if pending is not None:
            return pending.result()
        return self.client.export_block(self.cursor, self.limit, self.load.params, end_id=self.end_id,
                                        tries=1 if self.failing else None)

    def _bisect(self, exc: SierraServerError) -> bool:
        """A block failing with code 135: its lower half next (False once it is one id)."""
        if self.limit <= 1:
            return False
        if self.failing is None:
            self.failing = _Failing(self.limit)
            log.warning("%s: export block from id %d (limit %d) fails with code 135 on every try; bisecting it "
                        "to isolate the bib(s) bib2Marc cannot export: %s", self.partner_id, self.cursor,
                        self.limit, exc.cause)
        self.limit //= 2
        return True

    def _isolated(self, exc: SierraServerError) -> bool:
        """The one bib of a failing block of one id, fetched without the export; False: no id left."""
        items, after = self.load.isolate(self.cursor, self.end_id, exc)
        if after is None:
            return False
        self._copy(items, "isolated bib", after)
        self.cursor, self.limit, self.failing = after, self.load.limit, None
        return True

    def _take(self, block: ExportBlock) -> bool:
        """Stage one block and move the cursor past it; False: the export ended (an empty block)."""
        self.blocks += 1
        decoded, last_id = decode_block(block)
        covered = block.input_records
        if covered is None:  # a summary without inputRecords: only what came is known
            covered = block.output_records
        if covered == 0 and last_id is None:
            log.info("%s: export ends at id %d (empty block) after %d blocks", self.partner_id, self.cursor, self.blocks)
            return False
        cursor = self.cursor
        next_cursor = max(cursor + covered, last_id + 1 if last_id is not None else 0)
        if next_cursor <= cursor:
            raise HarvestLoopError(self.partner_id, f"GET bibs/marc?id=[{cursor},]",
                                   f"export ids did not ascend (highest id {last_id}, inputRecords {covered})")
        if self.failing is not None:  # past the whole block that failed: it was not one bib's fault
            self.failing.covered += covered
            if self.failing.covered >= self.failing.limit:
                self.limit, self.failing = self.load.limit, None
        if self.failing is None and not block.errors and (self.end_id is None or next_cursor <= self.end_id):
            self.pending = self.ahead.submit(self.client.export_block, next_cursor, self.load.limit, self.load.params,
                                             end_id=self.end_id)
        self._copy(self.load.items(decoded, block, cursor), "export", next_cursor)
        if block.output_records < covered:
            log.info("%s: export block from id %d: %d ids in, %d records out (%s deleted)", self.partner_id,
                     cursor, covered, block.output_records, block.deleted_records)
        self.cursor = next_cursor
        return True

    def _copy(self, items: list[HarvestItem], what: str, after: int) -> None:
        """COPY a block once the previous one is copied (its failure fails the export here); a
        slice stores its checkpoint with every block, even an empty one."""
        self._copied()
        sliced = self.load.piece is not None
        if items or sliced:
            self.writing = self.copier.submit(self.load.write, items, what, after if sliced else None)

    def _copied(self) -> None:
        """The COPY in flight is done (or its error raised)."""
        writing, self.writing = self.writing, None
        if writing is not None:
            writing.result()


def expected_bibs(adapter: SierraAdapter, block: int) -> int | None:
    """About how many items an unsliced full load brings, for its progress and time left only.

    Sierra's ``total`` is the size of one page, not of the result set, so the estimate is
    the span of bib ids (``fields=id&limit=1`` probes: the lowest id, then the highest,
    about 2 x log2(span) requests, stepping up by ``block`` first): record numbers are handed
    out in sequence, so it is an upper bound (deleted ids count). The export never stops on
    it: it ends on 404/107 or an empty block. A probe that fails leaves the load without an
    estimate.
    """
    try:
        low = adapter.first_id_from(0)
        if low is None:
            return None
        high, probes = adapter.highest_id(low, max(1, block))
    except HarvestError as exc:
        log.warning("%s: no estimate of the full load's size (the id probe failed: %s); its progress shows "
                    "no time left", adapter.partner_id, exc)
        return None
    span = high - low + 1
    log.info("%s: full load expects about %d bibs: an estimate from the id range %d..%d (%d probes; an upper "
             "bound, deleted ids count; Sierra's total counts only a page), for the progress and the time "
             "left, never to end the export", adapter.partner_id, span, low, high, probes + 1)
    return span


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


class _Failing:
    """A block that failed with code 135 while it is bisected: its size, and the ids the
    smaller blocks have covered since (past all of them, the full block size returns)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.covered = 0


class Decoded(NamedTuple):
    """One export record after decoding: raw bytes, the why of a failure, either decoding."""

    raw: bytes
    problem: str | None
    fast: marc.FastBib | None
    record: Any  # pymarc.Record | None
    bib_id: str | None
    stamp: datetime | None


def decode_block(block: ExportBlock) -> tuple[list[Decoded], int | None]:
    """Every record of the block decoded (fast UTF-8 path, else pymarc) and the highest bib id."""
    decoded: list[Decoded] = []
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
        decoded.append(Decoded(raw, problem, fast, record, bib_id, stamp))
    return decoded, last_id


def _raw_bib_id(raw: bytes) -> str | None:
    """The 907 $a id of a record pymarc could not decode, so its quarantine row names the bib."""
    match = _RAW_907.search(raw)
    return match.group(1).decode("ascii") if match else None
