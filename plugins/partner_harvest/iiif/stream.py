"""Reading an IIIF Change Discovery stream: the collection, its pages, their activities.

Only what the specification requires is required: the collection's ``last``; a page's
``orderedItems``; an activity's ``type`` and (except Refresh) ``object.id``. ``endTime`` is
only a SHOULD (an activity without one is kept and treated as new), ``totalItems``, ``first``,
``startIndex`` and ``seeAlso`` are optional, links may be objects or bare strings, ``seeAlso``
an object, a list or a bare URL, and datetimes may carry fractions or offsets (xsd:dateTime).
Properties this reader does not know are ignored, as the specification says they must be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from partner_harvest.iiif.spec import SeeAlsoChoice

REMOVALS = ("Delete", "Remove")
INCLUSIONS = ("Create", "Update", "Add")
# Where an activity's time is read, in order. endTime is the specification's (a SHOULD);
# the AS2 published/updated, and `created` (the Getty's stream of 2020, which had no endTime;
# tests/fixtures/iiif/getty-page.json), stand in for it, so such a stream still stops an
# incremental walk instead of being read to its first page every night.
_STAMPS = ("endTime", "startTime", "published", "updated", "created")
_DATETIME = re.compile(
    r"(-?\d{4,})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})?")


class StreamError(ValueError):
    """A collection or page lacks what the specification requires (one line, for the error)."""


def parse_time(text: object) -> datetime | None:
    """An xsd:dateTime as aware UTC (fractions kept to the microsecond, offsets applied; no
    zone read as UTC, which the specification mandates). None when absent or unreadable."""
    if not isinstance(text, str):
        return None
    match = _DATETIME.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        value = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                         int((fraction or "0")[:6].ljust(6, "0")), tzinfo=timezone.utc)
    except ValueError:
        return None
    if zone and zone not in ("Z", "z"):
        digits = zone[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        value -= offset if zone[0] == "+" else -offset
    return value


def format_time(value: datetime) -> str:
    """An instant with its microseconds, as the frozen bound keeps it."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def link(value: object) -> str | None:
    """A link's URI: an object with ``id`` (or ``@id``), or a bare string (both are AS2 links)."""
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, dict):
        uri = value.get("id", value.get("@id"))
        return uri.strip() or None if isinstance(uri, str) else None
    return None


@dataclass(frozen=True)
class SeeAlso:
    url: str
    format: str | None = None
    profile: str | None = None


@dataclass(frozen=True)
class Description:
    """The seeAlso chosen for an object: where to fetch it and the format it is stored as."""

    url: str
    prefix: str


@dataclass(frozen=True)
class Activity:
    kind: str
    when: datetime | None  # endTime; startTime for a Refresh; else the first of _STAMPS present
    object_id: str | None
    object_type: str | None = None
    see_also: tuple[SeeAlso, ...] = ()
    target_id: str | None = None  # Move: the new URI; Add: the stream added to
    target_see_also: tuple[SeeAlso, ...] = ()
    origin_id: str | None = None  # Remove: the stream removed from


@dataclass(frozen=True)
class Collection:
    id: str
    last: str
    first: str | None
    total_items: int | None


@dataclass(frozen=True)
class Page:
    id: str
    prev: str | None
    items: tuple[Activity, ...]
    start_index: int | None = None
    unusable: int = 0  # entries that are not activities (no type, or no object id)


def parse_collection(body: Any, url: str) -> Collection:
    if not isinstance(body, dict):
        raise StreamError("the collection is not a JSON object")
    kind = body.get("type")
    if kind == "OrderedCollectionPage":  # a one-page stream served as its page
        return Collection(id=link(body.get("id")) or url, last=link(body.get("id")) or url, first=None,
                          total_items=_count(body.get("totalItems")))
    last = link(body.get("last"))
    if last is None:
        raise StreamError(f"the collection (type {kind!r}) has no 'last' page link, which the specification requires")
    return Collection(id=link(body.get("id")) or url, last=last, first=link(body.get("first")),
                      total_items=_count(body.get("totalItems")))


def parse_page(body: Any, url: str) -> Page:
    if not isinstance(body, dict):
        raise StreamError("the page is not a JSON object")
    entries = body.get("orderedItems")
    if entries is None:
        entries = body.get("items")  # AS2 allows items; a lenient reader takes them in order
    if not isinstance(entries, list):
        raise StreamError("the page has no 'orderedItems' list, which the specification requires")
    items: list[Activity] = []
    unusable = 0
    for entry in entries:
        activity = parse_activity(entry)
        if activity is None:
            unusable += 1
        else:
            items.append(activity)
    return Page(id=link(body.get("id")) or url, prev=link(body.get("prev")), items=tuple(items),
                start_index=_count(body.get("startIndex")), unusable=unusable)


def parse_activity(entry: Any) -> Activity | None:
    if not isinstance(entry, dict):
        return None
    kind = entry.get("type")
    if isinstance(kind, list):  # JSON-LD allows several types; the first registered one counts
        kind = next((k for k in kind if isinstance(k, str)), None)
    if not isinstance(kind, str):
        return None
    when = parse_time(entry.get("startTime")) if kind == "Refresh" else None
    for stamp in _STAMPS:
        when = when or parse_time(entry.get(stamp))
    if kind == "Refresh":
        return Activity(kind, when, None)
    obj = entry.get("object")
    object_id = link(obj)
    if object_id is None:
        return None
    target = entry.get("target")
    return Activity(
        kind=kind, when=when, object_id=object_id,
        object_type=_type(obj), see_also=_see_also(obj),
        target_id=link(target), target_see_also=_see_also(target), origin_id=link(entry.get("origin")),
    )


def choose(see_also: tuple[SeeAlso, ...], choices: tuple[SeeAlsoChoice, ...]) -> Description | None:
    """The first preference any seeAlso matches (format by media type, parameters ignored;
    profile by substring), or None."""
    for choice in choices:
        for offer in see_also:
            media = (offer.format or "").split(";")[0].strip().lower()
            if choice.format is not None and not media.startswith(choice.format.lower()):
                continue
            if choice.profile is not None and choice.profile.lower() not in (offer.profile or "").lower():
                continue
            return Description(offer.url, choice.prefix)
    return None


def _see_also(obj: Any) -> tuple[SeeAlso, ...]:
    if not isinstance(obj, dict):
        return ()
    value = obj.get("seeAlso")
    offers = value if isinstance(value, list) else [value] if value is not None else []
    found: list[SeeAlso] = []
    for offer in offers:
        url = link(offer)
        if url is None:
            continue
        if isinstance(offer, dict):
            fmt, profile = offer.get("format"), offer.get("profile")
            found.append(SeeAlso(url, fmt if isinstance(fmt, str) else None,
                                 profile if isinstance(profile, str) else None))
        else:  # a bare URL: the object's own format/profile, if any, describe it (spec 4.3's example)
            fmt, profile = obj.get("format"), obj.get("profile")
            found.append(SeeAlso(url, fmt if isinstance(fmt, str) else None,
                                 profile if isinstance(profile, str) else None))
    return tuple(found)


def _type(obj: Any) -> str | None:
    kind = obj.get("type") if isinstance(obj, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if isinstance(k, str)), None)
    return kind if isinstance(kind, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
