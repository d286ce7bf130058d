"""Cutting a big OAI-PMH window into datestamp slices of similar size.

The size of a range is the ``completeListSize`` its first ListIdentifiers page announces
(or the page's own length when the list fits in one page): one cheap request per probe.
The largest range is bisected in time, down to the repository's granularity, until every
slice holds about ``target_records`` or ``max_slices`` is reached. Slices are disjoint and
cover the frozen window: each starts one granule after the previous one ends (OAI-PMH
``from``/``until`` are inclusive). The counts only steer the cut; a repository whose count
is wrong (I13) gets uneven slices, never missing ones. Without any count, a full harvest
is cut into ``without_count`` equal time ranges.

Where the registry lists sets that partition the repository (``slicing.sets``), each set
is a slice over the whole window instead, but only when the sets' counts add up to the
whole list's: a record in no listed set, in two of them, or a deleted record the
repository no longer lists in its set would otherwise be missed or fetched twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from partner_harvest.oai.client import OaiClient
from partner_harvest.oai.errors import BadResumptionToken
from partner_harvest.oai.parse import DAY_GRANULARITY, format_datestamp
from partner_harvest.window import Window, floor_to, parse_instant

log = logging.getLogger(__name__)

Probe = Callable[..., "int | None"]  # (from_, until[, set_spec]) -> the list's size, or None


def granule(oai_granularity: str) -> timedelta:
    return timedelta(days=1) if oai_granularity == DAY_GRANULARITY else timedelta(seconds=1)


def list_size(client: OaiClient, prefix: str, set_spec: str | None, oai_granularity: str,
              from_: datetime | None, until: datetime) -> int | None:
    """How many headers ListIdentifiers lists for the range, from its first page alone."""
    pages = client.list_pages(
        "ListIdentifiers", metadata_prefix=prefix, set_spec=set_spec,
        from_=format_datestamp(from_, oai_granularity) if from_ else None,
        until=format_datestamp(until, oai_granularity),
    )
    try:
        page = next(iter(pages))
    except BadResumptionToken:  # cannot happen on a first page; counted as unknown
        return None
    finally:
        pages.close()  # type: ignore[attr-defined]
    if page.token is None:
        return len(page.items)
    return page.complete_list_size


def _considered(window: Window, settings: Any) -> bool:
    """A full harvest, or a window longer than ``long_window``, with slicing on."""
    long = window.until - window.from_ > settings.long_window if window.from_ else False
    return settings.max_slices >= 2 and (window.is_full or long)


def plan_by_sets(window: Window, settings: Any, probe: Probe, partner_id: str = "") -> list[dict[str, Any]] | None:
    """One slice per listed set, each over the whole window (from_, until, estimate, set_spec);
    [] when the window stays whole; None when no sets are listed or they cannot be trusted
    to partition this window's list (then it is planned by datestamp, and the log says why)."""
    if not settings.sets:
        return None
    if not _considered(window, settings):
        return []
    total = probe(window.from_, window.until)
    if total is not None and total <= settings.threshold_records:
        return []
    counts = {spec: probe(window.from_, window.until, spec) for spec in settings.sets}
    described = ", ".join(f"{spec}: {'unknown' if n is None else n}" for spec, n in counts.items())
    if total is None or None in counts.values():
        log.warning("%s: slicing.sets cannot be checked (the repository announces no completeListSize for %s); "
                    "slicing by datestamp instead", partner_id,
                    "the whole list" if total is None else "some sets")
        return None
    if sum(counts.values()) != total:
        log.warning("%s: the sets of slicing.sets do not partition the list: they hold %d records (%s), the whole "
                    "list %d (a record in no listed set or in two, or deleted records the repository no longer "
                    "lists in their set); slicing by datestamp instead", partner_id, sum(counts.values()),
                    described, total)
        return None
    kept = [spec for spec in settings.sets if counts[spec]]
    if len(kept) < 2:
        return None
    log.info("%s: %d records announced, in %d sets: %s", partner_id, total, len(kept), described)
    return [{"from_": window.from_, "until": window.until, "estimate": counts[spec], "set_spec": spec}
            for spec in kept]


def plan(window: Window, settings: Any, probe: Probe, partner_id: str = "") -> list[dict[str, Any]]:
    """The slices of ``window`` as dicts (from_, until, estimate); [] when it stays whole."""
    oai_granularity = window.protocol.get("oai_granularity", DAY_GRANULARITY)
    step = granule(oai_granularity)
    if not _considered(window, settings):
        return []
    start = window.from_ or _earliest(window)
    if start is None or start >= window.until:
        return []
    total = probe(window.from_, window.until)
    if total is None:
        count = settings.without_count if window.is_full else 1
        return _equal_ranges(window, start, step, min(count, settings.max_slices))
    if total <= settings.threshold_records:
        return []
    # ranges: [lo, hi, count, splittable]; the first keeps the window's own (open) start.
    ranges: list[list[Any]] = [[start, window.until, total, True]]
    probes = 1
    while len(ranges) < settings.max_slices:
        candidates = [r for r in ranges if r[3] and r[2] is not None and r[2] > settings.target_records]
        if not candidates:
            break
        biggest = max(candidates, key=lambda r: r[2])
        lo, hi, count, _ = biggest
        mid = floor_to(lo + (hi - lo) / 2, "day" if step == timedelta(days=1) else "seconds")
        if mid < lo or mid + step > hi:
            biggest[3] = False  # one granule: cannot be cut
            continue
        left = probe(None if lo == start and window.from_ is None else lo, mid)
        probes += 1
        if left is None:
            biggest[3] = False
            continue
        right = max(count - left, 0)
        index = ranges.index(biggest)
        ranges[index:index + 1] = [[lo, mid, left, True], [mid + step, hi, right, True]]
    ranges = [r for r in ranges if r[2] != 0 or len(ranges) == 1] or ranges[:1]
    ranges = _close_gaps(ranges, start, window.until, step)
    log.info("%s: %d records announced; %d slices after %d count probes: %s", partner_id,
             total, len(ranges), probes, ", ".join(str(r[2]) for r in ranges))
    if len(ranges) < 2:
        return []
    return [{"from_": window.from_ if i == 0 else r[0], "until": r[1], "estimate": r[2]}
            for i, r in enumerate(ranges)]


def _close_gaps(ranges: list[list[Any]], start: datetime, until: datetime, step: timedelta) -> list[list[Any]]:
    """Dropping empty ranges leaves gaps: each kept range starts right after the one before."""
    closed: list[list[Any]] = []
    for r in ranges:
        lo = start if not closed else closed[-1][1] + step
        closed.append([lo, r[1], r[2], r[3]])
    closed[-1][1] = until
    return closed


def _earliest(window: Window) -> datetime | None:
    text = window.protocol.get("earliest_datestamp")
    if not text:
        return None
    try:
        return parse_instant(text)
    except ValueError:
        return None


def _equal_ranges(window: Window, start: datetime, step: timedelta, count: int) -> list[dict[str, Any]]:
    """``count`` equal time ranges from ``start`` to until, on granule boundaries."""
    if count < 2:
        return []
    granules = int((window.until - start) / step) + 1  # both ends included
    count = min(count, granules)
    if count < 2:
        return []
    size = math.ceil(granules / count)
    pieces: list[dict[str, Any]] = []
    lo = start
    while lo <= window.until:
        hi = min(lo + step * (size - 1), window.until)
        pieces.append({"from_": window.from_ if not pieces else lo, "until": hi, "estimate": None})
        lo = hi + step
    return pieces
