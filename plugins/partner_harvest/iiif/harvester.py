"""The IIIF Change Discovery adapter: walk the stream backwards, fetch what changed.

The window: the upper bound is the newest activity on the last page when the window froze
(``WindowFacts.iiif``, microseconds kept); activities appended later belong to the next
run. The lower bound is the window's ``from`` (the cursor minus the lag): the walk stops
at the first activity older than it (spec 3.5.2). Walking newest first, the first activity
seen for an object wins (a Delete after a Create is a tombstone, a re-Create after a
Delete lands); a Move is a tombstone for its object and a record for its target; a
Refresh ends a full harvest and turns an incremental one to Delete activities only.

In an incremental window a version the mirror already holds (same or newer stamp) is not
fetched again, so the window's overlap costs no descriptions: a night with k changes fetches
k descriptions. A full harvest fetches every description: what it does not stage counts as
not returned by the partner (the shrink gate), and an edit published without an activity
is picked up.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from lxml import etree

from partner_harvest.adapters import Adapter, IdSink, PartnerClock, StagingSink, SweptId
from partner_harvest.durations import human
from partner_harvest.errors import ConfigurationError, HarvestLoopError, PartnerDataError
from partner_harvest.formats import JSON_FORMATS, get_format
from partner_harvest.formats.base import checked_by
from partner_harvest.formats.checks import policy_of
from partner_harvest.formats.linked_art import NotAJsonRecord, load
from partner_harvest.iiif.client import Fetched, IiifClient
from partner_harvest.iiif.slicing import cut, walk_chain
from partner_harvest.iiif.spec import SeeAlsoChoice
from partner_harvest.iiif.stream import (
    INCLUSIONS,
    REMOVALS,
    Activity,
    Description,
    Page,
    SeeAlso,
    choose,
    format_time,
    parse_time,
)
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.registry import Partner, SliceSettings
from partner_harvest.store import slices
from partner_harvest.store.staging import held_stamps
from partner_harvest.window import SECONDS, IiifEntry, IiifFacts, Slice, Window
from partner_harvest.xmlsafe import XmlInputError, parse_document

log = logging.getLogger(__name__)

CHECK_KIND = "iiif-total-items"
SLICE_CHECK_KIND = "iiif-slice-pages"
MAX_TAIL = 1000  # a last page this long is read again by the harvest instead of frozen whole


@dataclass(frozen=True)
class Wanted:
    """One object's newest activity in the window that needs its description."""

    identifier: str
    when: datetime
    description: Description | None
    offered: tuple[SeeAlso, ...]


class IiifAdapter(Adapter):
    """Harvests one IIIF Change Discovery stream through an :class:`IiifClient`."""

    def __init__(self, partner: Partner, client: IiifClient):
        super().__init__(partner)
        self.client = client
        options = partner.options.iiif
        self.concurrency = max(1, min(options.description_concurrency, partner.pool_slots))
        self.object_types = frozenset(options.object_types)
        self.object_itself = options.object_itself
        self.validation = policy_of(partner.options.validation)
        prefix = partner.metadata_prefix
        if prefix == "auto":
            self.choices: tuple[SeeAlsoChoice, ...] = options.descriptions
        else:
            self.choices = tuple(c for c in options.descriptions if c.prefix == prefix) or (SeeAlsoChoice(prefix=prefix),)
        self._known: dict[str, Description | None] = {}  # the sweep's descriptions, for fetch_records
        self._known_when: dict[str, datetime] = {}
        self.descriptions_fetched = 0
        self.descriptions_skipped = 0  # versions the mirror already held

    # -- window ----------------------------------------------------------------------

    def clock(self) -> PartnerClock:
        """Two requests: the collection and its last page. The newest activity there is the
        run's upper bound; the page itself is frozen with it (a quiet night reads nothing more)."""
        collection = self.client.collection()
        page = self.client.page(collection.last)
        times = [a.when for a in page.items if a.when is not None]
        newest = max(times) if times else None
        tail = tuple(_entry(a) for a in page.items) if len(page.items) <= MAX_TAIL else None
        facts = IiifFacts(collection=collection.id, last_page=page.id, last_prev=page.prev, newest=format_time(newest) if newest else None,
                          total_items=collection.total_items, tail=tail)
        log.info("%s: stream %s: last page %s, newest activity %s, totalItems %s", self.partner_id, collection.id,
                 page.id, facts.newest or "(no endTime)", collection.total_items)
        return PartnerClock(now=newest or datetime.now(timezone.utc), granularity=SECONDS, protocol={"iiif": facts})

    # -- changes ---------------------------------------------------------------------

    def harvest(self, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        facts = self._facts(window)
        upper = parse_time(facts.newest) if facts.newest else None
        lower = window.from_
        piece = window.protocol.slice
        sliced = piece is not None and bool(piece.pages)
        processed: set[str] = set()
        if sliced and piece is not None and piece.resume_at is not None and sink.conn is not None and sink.run is not None:
            processed = slices.staged_identifiers(sink.conn, sink.run)  # its newer pages decided these
        pages = self._slice_pages(facts, piece) if sliced and piece is not None else enumerate(self._walk(facts))
        # A slice fetches one description at a time: up to pool_slots slices run at once, so the
        # partner sees no more descriptions in flight than an unsliced run's pool_slots.
        concurrency = 1 if sliced else self.concurrency
        only_delete = False
        counted = refreshes = skipped_kinds = 0
        reached_start = stopped_at_refresh = False
        witness = _SliceWitness() if sliced else None
        progress = _Progress(self.partner_id, piece) if sliced and piece is not None else None
        stream_ids = {facts.collection, self.client.collection_url}
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"iiif-{self.partner_id}") as pool:
            for position, page in pages:
                stop = False
                items: list[HarvestItem] = []
                wanted: list[Wanted] = []
                on_page = 0
                for activity in reversed(page.items):
                    if upper is not None and activity.when is not None and activity.when > upper:
                        continue  # appended after the window froze: the next run's
                    if lower is not None and activity.when is not None and activity.when < lower:
                        stop = True
                        break
                    on_page += 1
                    if activity.kind == "Refresh":
                        if lower is None:  # a full harvest: everything live is re-issued after it
                            stop = stopped_at_refresh = True
                            break
                        only_delete = True
                        refreshes += 1
                        continue
                    if not self._decide(activity, processed, only_delete, stream_ids, upper or window.until,
                                        items, wanted):
                        skipped_kinds += 1
                on_page += page.unusable
                counted += on_page
                items.extend(self._describe(pool, wanted, sink, every=window.is_full))
                stats.pages += 1
                for item in items:
                    stats.add(item)
                sink.write_page(items, checkpoint=position + 1 if sliced else None)  # a retry resumes at the next page
                if witness is not None and piece is not None:
                    witness.saw(position, on_page, piece.page_items[position - (piece.lo or 0)])
                if progress is not None:
                    progress.page(position, stats)
                else:
                    log.info("%s: page %s: %d items (%d descriptions fetched, %d already held); %d fetched so far "
                             "(%d records, %d deleted, %d rejected)", self.partner_id, page.id, len(items),
                             self.descriptions_fetched, self.descriptions_skipped, stats.fetched, stats.records,
                             stats.tombstones, stats.rejected)
                if stop:
                    break
                if page.prev is None:
                    reached_start = True
        if refreshes:
            log.warning("%s: the window crosses %d Refresh activit%s: before it only Delete activities were read; a "
                        "history the Refresh truncated may hide deletions until the reconcile's sweep", self.partner_id,
                        refreshes, "y" if refreshes == 1 else "ies")
        if skipped_kinds:
            log.info("%s: %d activities of other types or streams skipped", self.partner_id, skipped_kinds)
        if witness is not None and piece is not None:
            if piece.of_full:
                stats.checks.append(witness.check(piece))
        elif lower is None:
            stats.checks.append(self._witness(facts, counted, reached_start, stopped_at_refresh))

    # -- slices (a big first load) ---------------------------------------------------

    # A retried slice resumes at the page after its checkpoint, keeping what it staged
    # (pipeline.harvest_piece, store/slices.resumable).
    resumes_slices = True

    def plan_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """A full harvest of a big stream as ranges of its page chain (iiif/slicing.py): the
        plan walks the chain once (one request a page); [] keeps the run whole."""
        facts = window.protocol.iiif
        if not window.is_full or facts is None or settings.max_slices < 2:
            return []
        total = facts.total_items
        if total is None and settings.without_count < 2:
            log.info("%s: the stream announces no totalItems: the full harvest stays one chain "
                     "(slicing.without_count 1)", self.partner_id)
            return []
        if total is not None and total <= settings.threshold_records:
            return []
        upper = parse_time(facts.newest) if facts.newest else None
        chain, at_refresh = walk_chain(self._walk_urls(facts), upper)
        walked = sum(p.counted for p in chain)
        wanted = (min(settings.max_slices, math.ceil(walked / settings.target_records)) if total is not None
                  else min(settings.max_slices, settings.without_count))
        ranges = cut(chain, wanted)
        where = "its newest Refresh" if at_refresh else "its first page"
        if total is not None and not at_refresh and walked != total:
            log.warning("%s: the slice plan counted %d activities on %d pages back to %s, the stream announces "
                        "totalItems %d", self.partner_id, walked, len(chain), where, total)
        if len(ranges) < 2:
            log.info("%s: %d activities on %d pages back to %s: the full harvest stays one chain (%s)",
                     self.partner_id, walked, len(chain), where,
                     "no page boundary with strictly older activities behind it" if wanted >= 2 else "small enough")
            return []
        log.info("%s: the full harvest as %d slices of the stream's %d pages (%d activities back to %s)",
                 self.partner_id, len(ranges), len(chain), walked, where)
        return [Slice(until=window.until, lo=lo, hi=hi, estimate=sum(p.counted for p in chain[lo:hi + 1]),
                      pages=tuple(p.url for p in chain[lo:hi + 1]),
                      page_items=tuple(p.counted for p in chain[lo:hi + 1])) for lo, hi in ranges]

    def _walk_urls(self, facts: IiifFacts) -> Iterator[tuple[str, Page]]:
        """The chain with the URL each page was asked at (the plan keeps those)."""
        url = facts.last_page
        for page in self._walk(facts):
            yield url, page
            url = page.prev or ""

    def _slice_pages(self, facts: IiifFacts, piece: Slice) -> Iterator[tuple[int, Page]]:
        """The slice's pages as planned, from its checkpoint, each checked against the plan's
        chain: a page whose prev is not the next page planned means the stream was rebuilt."""
        lo = piece.lo or 0
        start = piece.resume_at if piece.resume_at is not None else lo
        if piece.resume_at is not None:
            log.info("%s: slice %s resumes at page %d of %d..%d", self.partner_id, piece.channel, start, lo, piece.hi)
        for position in range(start, lo + len(piece.pages)):
            url = piece.pages[position - lo]
            if position == 0 and facts.tail is not None:
                page = Page(id=facts.last_page, prev=facts.last_prev, items=tuple(_activity(e) for e in facts.tail))
            else:
                page = self.client.page(url)
            following = position - lo + 1
            if following < len(piece.pages) and page.prev != piece.pages[following]:
                raise PartnerDataError(self.partner_id, f"GET {url}", f"the stream changed since the slice plan: "
                                       f"the page links back to {page.prev}, the plan walked {piece.pages[following]} "
                                       "(a rebuilt stream): clear plan_slices to plan the run again")
            yield position, page

    def _facts(self, window: Window) -> IiifFacts:
        facts = window.protocol.iiif
        if facts is None:
            raise ConfigurationError(self.partner_id, "window", "the window was frozen without the stream's facts "
                                     "(WindowFacts.iiif): freeze it again")
        return facts

    def _walk(self, facts: IiifFacts) -> Iterator[Page]:
        """The frozen last page (from the facts when they hold it), then each prev page."""
        if facts.tail is not None:
            yield Page(id=facts.last_page, prev=facts.last_prev, items=tuple(_activity(e) for e in facts.tail))
            prev = facts.last_prev
        else:
            fetched = self.client.page(facts.last_page)
            yield fetched
            prev = fetched.prev
        seen = {facts.last_page}
        while prev is not None:
            if prev in seen:
                raise HarvestLoopError(self.partner_id, f"GET {prev}", "the stream's prev links form a loop")
            seen.add(prev)
            page = self.client.page(prev)
            yield page
            prev = page.prev

    def _decide(self, activity: Activity, processed: set[str], only_delete: bool, stream_ids: set[str],
                fallback: datetime, items: list[HarvestItem], wanted: list[Wanted]) -> bool:
        """Turn one activity (newest first) into a tombstone or a wanted description; False: not ours."""
        identifier = activity.object_id
        assert identifier is not None
        if self.object_types and activity.object_type not in self.object_types:
            return False
        when = activity.when or fallback
        kind = activity.kind
        if kind == "Remove" and activity.origin_id is not None and activity.origin_id not in stream_ids:
            return False
        if kind == "Add" and activity.target_id is not None and activity.target_id not in stream_ids:
            return False
        if identifier in processed and kind != "Move":
            return True
        if kind in REMOVALS:
            items.append(Tombstone(identifier, when))
            processed.add(identifier)
            return True
        if only_delete:  # behind a Refresh: a Move removed its old id too (its target is re-issued after it)
            if kind == "Move" and identifier not in processed:
                items.append(Tombstone(identifier, when))
                processed.add(identifier)
            return True
        if kind in INCLUSIONS:
            wanted.append(Wanted(identifier, when, self._choose(identifier, activity.see_also), activity.see_also))
            processed.add(identifier)
            return True
        if kind == "Move" and activity.target_id is not None:
            if identifier not in processed:
                items.append(Tombstone(identifier, when))
                processed.add(identifier)
            target = activity.target_id
            if target not in processed:
                offers = activity.target_see_also or activity.see_also
                wanted.append(Wanted(target, when, self._choose(target, offers), offers))
                processed.add(target)
            return True
        return False

    # -- descriptions ----------------------------------------------------------------

    def _choose(self, identifier: str, offers: tuple[SeeAlso, ...]) -> Description | None:
        """The preferred seeAlso; else the object's own id when options.iiif.object_itself names a format."""
        chosen = choose(offers, self.choices)
        if chosen is None and self.object_itself is not None:
            return Description(identifier, self.object_itself)
        return chosen

    def _describe(self, pool: ThreadPoolExecutor, wanted: list[Wanted], sink: StagingSink, *,
                  every: bool) -> list[HarvestItem]:
        """The wanted descriptions, fetched ``concurrency`` at a time; versions already held
        skipped unless ``every`` (a full harvest)."""
        held = {} if every else held_stamps(sink.conn, self.partner_id, [w.identifier for w in wanted])
        todo = [w for w in wanted if not (w.identifier in held and held[w.identifier] >= w.when)]
        self.descriptions_skipped += len(wanted) - len(todo)
        return list(pool.map(self._one, todo))

    def _one(self, wanted: Wanted) -> HarvestItem:
        desc = wanted.description
        if desc is None:
            offered = ", ".join(f"{o.url} ({o.format or '?'}, {o.profile or '?'})" for o in wanted.offered) or "none"
            return Rejected(wanted.identifier, "no seeAlso matches options.iiif.descriptions; offered: " + offered,
                            json.dumps([o.__dict__ for o in wanted.offered])[:20000], wanted.when, None)
        fetched = self.client.description(desc.url, desc.prefix)
        self.descriptions_fetched += 1
        return self.item(wanted.identifier, wanted.when, desc, fetched)

    def item(self, identifier: str, when: datetime, desc: Description, fetched: Fetched) -> HarvestItem:
        """A fetched description as a record, or its quarantine row naming the HTTP cause."""
        if not fetched.ok:
            reason = f"description GET {fetched.url}: {fetched.cause}"
            if fetched.status == 404:
                reason += " (the object's latest activity is not a Delete: quarantined, not deleted)"
                log.warning("%s: %s: %s", self.partner_id, identifier, reason)
            return Rejected(identifier, reason, "", when, desc.prefix)
        fmt = JSON_FORMATS.get(desc.prefix)
        if fmt is not None:
            try:
                document = load(fetched.body)
                text = fetched.body.decode("utf-8")
            except (NotAJsonRecord, UnicodeDecodeError) as exc:
                return Rejected(identifier, f"{desc.prefix} description {fetched.url} unreadable: {exc}",
                                fetched.body.decode("utf-8", "replace"), when, desc.prefix)
            checked = fmt.check_document(document)
        else:
            try:
                root = parse_document(fetched.body).root
            except XmlInputError as exc:
                return Rejected(identifier, f"{desc.prefix} description {fetched.url} unreadable: {exc}",
                                fetched.body.decode("utf-8", "replace"), when, desc.prefix)
            checked = checked_by(get_format(desc.prefix), root)
            text = etree.tostring(root, encoding="unicode")
        rejected, warnings = self.validation.judge(checked.findings)
        if rejected is not None:
            return Rejected(identifier, rejected.message, text, when, desc.prefix)
        if checked.repair is not None:
            checked.repair()
        return Record(identifier, when, desc.prefix, text, (), checked.title, warnings)

    # -- completeness ----------------------------------------------------------------

    def _witness(self, facts: IiifFacts, counted: int, reached_start: bool, at_refresh: bool) -> tuple:
        if at_refresh:
            return (CHECK_KIND, None, counted, True, f"stopped at the stream's Refresh after {counted} activities: "
                    "everything live is re-issued after it, so totalItems (the whole history) is no witness")
        if facts.total_items is None:
            return (CHECK_KIND, None, counted, True, f"the stream announces no totalItems: no second witness; "
                    f"{counted} activities read back to its first page")
        ok = reached_start and counted == facts.total_items
        return (CHECK_KIND, facts.total_items, counted, ok,
                f"totalItems {facts.total_items} when the window froze; {counted} activities on the pages walked"
                + ("" if reached_start else " (the walk did not reach the first page)"))

    # -- reconcile -------------------------------------------------------------------

    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """The live set from the whole stream (back to its Refresh, after which every live
        object is re-issued): each object's newest activity says live or gone."""
        facts = window.protocol.iiif or self._fresh_facts()
        upper = parse_time(facts.newest) if facts.newest else None
        seen: set[str] = set()
        stream_ids = {facts.collection, self.client.collection_url}
        for page in self._walk(facts):
            rows: list[SweptId] = []
            stop = False
            for activity in reversed(page.items):
                if upper is not None and activity.when is not None and activity.when > upper:
                    continue
                if activity.kind == "Refresh":
                    stop = True
                    break
                items: list[HarvestItem] = []
                wanted: list[Wanted] = []
                before = set(seen)
                if not self._decide(activity, seen, False, stream_ids, activity.when or window.until, items, wanted):
                    continue
                for item in items:
                    if item.identifier not in before:
                        rows.append((item.identifier, item.datestamp, True))
                for w in wanted:
                    self._known[w.identifier] = w.description
                    self._known_when[w.identifier] = w.when
                    rows.append((w.identifier, w.when, False))
            stats.pages += 1
            stats.fetched += len(rows)
            sink.write_page(rows)
            if stop:
                break
        log.info("%s: reconcile sweep: %d objects in %d pages", self.partner_id, stats.fetched, stats.pages)

    def _fresh_facts(self) -> IiifFacts:
        clock = self.clock()
        facts = clock.protocol["iiif"]
        assert isinstance(facts, IiifFacts)
        return facts

    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """The objects the aggregation lacks, by the descriptions the sweep found."""
        wanted: list[Wanted] = []
        items: list[HarvestItem] = []
        for identifier in identifiers:
            if identifier not in self._known:
                items.append(Rejected(identifier, "not listed live by this run's sweep of the stream", "",
                                      window.until, None))
                continue
            wanted.append(Wanted(identifier, self._known_when.get(identifier, window.until), self._known[identifier], ()))
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            items.extend(pool.map(self._one, wanted))
        return items


class _SliceWitness:
    """A slice's second witness (I12): its pages, read now, hold the activities the plan
    counted on them when it walked the chain (a resumed try checks the pages it read)."""

    def __init__(self) -> None:
        self.pages = self.expected = self.found = 0
        self.first: int | None = None
        self.differ: list[str] = []

    def saw(self, position: int, found: int, planned: int) -> None:
        self.first = position if self.first is None else self.first
        self.pages += 1
        self.expected += planned
        self.found += found
        if found != planned:
            self.differ.append(f"page {position}: {found} (planned {planned})")

    def check(self, piece: Slice) -> tuple:
        lo, hi = piece.lo or 0, (piece.lo or 0) + len(piece.pages) - 1
        resumed = f"; resumed at page {self.first}" if piece.resume_at is not None else ""
        detail = (f"pages {lo}..{hi}: {self.found} activities on the {self.pages} pages read, {self.expected} "
                  f"when the plan walked them{resumed}")
        if self.differ:
            detail += "; differ: " + ", ".join(self.differ[:5])
        return (SLICE_CHECK_KIND, self.expected, self.found, not self.differ, detail)


class _Progress:
    """A slice's progress in the log: pages done of its range, items, rate and time left."""

    def __init__(self, partner_id: str, piece: Slice) -> None:
        self.partner_id, self.piece = partner_id, piece
        self.lo = piece.lo or 0
        self.started = time.monotonic()
        self.start = piece.resume_at if piece.resume_at is not None else self.lo
        self.total = sum(piece.page_items)

    def page(self, position: int, stats: HarvestStats) -> None:
        done_pages = position - self.lo + 1
        done = sum(self.piece.page_items[:done_pages])
        this_try = sum(self.piece.page_items[self.start - self.lo:done_pages])
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = this_try / elapsed
        left = (self.total - done) / rate if rate > 0 else 0.0
        log.info("%s: slice %s: page %d of %d..%d (%d of %d pages, %d of %d activities); %d items staged "
                 "(%d records, %d deleted, %d rejected); %.0f activities/s, about %s left", self.partner_id,
                 self.piece.channel, position, self.lo, self.lo + len(self.piece.pages) - 1, done_pages,
                 len(self.piece.pages), done, self.total, stats.fetched, stats.records, stats.tombstones,
                 stats.rejected, rate, human(timedelta(seconds=round(left))))


def _entry(activity: Activity) -> IiifEntry:
    return IiifEntry(kind=activity.kind, when=format_time(activity.when) if activity.when else None,
                     object_id=activity.object_id, object_type=activity.object_type,
                     see_also=tuple((s.url, s.format, s.profile) for s in activity.see_also),
                     target_id=activity.target_id,
                     target_see_also=tuple((s.url, s.format, s.profile) for s in activity.target_see_also),
                     origin_id=activity.origin_id)


def _activity(entry: IiifEntry) -> Activity:
    return Activity(kind=entry.kind, when=parse_time(entry.when) if entry.when else None, object_id=entry.object_id,
                    object_type=entry.object_type, see_also=tuple(SeeAlso(*s) for s in entry.see_also),
                    target_id=entry.target_id, target_see_also=tuple(SeeAlso(*s) for s in entry.target_see_also),
                    origin_id=entry.origin_id)

