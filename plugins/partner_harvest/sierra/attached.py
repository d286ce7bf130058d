"""Sierra items and holdings: the records attached to bibs, on channels of their own.

Each kind (``items``, ``holdings``; options.sierra.channels) has a change poll and a deletion
poll, each on its own cursor (sierra/spec.py). What Sierra does to them, and what we do:

- An item changes without its bib (a checkout moves its status and due date, a transfer its
  location): its own ``updatedDate``, polled in its own window (``updatedDate=[from,until]``,
  keyset by id, explicit fields, 404/107 is zero).
- It can be unlinked from one bib and linked to another (``bibIds`` changes): the new version
  names its bibs, and the apply turns both the old and the new bibs into feed events
  (store/attached.py).
- Deleted ones answer the separate ``deleted=true&deletedDate=[day,day]`` poll (dates only,
  on a day cursor with the partner's ``deletion_overlap_days``), and older servers also list
  deleted stubs (``deleted: true``, ``deletedDate``, empty ``bibIds``) inside a change window:
  both are tombstones at the end of their day, as a bib's.
- ``suppressed: true`` follows options.sierra.suppressed as bibs do: purge (a deletion with
  the reason ``suppressed``), flag (held with the warning) or keep.
- ``fixedFields`` and ``varFields`` values are numbers on one server and strings on another,
  ids and ``bibIds`` JSON numbers or strings (recorded holdings): the entry is kept as the
  server gave it (``items.content``); only ids are read, as text.
- No export exists for items: a load without a cursor lists every live one by keyset over
  id ranges (window.Slice, as the bibs' full load), resuming after what an earlier try
  staged; then the held ones it did not list are purged (reason ``reconcile``), unless that
  is more than the partner's ``max_purge_fraction`` (the weekly reconcile then decides).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from partner_harvest.adapters import IdSink, StagingSink, SweptId
from partner_harvest.formats.checks import Finding
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.sierra import resume
from partner_harvest.store import attached as store
from partner_harvest.window import ChannelPlan, Slice, Window, format_instant

if TYPE_CHECKING:
    from partner_harvest.sierra.harvester import SierraAdapter

log = logging.getLogger(__name__)

PREFIX = "json"  # what an attached record's metadata is
SUPPRESSED = "suppressed"
UNLISTED = "reconcile"  # deletions.reason of a held item a full listing no longer holds


@dataclass(frozen=True)
class Kind:
    """One kind of attached record: its API path, fields, channels and table."""

    entity: str  # items, holdings: the table and the change channel's name
    path: str  # /items, /holdings
    letter: str  # Sierra's record-type letter (i, c): quarantined entries are named by it
    fields: tuple[str, ...]
    deletions: str  # its deletion poll's channel

    @property
    def noun(self) -> str:
        return "item" if self.entity == "items" else "holdings record"


def kinds_of(adapter: SierraAdapter) -> dict[str, Kind]:
    """The partner's attached kinds by channel name (both polls of each)."""
    options = adapter.partner.options.sierra
    out: dict[str, Kind] = {}
    for entity, letter, fields, deletions in (("items", "i", options.item_fields, "item_deletions"),
                                              ("holdings", "c", options.holding_fields, "holding_deletions")):
        if entity in options.channels:
            kind = Kind(entity, f"/{entity}", letter, tuple(fields), deletions)
            out[entity] = out[deletions] = kind
    return out


def ident(value: Any) -> str:
    """An id as text: JSON numbers and strings alike, padding stripped, the last segment of a link."""
    text = str(value).strip()
    return text.rsplit("/", 1)[-1] if "/" in text else text


class AttachedPolls:
    """The items and holdings channels of one Sierra adapter."""

    def __init__(self, adapter: SierraAdapter):
        self.adapter = adapter
        self.client = adapter.client
        self.partner_id = adapter.partner_id
        self.kinds = kinds_of(adapter)

    # -- items as records ------------------------------------------------------------

    def to_item(self, kind: Kind, entry: dict[str, Any], fallback: datetime) -> HarvestItem:
        """One list entry as a record of the kind's table, a deletion, or a reject."""
        from partner_harvest.sierra.harvester import end_of_day, parse_sierra_timestamp

        raw_id = entry.get("id")
        item_id = ident(raw_id) if raw_id is not None else ""
        raw = _json(entry)
        if not item_id:
            return Rejected(f"{kind.letter}(missing id)", f"{kind.noun} without an id", raw, None, f"sierra-{kind.entity}")
        if entry.get("deleted") is True:
            try:
                day = datetime.fromisoformat(str(entry["deletedDate"])[:10]).date()
            except (KeyError, ValueError):
                return Rejected(f"{kind.letter}{item_id}", f"deleted {kind.noun} without a usable deletedDate: "
                                f"{entry.get('deletedDate')!r}", raw, None, f"sierra-{kind.entity}")
            return Tombstone(item_id, end_of_day(day), entity=kind.entity)
        try:
            updated = parse_sierra_timestamp(str(entry["updatedDate"]))
        except (KeyError, ValueError):
            updated = fallback  # as a bib without one: stamped with the window's until
        suppressed = entry.get("suppressed") is True
        if suppressed and self.adapter.suppressed == "purge":
            return Tombstone(item_id, updated, SUPPRESSED, entity=kind.entity)
        bib_ids = entry.get("bibIds")
        if not isinstance(bib_ids, list):
            return Rejected(f"{kind.letter}{item_id}", f"{kind.noun} without its bibIds (a list), in an answer of "
                            f"fields {', '.join(sorted(entry)[:8])}", raw, updated, f"sierra-{kind.entity}")
        parents = tuple(sorted({ident(b) for b in bib_ids if str(b).strip()}))
        warnings: tuple[Finding, ...] = ()
        if suppressed and self.adapter.suppressed == "flag":
            warnings = (Finding("sierra.suppressed", f"the {kind.noun} is suppressed in the catalogue (not public)"),)
        return Record(item_id, updated, PREFIX, raw, warnings=warnings, entity=kind.entity, parents=parents)

    # -- the channels ----------------------------------------------------------------

    def harvest(self, channel: str, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        kind = self.kinds.get(channel)
        if kind is None:
            raise ValueError(f"{self.partner_id}: no Sierra channel {channel!r} (options.sierra.channels)")
        plan = window.protocol.channels.get(channel)
        if plan is None or plan.skip:
            log.info("%s: no %s poll for this window (a first load: it starts with the next run)",
                     self.partner_id, channel)
            return
        if plan.from_ is None:
            self.full_load(kind, plan.until, sink, stats)
            return
        path, params = self.poll(channel, plan)
        deletions = channel == kind.deletions
        for entries in self.client.pages(path, params, self.adapter.partner.page_size):
            self.adapter.write([self.to_item(kind, {**e, "deleted": True} if deletions else e, plan.until)
                                for e in entries], sink, stats, channel)

    def poll(self, channel: str, plan: ChannelPlan) -> tuple[str, dict[str, Any]]:
        """The path and query of a channel's poll in its window (the harvest's and the quiet
        night's look alike): the deletion poll's days, or the change poll's updatedDate range."""
        kind = self.kinds[channel]
        assert plan.from_ is not None
        if channel == kind.deletions:
            days = f"[{plan.from_.date().isoformat()},{plan.until.date().isoformat()}]"
            return kind.path, {"deleted": "true", "deletedDate": days, "fields": "id,deletedDate"}
        return kind.path, {"deleted": "false", "fields": ",".join(kind.fields),
                           "updatedDate": f"[{format_instant(plan.from_)},{format_instant(plan.until)}]"}

    def plan_ranges(self, kind: Kind, start: int, until: datetime) -> list[Slice]:
        """The id ranges a full listing walks (window.Slice, as the bibs' full load): one
        open-ended range for a small kind, else ranges of about ``slicing.target_records``
        over the span ``fields=id&limit=1`` probes find; the last one open-ended."""
        settings = self.adapter.partner.slicing
        low = self.first_id(kind, start)
        if low is None:
            return []
        above = self.first_id(kind, low + settings.threshold_records)
        if above is None or settings.max_slices < 2:
            return [Slice(until=until, lo=start, hi=None)]
        high, step = above, max(1, settings.threshold_records)
        while (found := self.first_id(kind, high + step)) is not None:
            high, step = found, step * 2
        count = min(settings.max_slices, max(2, math.ceil((high + step - low) / settings.target_records)))
        size = math.ceil((high + step - low) / count)
        return [Slice(until=until, lo=start if i == 0 else low + i * size,
                      hi=None if i == count - 1 else low + (i + 1) * size - 1, estimate=size) for i in range(count)]

    def first_id(self, kind: Kind, start: int) -> int | None:
        body = self.client.get_json(kind.path, {"fields": "id", "limit": 1, "id": f"[{start},]", "deleted": "false"},
                                    empty_ok=True)
        entries = (body or {}).get("entries") or []
        try:
            return int(ident(entries[0]["id"])) if entries else None
        except (KeyError, TypeError, ValueError):
            return None

    def full_load(self, kind: Kind, until: datetime, sink: StagingSink, stats: HarvestStats) -> None:
        """Every live one, by id ranges, after what an earlier try of this run staged; then
        the held ones it did not list are purged (guarded)."""
        start = self._resume_point(sink, stats)
        ranges = self.plan_ranges(kind, start, until)
        log.info("%s: listing every %s from id %d in %d id range(s)", self.partner_id, kind.noun, start, len(ranges))
        params = {"deleted": "false", "fields": ",".join(kind.fields)}
        for piece in ranges:
            for entries in self.client.pages(kind.path, params, self.adapter.partner.page_size,
                                             start_id=piece.lo or 0, end_id=piece.hi):
                self.adapter.write([self.to_item(kind, e, until) for e in entries], sink, stats, kind.entity)
        self._purge_unlisted(kind, until, sink, stats)

    def _resume_point(self, sink: StagingSink, stats: HarvestStats) -> int:
        kept = resume.resume_after(sink, stats)
        if kept is None:
            return 0
        log.info("%s: resuming the listing of %s after id %s (%d staged by an earlier try)", self.partner_id,
                 sink.run.channel if sink.run else "?", kept.max_id, kept.count)
        return (kept.max_id + 1) if kept.max_id is not None else 0

    def _purge_unlisted(self, kind: Kind, until: datetime, sink: StagingSink, stats: HarvestStats) -> None:
        """The held ones a complete listing did not return: gone upstream, purged as a reconcile
        would (dated at the held version), unless that is more than max_purge_fraction."""
        if sink.conn is None or sink.run is None:
            return
        held, unlisted = store.unlisted(sink.conn, sink.run, kind.entity)
        if not unlisted:
            return
        limit = self.adapter.partner.max_purge_fraction
        if held and len(unlisted) / held > limit:
            log.warning("%s: the listing of every %s left out %d of the %d held (over max_purge_fraction %.0f%%): "
                        "none purged here; the weekly reconcile (with its guard) decides", self.partner_id,
                        kind.noun, len(unlisted), held, limit * 100)
            return
        for start in range(0, len(unlisted), 1000):
            chunk = unlisted[start:start + 1000]
            self.adapter.write([Tombstone(i, stamp, UNLISTED, entity=kind.entity) for i, stamp in chunk],
                               sink, stats, f"{kind.entity} no longer listed")

    # -- reconcile -------------------------------------------------------------------

    def kind_of_entity(self, entity: str) -> Kind:
        kind = self.kinds.get(entity)
        if kind is None:
            raise ValueError(f"{self.partner_id}: the partner has no {entity} (options.sierra.channels)")
        return kind

    def sweep(self, entity: str, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """Every live id of the kind (public ones only with suppressed: purge), by id ranges."""
        kind = self.kind_of_entity(entity)
        params = {"deleted": "false", "fields": "id"}
        if self.adapter.suppressed == "purge":
            params["suppressed"] = "false"
        for piece in self.plan_ranges(kind, 0, window.until):
            for entries in self.client.pages(kind.path, params, 2000, start_id=piece.lo or 0, end_id=piece.hi):
                stats.pages += 1
                rows: list[SweptId] = [(ident(e["id"]), None, False) for e in entries if e.get("id") is not None]
                stats.fetched += len(rows)
                sink.write_page(rows)
        log.info("%s: reconcile sweep of %s: %d live ids in %d pages", self.partner_id, entity, stats.fetched,
                 stats.pages)

    def fetch(self, kind: Kind, identifiers: list[str], until: datetime) -> list[HarvestItem]:
        """The current version of each id, 25 per ``GET items?id=a,b,c``."""
        out: list[HarvestItem] = []
        chunk_size = self.adapter.fetch_chunk
        for start in range(0, len(identifiers), chunk_size):
            chunk = identifiers[start:start + chunk_size]
            params = {"id": ",".join(chunk), "fields": ",".join(kind.fields), "deleted": "false", "limit": len(chunk)}
            body = self.client.get_json(kind.path, params, empty_ok=True) or {}
            out.extend(self.to_item(kind, e, until) for e in body.get("entries") or [])
        return out


def _json(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False, sort_keys=True)

