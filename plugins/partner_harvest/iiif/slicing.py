"""Slices of a big first load of an IIIF Change Discovery stream: ranges of its page chain.

The specification links pages only by ``prev``/``next`` (page URLs need not be predictable,
and ``startIndex`` is optional), so the plan walks the chain once, from the frozen last page
back to the first page or the newest Refresh: one request per page, against the one
description request per changed object the slices make. Each slice is a run of
consecutive pages, its URLs kept in its ``harvest_runs`` row: a retried slice resumes at its
next page without walking the chain again.

Newest wins per object across slices through the apply's ordering by stamp, so a cut is put
only where every activity on the newer side is strictly newer than every activity on the
older side: equal endTimes across a page boundary (or an object's activities at one
instant) never straddle two slices, and the apply picks what the unsliced walk picks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from partner_harvest.iiif.stream import Activity, Page


@dataclass(frozen=True)
class ChainPage:
    """One page of the chain as the plan saw it."""

    url: str
    counted: int  # the activities a full harvest counts on it (the slice's witness compares them)
    newest: datetime | None
    oldest: datetime | None
    untimed: bool  # an activity without any time: the apply could not order it across slices


def counted_activities(page: Page, upper: datetime | None) -> tuple[list[Activity], bool]:
    """The activities a full harvest counts on ``page``, newest first (none appended after the
    window froze), and whether the walk stops there (at a Refresh: everything live is re-issued after it)."""
    counted: list[Activity] = []
    for activity in reversed(page.items):
        if upper is not None and activity.when is not None and activity.when > upper:
            continue
        counted.append(activity)
        if activity.kind == "Refresh":
            return counted, True
    return counted, False


def chain_page(url: str, page: Page, upper: datetime | None) -> tuple[ChainPage, bool]:
    activities, stops = counted_activities(page, upper)
    times = [a.when for a in activities if a.when is not None]
    return ChainPage(url, len(activities) + page.unusable, max(times) if times else None,
                     min(times) if times else None, len(times) < len(activities)), stops


def walk_chain(pages: Iterator[tuple[str, Page]], upper: datetime | None) -> tuple[list[ChainPage], bool]:
    """The chain newest first, to the first page or the newest Refresh (True: stopped at one)."""
    chain: list[ChainPage] = []
    for url, page in pages:
        seen, stops = chain_page(url, page, upper)
        chain.append(seen)
        if stops:
            return chain, True
    return chain, False


def cut(chain: list[ChainPage], slices: int) -> list[tuple[int, int]]:
    """About ``slices`` ranges of page positions ``(lo, hi)`` of near-equal activity counts,
    cut only where the newer side is strictly newer than the older; [] when fewer than two."""
    n = len(chain)
    if slices < 2 or n < 2 or any(p.untimed for p in chain):
        return []
    prefix_min: list[datetime | None] = []
    low: datetime | None = None
    for page in chain:
        if page.oldest is not None:
            low = page.oldest if low is None else min(low, page.oldest)
        prefix_min.append(low)
    suffix_max: list[datetime | None] = [None] * n
    high: datetime | None = None
    for index in range(n - 1, -1, -1):
        newest = chain[index].newest
        if newest is not None:
            high = newest if high is None else max(high, newest)
        suffix_max[index] = high
    allowed = [p for p in range(n - 1)
               if (a := prefix_min[p]) is None or (b := suffix_max[p + 1]) is None or a > b]
    cumulative: list[int] = []
    running = 0
    for page in chain:
        running += page.counted
        cumulative.append(running)
    cuts: list[int] = []
    for j in range(1, slices):
        target = running * j / slices
        candidates = [p for p in allowed if not cuts or p > cuts[-1]]
        if not candidates:
            break
        cuts.append(min(candidates, key=lambda p: (abs(cumulative[p] - target), p)))
    if not cuts:
        return []
    ranges: list[tuple[int, int]] = []
    start = 0
    for position in cuts:
        ranges.append((start, position))
        start = position + 1
    ranges.append((start, n - 1))
    return ranges
