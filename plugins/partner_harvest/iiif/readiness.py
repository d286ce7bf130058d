"""The readiness probes of an IIIF Change Discovery stream (readiness.py; declared in iiif/spec.py).

What a harvest relies on: the OrderedCollection (its ``last`` page, where every walk starts,
and ``totalItems``, a full harvest's second witness), the last page and the one before it
(the walk goes backwards by ``prev``), and the description of the newest object that is not
deleted: the seeAlso ``options.iiif.descriptions`` chooses, fetched and validated as a harvest
would. About four requests.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import cast

from partner_harvest.errors import HarvestError
from partner_harvest.iiif.harvester import IiifAdapter
from partner_harvest.iiif.stream import INCLUSIONS, Activity, Page
from partner_harvest.readiness import Probe, listed, one_line


def check(probe: Probe) -> None:
    adapter = cast(IiifAdapter, probe.adapter)
    client = adapter.client
    client.session_factory = None  # descriptions go through the check's paced session too
    try:
        collection = client.collection()
    except HarvestError as exc:
        probe.fail("stream", one_line(exc.cause), "the Connection's host must be the stream's OrderedCollection "
                   "(IIIF Change Discovery 1.0, 2.1)", "not-a-stream")
        return
    total = f"{collection.total_items} activities" if collection.total_items is not None else "no totalItems"
    probe.ok("stream", f"an OrderedCollection, last page {collection.last}, {total}")
    if collection.total_items is None:
        probe.info("totalItems", "the collection announces no totalItems: a full harvest has no second witness of "
                   "its count", "the publisher can add totalItems (optional in the specification)", "no-total-items")
    try:
        last = client.page(collection.last)
    except HarvestError as exc:
        probe.fail("pages", f"the last page: {one_line(exc.cause)}", "every harvest starts at the collection's last "
                   "page: it must answer", "page-failed")
        return
    pages = [last]
    if collection.first not in (None, collection.last) and last.prev is None:
        probe.fail("pages", f"the last page {last.id} has no prev link, though the stream's first page is another "
                   f"({collection.first})", "each page must link the one before it (prev): the harvest walks back "
                   "from the last page", "no-prev-link")
    elif last.prev is not None:
        try:
            pages.append(client.page(last.prev))
        except HarvestError as exc:
            probe.fail("pages", f"the page before the last ({last.prev}): {one_line(exc.cause)}",
                       "every page the prev links name must answer", "page-failed")
            return
    activities = [a for page in pages for a in page.items]
    unusable = sum(page.unusable for page in pages)
    kinds = sorted({a.kind for a in activities})
    probe.ok("pages", f"{len(pages)} page(s) read back from the last: {len(activities)} activities "
             f"({listed(kinds)})")
    if unusable:
        probe.warn("activities", f"{unusable} entries of the pages read are no activity (no type, or no object id)",
                   "each orderedItems entry needs a type and an object with an id", "unusable-activities")
    if not any(a.when for a in activities):
        probe.warn("activities", "no activity carries an endTime (or another time)", "the harvest freezes its window "
                   "on the newest endTime: the publisher must give them", "no-end-times")
    _description(probe, adapter, pages)


def _description(probe: Probe, adapter: IiifAdapter, pages: list[Page]) -> None:
    """The newest included object's description, as the harvest would fetch and judge it."""
    candidates: list[Activity] = [a for page in pages for a in reversed(page.items)
                                  if a.kind in INCLUSIONS and a.object_id is not None
                                  and (not adapter.object_types or a.object_type in adapter.object_types)]
    if not candidates:
        probe.info("description", "no Create or Update among the activities read: no description probed")
        return
    activity = candidates[0]
    identifier = cast(str, activity.object_id)
    chosen = adapter._choose(identifier, activity.see_also)
    if chosen is None:
        offered = listed([f"{o.url} ({o.format or '?'}, {o.profile or '?'})" for o in activity.see_also], 3) or "none"
        probe.fail("description", f"no seeAlso of {identifier} matches options.iiif.descriptions; offered: {offered}",
                   "set options.iiif.descriptions to what the stream offers, or options.iiif.object_itself when the "
                   "object's own id is its description", "no-description")
        return
    try:
        fetched = adapter.client.description(chosen.url, chosen.prefix)
    except HarvestError as exc:
        probe.fail("description", f"GET {chosen.url}: {one_line(exc.cause)}", "the descriptions must answer",
                   "description-failed")
        return
    if not fetched.ok:
        probe.fail("description", f"GET {chosen.url}: {one_line(fetched.cause)}", "an object the stream lists as "
                   "created or updated must have its description", "description-failed")
        return
    item = adapter.item(identifier, activity.when or datetime.now(timezone.utc), chosen, fetched)
    probe.ok("description", f"{identifier}: its {chosen.prefix} description {chosen.url} answers")
    probe.validated([item], "the description(s) fetched")

