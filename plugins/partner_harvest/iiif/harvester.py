"""The IIIF Change Discovery adapter: walk the stream backwards, fetch what changed.

The window: the upper bound is the newest activity on the last page when the window froze
(``WindowFacts.iiif``, microseconds kept); activities appended later belong to the next
run. The lower bound is the window's ``from`` (the cursor minus the lag): the walk stops
at the first activity older than it (spec 3.5.2). Walking newest first, the first activity
seen for an object wins (a Delete after a Create is a tombstone, a re-Create after a
Delete lands); a Move is a tombstone for its object and a record for its target; a
Refresh ends a full harvest and turns an incremental one to Delete activities only.

A version the mirror already holds (same or newer stamp) is not fetched again, so the
window's overlap costs no descriptions: a night with k changes fetches k descriptions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from lxml import etree

from partner_harvest.adapters import Adapter, IdSink, ItemSink, PartnerClock, SweptId
from partner_harvest.errors import ConfigurationError, HarvestLoopError
from partner_harvest.formats import JSON_FORMATS, get_format
from partner_harvest.formats.base import checked_by
from partner_harvest.formats.checks import policy_of
from partner_harvest.formats.linked_art import NotAJsonRecord, load
from partner_harvest.iiif.client import Fetched, IiifClient
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
from partner_harvest.registry import Partner, SeeAlsoChoice
from partner_harvest.store import StagingWriter
from partner_harvest.window import SECONDS, IiifEntry, IiifFacts, Window
from partner_harvest.xmlsafe import XmlInputError, parse_document

log = logging.getLogger(__name__)

CHECK_KIND = "iiif-total-items"
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

    def harvest(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        facts = self._facts(window)
        upper = parse_time(facts.newest) if facts.newest else None
        lower = window.from_
        processed: set[str] = set()
        only_delete = False
        counted = refreshes = skipped_kinds = 0
        reached_start = stopped_at_refresh = False
        stream_ids = {facts.collection, self.client.collection_url}
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"iiif-{self.partner_id}") as pool:
            for page in self._walk(facts):
                stop = False
                items: list[HarvestItem] = []
                wanted: list[Wanted] = []
                for activity in reversed(page.items):
                    if upper is not None and activity.when is not None and activity.when > upper:
                        continue  # appended after the window froze: the next run's
                    if lower is not None and activity.when is not None and activity.when < lower:
                        stop = True
                        break
                    counted += 1
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
                counted += page.unusable
                items.extend(self._describe(pool, wanted, sink))
                stats.pages += 1
                for item in items:
                    stats.add(item)
                sink.write_page(items)
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
        if lower is None:
            stats.checks.append(self._witness(facts, counted, reached_start, stopped_at_refresh))

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

    def _describe(self, pool: ThreadPoolExecutor, wanted: list[Wanted], sink: ItemSink) -> list[HarvestItem]:
        """The wanted descriptions, fetched ``concurrency`` at a time; versions already held skipped."""
        held = _held(sink, self.partner_id, [w.identifier for w in wanted])
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


def _held(sink: ItemSink, partner_id: str, identifiers: list[str]) -> dict[str, datetime]:
    """The stamps the mirror holds for ``identifiers`` (only a PostgreSQL staging sink knows)."""
    if not identifiers or not isinstance(sink, StagingWriter):
        return {}
    with sink.conn.transaction():
        rows = sink.conn.execute("SELECT identifier, datestamp FROM records WHERE partner_id = %s "
                                 "AND identifier = ANY(%s)", (partner_id, identifiers)).fetchall()
    return {row[0]: row[1] for row in rows}
