"""The file-delivery adapter: a partner that publishes dated full dumps and deltas.

The freeze lists the location and keeps the chain (layout.py): the newest complete full
dump and the complete deltas after it, up to a gap or a delivery still being written. The
window's ``until`` is the chain's last date, so the cursor is the newest delivery applied.
Settling the window against ``delivery_files`` (what applied runs read, per file: size,
ETag, checksum) keeps the deliveries not applied yet and those changed in place since:
each delivery is applied once, in date order, again only when it changed. A run holding a
full dump lists the partner's whole collection at its date (``whole_list_at``): what it
does not hold is purged through the shrink gate (run.apply, reason ``not_listed``).

Every item carries its delivery's date as its version stamp, so versions order as the
partner published them whatever order runs apply in (a delivery changed in place and
applied again after a newer one changes only what the newer one did not).

A try killed inside a file resumes at its checkpoint: ``unit << 40 | position``, the
file's place in the run's list and a byte offset or record number in it (readers.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec
import psycopg

from partner_harvest.adapters import Adapter, IdSink, PartnerClock, StagingSink, SweptId
from partner_harvest.errors import ConfigurationError, PartnerDataError, PartnerNotReady
from partner_harvest.files import layout
from partner_harvest.files.readers import FileReader, new_digest, seeks
from partner_harvest.files.spec import FilesOptions
from partner_harvest.files.storage import Storage
from partner_harvest.formats.checks import policy_of
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.registry import Partner, SliceSettings
from partner_harvest.store import deliveries
from partner_harvest.store.staging import held_versions, holds_any
from partner_harvest.window import SECONDS, Delivery, DeliveryFacts, DeliveryFile, Slice, Window, format_instant

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # the clock of a partner that delivered nothing yet
UNIT = 1 << 40  # a checkpoint's file index step: positions within a file stay below 1 TiB
PAGE_ITEMS = 2000
PAGE_BYTES = 8 * 1024 * 1024
BYTES_PER_RECORD = 1024  # how slicing estimates records from bytes (slicing.threshold_records)
PREFIXES = {"csv": "csv", "tsv": "csv", "jsonl": "jsonl", "xml": "xml", "marc": "marc21"}


def checkpoint(unit: int, position: int) -> int:
    return unit * UNIT + position


def units_of(facts: DeliveryFacts) -> list[tuple[Delivery, DeliveryFile]]:
    """The run's files in the order they are read: deliveries by date, files by path."""
    return [(delivery, file) for delivery in facts.deliveries for file in delivery.files]


class FileDeliveryAdapter(Adapter):
    """Harvests one partner's dated deliveries from its :class:`Storage`."""

    resumes_slices = True
    resumes_window = True
    bulk_missing_threshold = 0  # a reconcile reads the deliveries once for what is missing

    def __init__(self, partner: Partner, storage: Storage, now: Callable[[], datetime] | None = None):
        super().__init__(partner)
        self._holds = False
        options: FilesOptions = partner.options.files
        if options.format is None or (options.full is None and options.delta is None):
            raise ConfigurationError(partner.id, "registry options.files",
                                     "a file-delivery partner needs options.files with full or delta and format")
        self.options, self.storage, self.format = options, storage, options.format
        self.layout = layout.Layout(partner.id, options, storage)
        self.now = now or (lambda: datetime.now(timezone.utc))
        prefix = partner.metadata_prefix if partner.metadata_prefix != "auto" else PREFIXES[options.format.kind]
        self.prefix = prefix
        self.reader = FileReader(partner.id, options.format, prefix, policy_of(partner.options.validation))

    # -- the window ------------------------------------------------------------------------

    def clock(self) -> PartnerClock:
        """The location listed: the chain a run may apply; its last date is the partner's clock."""
        listed = self.layout.list(self.now())
        found = layout.chain(listed, self.options.every)
        newest = found.deliveries[-1].date if found.deliveries else EPOCH
        log.info("%s: %s: %d deliveries listed; the chain: %s%s", self.partner_id, self.storage.where, found.listed,
                 _describe(found.deliveries) or "nothing complete yet",
                 f"; waiting: {found.waiting}" if found.waiting else "")
        return PartnerClock(now=newest, granularity=SECONDS, protocol={
            "files": DeliveryFacts(deliveries=found.deliveries, waiting=found.waiting)})

    def settle_window(self, window: Window, conn: psycopg.Connection) -> Window:
        """Keep the deliveries this run applies: not applied yet, or changed in place since
        (an incremental run); the whole chain (a full run); those in the requested window."""
        facts = window.protocol.files
        if facts is None:
            return window
        chain = list(facts.deliveries)
        applied: dict[tuple[datetime, str], dict[str, tuple[int, str | None]]] = {}
        for row in deliveries.applied_files(conn, self.partner_id):
            applied.setdefault((row.delivered, row.kind), {})[row.path] = (row.size, row.etag)
        waiting = facts.waiting
        if window.mode == "window":
            pending = [d for d in chain if window.from_ is not None and window.from_ <= d.date <= window.until]
        elif window.mode == "full" or not applied:
            pending = chain
            if not applied and chain and chain[0].kind == layout.DELTA and self.options.full is not None:
                pending, waiting = [], ("no complete full dump to start from yet (deltas alone cannot build the "
                                        "partner's collection)")
        else:
            pending = [d for d in chain if applied.get((d.date, d.kind)) != _fingerprint(d)]
            gap = self._gap_before(chain, applied)
            if gap is not None:
                pending, waiting = [], gap
        for delivery in pending:
            if (delivery.date, delivery.kind) in applied:
                log.warning("%s: the %s of %s changed in place since it was applied (%s): it is applied again",
                            self.partner_id, delivery.kind, format_instant(delivery.date),
                            ", ".join(f.path for f in delivery.files))
        skipped = [d for d in chain if d not in pending]
        if skipped and window.mode == "incremental":
            log.info("%s: already applied, unchanged: %s", self.partner_id, _describe(tuple(skipped)))
        log.info("%s: this run applies %s%s", self.partner_id, _describe(tuple(pending)) or "no delivery",
                 f"; waiting: {waiting}" if waiting else "")
        fulls = [d.date for d in pending if d.kind == layout.FULL]
        until = window.until
        if window.mode == "incremental":
            dates = [d.date for d in pending] + [date for date, _ in applied]
            until = max(max(dates, default=window.until if not applied else EPOCH), window.from_ or EPOCH)
        settled = window.with_facts(files=DeliveryFacts(deliveries=tuple(pending), waiting=waiting),
                                    whole_list_at=max(fulls) if fulls else None)
        return Window(settled.mode, settled.from_, until, settled.granularity, settled.advances_cursor,
                      settled.protocol)

    def _gap_before(self, chain: list[Delivery], applied: dict[tuple[datetime, str], Any]) -> str | None:
        """A chain that starts with a delta not applied yet must follow what was applied (retention
        removed the full dump the chain would start from): no more than ``every`` after it."""
        if not chain or chain[0].kind != layout.DELTA or self.options.every is None or (chain[0].date, layout.DELTA) in applied:
            return None
        before = [date for date, _ in applied if date < chain[0].date]
        if not before:
            return None
        if chain[0].date - max(before) <= self.options.every:
            return None
        return (f"a gap: the newest delivery applied is of {format_instant(max(before))}, the oldest listed delta of "
                f"{format_instant(chain[0].date)} (deltas every {self.options.every}); it waits for a full dump "
                "or an operator")

    # -- slices ----------------------------------------------------------------------------

    def plan_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """Ranges of the run's files, of about equal bytes, when it holds more than one file and
        more than ``threshold_records`` (estimated at 1 KB a record)."""
        facts = window.protocol.files
        units = units_of(facts) if facts is not None else []
        total = sum(file.size for _, file in units)
        if len(units) < 2 or settings.max_slices < 2 or total <= settings.threshold_records * BYTES_PER_RECORD:
            return []
        count = min(settings.max_slices, len(units), max(2, -(-total // (settings.target_records * BYTES_PER_RECORD))))
        share = total / count
        planned: list[Slice] = []
        first, running = 0, 0
        for index, (_, file) in enumerate(units):
            running += file.size
            left = len(units) - index - 1
            if (running >= share * (len(planned) + 1) and len(planned) < count - 1) or left == 0:
                size = sum(f.size for _, f in units[first:index + 1])
                planned.append(Slice(until=window.until, lo=first, hi=index, estimate=size // BYTES_PER_RECORD,
                                     **{"from": window.from_}))
                first = index + 1
        return planned

    # -- harvest ---------------------------------------------------------------------------

    def harvest(self, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        facts = window.protocol.files
        if facts is None:
            raise ConfigurationError(self.partner_id, "window", "the window was frozen without its deliveries "
                                     "(WindowFacts.files): freeze it again")
        units = units_of(facts)
        self._holds = holds_any(sink.conn, self.partner_id)  # a first load compares nothing
        piece = window.protocol.slice
        lo, hi = (piece.lo or 0, piece.hi if piece.hi is not None else len(units) - 1) if piece and piece.lo is not None \
            else (0, len(units) - 1)
        resume = piece.resume_at if piece is not None else window.protocol.resume_at
        start_unit, start_position = divmod(resume, UNIT) if resume is not None else (lo, 0)
        if resume is not None:
            log.info("%s: resuming at file %d of %d..%d, position %d", self.partner_id, start_unit, lo, hi,
                     start_position)
        audit = window.mode != "reconcile"  # a reconcile's read applies no delivery: no delivery_files row
        for index in range(max(lo, start_unit), hi + 1):
            delivery, file = units[index]
            self._read(index, delivery, file, start_position if index == start_unit else 0, sink, stats, audit)
        if facts.waiting:
            log.info("%s: waiting: %s", self.partner_id, facts.waiting)

    def _read(self, index: int, delivery: Delivery, file: DeliveryFile, position: int, sink: StagingSink,
              stats: HarvestStats, audit: bool = True) -> None:
        """One file from ``position``: its items staged page by page, each page with its checkpoint."""
        where = f"{self.storage.where}/{file.path}"
        now = self.storage.info(file.path)
        if now is None or (now.size, now.etag) != (file.size, file.etag):
            raise PartnerDataError(self.partner_id, f"read {where}", (
                "the file is gone" if now is None else f"the file changed since the window froze ({file.size} bytes, "
                f"ETag {file.etag}; now {now.size} bytes, ETag {now.etag}): still being uploaded or replaced; the next "
                "run freezes the delivery again"))
        digest = new_digest(file.checksum) if position == 0 else None
        items, counting = self.reader.read(self.storage, file.path, delivery.date, position, digest)
        page: list[HarvestItem] = []
        page_bytes, read, started = 0, 0, time.monotonic()
        last = position
        for item, last in items:
            page.append(item)
            read += 1
            page_bytes += len(item.metadata) if isinstance(item, Record) else 64
            if len(page) >= PAGE_ITEMS or page_bytes >= PAGE_BYTES:
                self._flush(page, sink, stats, checkpoint(index, last))
                page, page_bytes = [], 0
                if stats.pages % 50 == 0:
                    self._progress(file, counting.count, read, started, stats)
        self._flush(page, sink, stats, checkpoint(index, last))
        if seeks(file.path, self.format) and counting.count != file.size:
            raise PartnerDataError(self.partner_id, f"read {where}", f"read {counting.count} bytes, the listing said "
                                   f"{file.size}: the file changed while it was read")
        if digest is not None and file.checksum is not None:
            algorithm, expected = file.checksum.split(":", 1)
            if digest.hexdigest() != expected:
                sink.reset()  # a resumed try must not keep what a damaged file staged
                named = "the full dump" if delivery.kind == layout.FULL else "the delta"
                raise PartnerNotReady(self.partner_id, f"read {where}", (
                    f"{named} of {format_instant(delivery.date)}: {file.path}: {algorithm} {digest.hexdigest()} "
                    f"does not match the published {expected} (still being uploaded, or damaged): nothing of "
                    "this run is applied, waiting for the partner to finish the upload"))
        log.info("%s: %s (%s of %s): %d items read (%d records, %d deleted, %d rejected so far in this piece)",
                 self.partner_id, file.path, delivery.kind, format_instant(delivery.date), read, stats.records,
                 stats.tombstones, stats.rejected)
        if audit and sink.conn is not None and sink.run is not None:
            deliveries.record_file(sink.conn, sink.run, deliveries.ReadFile(
                delivery.date, delivery.kind, file.path, file.size, file.etag, file.checksum, read))

    def _flush(self, page: list[HarvestItem], sink: StagingSink, stats: HarvestStats, at: int) -> None:
        if self._holds:
            self._keep_stamps(page, sink)
        for item in page:
            stats.add(item)
        stats.pages += 1
        sink.write_page(page, checkpoint=at)

    def _keep_stamps(self, page: list[HarvestItem], sink: StagingSink) -> None:
        """A record a delivery restates unchanged keeps the stamp it is held with: a daily full
        dump is no daily change of every record (no upsert, no change-feed event)."""
        held = held_versions(sink.conn, self.partner_id, [i.identifier for i in page if isinstance(i, Record)])
        for index, item in enumerate(page):
            if isinstance(item, Record) and item.identifier in held:
                stamp, digest = held[item.identifier]
                if stamp < item.datestamp and digest == item.content_hash:
                    page[index] = msgspec.structs.replace(item, datestamp=stamp)

    def _progress(self, file: DeliveryFile, done: int, read: int, started: float, stats: HarvestStats) -> None:
        elapsed = max(time.monotonic() - started, 1e-6)
        log.info("%s: %s: %.0f of %.0f MB, %d items (%.0f items/s); %d staged in this piece", self.partner_id,
                 file.path, done / 1e6, file.size / 1e6, read, read / elapsed, stats.fetched)

    # -- reconcile -------------------------------------------------------------------------

    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """Every identifier of the chain (the newest full dump and the deltas after it), in date
        order: a deletion is listed deleted, any other item live."""
        facts = window.protocol.files or self._chain()
        for delivery, file in units_of(facts):
            items, _ = self.reader.read(self.storage, file.path, delivery.date, 0)
            rows: list[SweptId] = []
            for item, _ in items:
                rows.append((item.identifier, item.datestamp, isinstance(item, Tombstone)))
                if len(rows) >= PAGE_ITEMS:
                    stats.pages += 1
                    stats.fetched += len(rows)
                    sink.write_page(rows)
                    rows = []
            stats.pages += 1
            stats.fetched += len(rows)
            sink.write_page(rows)
        log.info("%s: reconcile sweep: %d identifiers from %s", self.partner_id, stats.fetched,
                 _describe(facts.deliveries) or "no delivery")

    def _chain(self) -> DeliveryFacts:
        facts = self.clock().protocol["files"]
        assert isinstance(facts, DeliveryFacts)
        return facts

    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """Missing records come back through one read of the deliveries (bulk_missing_threshold 0);
        what that read did not return is quarantined, saying so."""
        return [Rejected(identifier, "listed by the reconcile's sweep but not returned when the deliveries were read "
                         "again (changed in between?)", "", window.until, self.prefix) for identifier in identifiers]


def _fingerprint(delivery: Delivery) -> dict[str, tuple[int, str | None]]:
    return {file.path: (file.size, file.etag) for file in delivery.files}


def _describe(chain: Sequence[Delivery]) -> str:
    return ", ".join(f"{d.kind} {format_instant(d.date)} ({len(d.files)} file{'s' if len(d.files) != 1 else ''})"
                     for d in chain)
