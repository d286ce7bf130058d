"""The Sierra adapter: change poll, separate deletion poll, and the MARC export full load.

Ordering of a deletion against edits: ``deletedDate`` is a day, so a tombstone is stamped
at the last second of that day (D 23:59:59Z). It beats every edit stamped on D or
earlier and loses to a version stamped after D (a record re-created later).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import date, datetime, time as dtime, timedelta, timezone
from typing import Any

from partner_harvest.adapters import ItemSink, PartnerClock
from partner_harvest.errors import ConfigurationError, HarvestError
from partner_harvest.records import HarvestItem, HarvestStats, Rejected, Tombstone
from partner_harvest.registry import Partner
from partner_harvest.sierra import marc
from partner_harvest.sierra.client import ExportRateLimited, SierraClient
from partner_harvest.window import SECONDS, Window, format_instant

log = logging.getLogger(__name__)

DEFAULT_FIELDS = ("id", "updatedDate", "createdDate", "deleted", "suppressed", "marc")
REQUIRED_FIELDS = ("id", "updatedDate", "marc")
DELETION_FIELDS = "id,deletedDate"
EXPORT_SIZE_CEILING = 99_999
TRUNCATION_SUSPECT = 0.95  # records this close to the ceiling may have lost their tail


def sierra_timestamp(value: datetime) -> str:
    """Sierra wants Z-suffixed UTC timestamps in date ranges."""
    return format_instant(value)


def parse_sierra_timestamp(text: str) -> datetime:
    return datetime.strptime(text.strip().replace("Z", ""), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def end_of_day(day: date) -> datetime:
    return datetime.combine(day, dtime(23, 59, 59), tzinfo=timezone.utc)


class SierraAdapter:
    """Harvests one Sierra catalogue through a :class:`SierraClient`."""

    fetch_chunk = 25  # ids per bibs?id=a,b,c request: long id lists fail on real servers

    def __init__(self, partner: Partner, client: SierraClient, *, sleep: Callable[[float], None] = time.sleep):
        self.partner = partner
        self.partner_id = partner.id
        self.client = client
        self.sleep = sleep
        self.fields = tuple(partner.fields) or DEFAULT_FIELDS
        missing = [f for f in REQUIRED_FIELDS if f not in self.fields]
        if missing:
            raise ConfigurationError(partner.id, "registry", f"'fields' must include {', '.join(missing)}")
        export = dict(partner.options.get("export", {}) or {})
        self.export_limit = int(export.pop("limit", partner.page_size))
        self.rate_limit_wait = float(export.pop("rate_limit_wait", 300))
        self.max_rate_limit_waits = int(export.pop("max_rate_limit_waits", 12))
        self.export_params = export  # passed through, e.g. mapping, locations

    # -- window ----------------------------------------------------------------------

    def clock(self) -> PartnerClock:
        now = self.client.server_time()
        log.info("%s: Sierra server clock %s", self.partner_id, format_instant(now))
        return PartnerClock(now=now, granularity=SECONDS, protocol={"fields": ",".join(self.fields)})

    def plan_channels(self, window: Window, cursors: dict[str, datetime | None]) -> dict[str, Any]:
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
            return {"deletions": {"from": None, "until": until_day.isoformat(), "skip": True}}
        start = min(start, until_day)
        return {"deletions": {"from": start.isoformat(), "until": until_day.isoformat(), "skip": False}}

    # -- changes ---------------------------------------------------------------------

    def harvest(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        if window.is_full:
            self._export_full_load(window, sink, stats)
        else:
            self._change_poll(window, sink, stats)

    def _change_poll(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        assert window.from_ is not None
        params = {
            "deleted": "false",
            "updatedDate": f"[{sierra_timestamp(window.from_)},{sierra_timestamp(window.until)}]",
            "fields": ",".join(self.fields),
        }
        for entries in self.client.bib_pages(params, self.partner.page_size):
            items = [self._entry_to_item(entry) for entry in entries]
            self._write(items, sink, stats, "changes")

    def _entry_to_item(self, entry: dict[str, Any]) -> HarvestItem:
        bib_id = str(entry.get("id", "")).strip() or "(missing id)"
        if entry.get("deleted") is True:
            # Older Sierra versions return deleted stubs (id, deleted, deletedDate) here.
            return self._tombstone(entry, bib_id)
        try:
            updated = parse_sierra_timestamp(str(entry["updatedDate"]))
        except (KeyError, ValueError):
            return Rejected(bib_id, f"bib without a usable updatedDate: {entry.get('updatedDate')!r}", _json(entry))
        if not entry.get("marc"):
            return Rejected(bib_id, "bib without its 'marc' field", _json(entry), updated, marc.PREFIX)
        try:
            record = marc.from_marc_json(entry["marc"])
        except Exception as exc:
            return Rejected(bib_id, f"MARC-in-JSON unreadable: {type(exc).__name__}: {exc}", _json(entry), updated, marc.PREFIX)
        return marc.to_item(record, bib_id, updated)

    def _tombstone(self, entry: dict[str, Any], bib_id: str) -> HarvestItem:
        try:
            day = date.fromisoformat(str(entry["deletedDate"])[:10])
        except (KeyError, ValueError):
            return Rejected(bib_id, f"deleted bib without a usable deletedDate: {entry.get('deletedDate')!r}", _json(entry))
        return Tombstone(bib_id, end_of_day(day))

    # -- deletions -------------------------------------------------------------------

    def poll_deletions(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        plan = (window.protocol.get("channels") or {}).get("deletions")
        if not plan or plan.get("skip"):
            log.info("%s: no deletion poll for this window (full load from scratch)", self.partner_id)
            return
        params = {"deleted": "true", "deletedDate": f"[{plan['from']},{plan['until']}]", "fields": DELETION_FIELDS}
        for entries in self.client.bib_pages(params, self.partner.page_size):
            items = [self._tombstone(entry, str(entry.get("id", "")).strip() or "(missing id)") for entry in entries]
            self._write(items, sink, stats, "deletions")

    # -- full load -------------------------------------------------------------------

    def _export_full_load(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        """Keyset over id ranges through the two-phase export; 138 waits and resumes."""
        cursor = 0
        waits = 0
        while True:
            try:
                block = self.client.export_block(cursor, self.export_limit, self.export_params)
            except ExportRateLimited as exc:
                waits += 1
                if waits > self.max_rate_limit_waits:
                    raise
                log.warning("%s: export rate limited (%s); waiting %.0f s, then resuming at id %d (wait %d of %d)",
                            self.partner_id, exc.cause, self.rate_limit_wait, cursor, waits, self.max_rate_limit_waits)
                self.sleep(self.rate_limit_wait)
                continue
            if block is None:
                return
            items, last_id = self._block_items(block, window)
            self._write(items, sink, stats, "export")
            output = int(block.summary.get("outputRecords") or 0)
            if last_id is None or output < self.export_limit:
                return
            if last_id + 1 <= cursor:
                raise HarvestError(self.partner_id, f"bibs/marc id=[{cursor},]", "export ids did not ascend")
            cursor = last_id + 1

    def _block_items(self, block: Any, window: Window) -> tuple[list[HarvestItem], int | None]:
        parsed = list(marc.read_iso2709(block.marc))
        suspects: set[int] = set()
        if block.errors:
            suspects = {i for i, (_, raw, _) in enumerate(parsed) if len(raw) >= EXPORT_SIZE_CEILING * TRUNCATION_SUSPECT}
            if len(suspects) < block.errors:
                log.warning("%s: export reported %d errors but only %d records are near the size ceiling; "
                            "re-fetching the whole block one by one", self.partner_id, block.errors, len(suspects))
                suspects = set(range(len(parsed)))
        items: list[HarvestItem] = []
        last_id: int | None = None
        for index, (record, raw, problem) in enumerate(parsed):
            bib_id = marc.bib_id_of(record) if record is not None else None
            if bib_id and bib_id.isdigit():
                last_id = max(last_id or 0, int(bib_id))
            if record is None or not bib_id:
                items.append(Rejected(bib_id or "(unreadable export record)", problem or "MARC: no bib id (907/001)",
                                      raw.decode("latin-1")[:200000], None, marc.PREFIX))
                continue
            stamp = marc.stamp_of(record) or window.until
            if index in suspects:
                items.append(self._refetch(bib_id, stamp))
            else:
                items.append(marc.to_item(record, bib_id, stamp))
        return items, last_id

    def _refetch(self, bib_id: str, stamp: datetime) -> HarvestItem:
        """A record the export may have truncated: fetch it whole, or quarantine it."""
        try:
            record = marc.from_marc_json(self.client.bib_marc_json(bib_id))
        except (HarvestError, ValueError) as exc:
            cause = exc.cause if isinstance(exc, HarvestError) else str(exc)
            return Rejected(bib_id, f"truncated in the bibs/marc export and the re-fetch failed: {cause}",
                            "", stamp, marc.PREFIX)
        log.info("%s: bib %s was truncated by the export; re-fetched it whole", self.partner_id, bib_id)
        return marc.to_item(record, bib_id, marc.stamp_of(record) or stamp)

    # -- reconcile -------------------------------------------------------------------

    def sweep_ids(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        """Every live bib id (keyset, ``fields=id``): the upstream set for a reconcile."""
        for entries in self.client.bib_pages({"deleted": "false", "fields": "id"}, self.partner.page_size):
            stats.pages += 1
            rows = [(str(e["id"]), None, False) for e in entries if e.get("id")]
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
            items.extend(self._entry_to_item(entry) for entry in body.get("entries") or [])
        return items

    # -- shared ----------------------------------------------------------------------

    def _write(self, items: list[HarvestItem], sink: ItemSink, stats: HarvestStats, what: str) -> None:
        stats.pages += 1
        for item in items:
            stats.add(item)
        sink.write_page(items)
        log.info("%s: %s page %d: %d items; %d fetched (%d records, %d deleted, %d rejected)",
                 self.partner_id, what, stats.pages, len(items), stats.fetched, stats.records,
                 stats.tombstones, stats.rejected)


def _json(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False, sort_keys=True)[:200000]

