"""Cutting a full harvest into slices of similar size when the repository announces no count.

``completeListSize`` is optional (OAI-PMH 2.0, 3.5). Without it, equal time ranges are as
uneven as the repository's history: records that cluster (a migration day, a bulk edit) or
fill only part of the range leave some slices with a few pages and others with most of the
list, and the run waits on the biggest (14,974 / 14,934 / 14,855 / 5,237 records in
four equal ranges). What a first ListIdentifiers page shows is enough to cut better:

- **a list not ordered by datestamp** (by identifier, as DSpace and EPrints list): the first
  page of the whole window is a sample of where the window's records are; the window is cut
  at the sample's quantiles (one request, which the plan made anyway to ask for a count);
- **a list ordered by datestamp**: the first page only shows the earliest records, so the
  window is cut into ``3 x slices`` equal time ranges first and the first page of each is
  read: a range that fits in one page is counted exactly, and the rest of a range whose page
  covered only its start is estimated from how much of it one page covered (500 headers
  reaching a tenth of the range: about 5,000 more). Then the rest of the ``6 x slices``
  probes (at most 32) read on where the biggest estimate is, one first page from where its
  last one reached: a burst inside a range makes its estimate poor, and reading on replaces
  it with headers. The cut is at the quantiles of what was read and estimated.

Either way the cut only steers sizes: the slices cover the window, each starting where the
one before ends (slicing.py), so a poor sample gives uneven slices, never missing records.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from partner_harvest.window import Slice, Window

MAX_RANGE_PROBES = 32
# A page whose adjacent headers ascend this often is read as ordered by datestamp (a list
# in random order ascends about half the time).
ORDERED_SHARE = 0.9


@dataclass(frozen=True)
class PageSample:
    """A range's first ListIdentifiers page: its headers' datestamps, in list order
    (unparseable ones left out), and whether a resumptionToken follows."""

    stamps: tuple[datetime, ...]
    more: bool


Sampler = Callable[[datetime | None, datetime], "PageSample | None"]  # (from_, until) -> its first page


@dataclass(frozen=True)
class _Segment:
    """``weight`` records estimated spread evenly over [lo, hi] (a point when lo == hi)."""

    lo: datetime
    hi: datetime
    weight: float


def ordered(stamps: tuple[datetime, ...]) -> bool:
    if len(stamps) < 3:
        return True
    rising = sum(1 for a, b in zip(stamps, stamps[1:]) if a <= b)
    return rising >= ORDERED_SHARE * (len(stamps) - 1)


def plan(window: Window, start: datetime | None, step: timedelta, count: int, sample: Sampler,
         probes: int = MAX_RANGE_PROBES) -> list[Slice]:
    """Up to ``count`` slices of the window of similar estimated size; [] keeps it whole
    (it fits in one page, or nothing could be read)."""
    whole = sample(window.from_, window.until)
    if whole is None or not whole.more or not whole.stamps or count < 2:
        return []
    if not ordered(whole.stamps):  # a sample: relative sizes only, no estimate of records
        return _cut(window, step, [_Segment(t, t, 1.0) for t in whole.stamps], count, estimates=False)
    lo = start if start is not None else min(whole.stamps)
    return _cut(window, step, _range_estimates(window, lo, step, min(6 * count, probes), sample), count)


def _range_estimates(window: Window, start: datetime, step: timedelta, budget: int,
                     sample: Sampler) -> list[_Segment]:
    """Segments of an ordered list: the first pages of equal time ranges (half the budget),
    then the rest of the budget on the range estimated biggest, one more first page each
    from where its last page reached (the estimate of a range with a burst in it is poor:
    reading on replaces it with headers)."""
    known: list[_Segment] = []
    open_: list[_Segment] = []  # the unread rest of a range whose first page had a token
    densities: list[float] = []  # headers per granule of each page with a token

    def read(lo: datetime, hi: datetime, first: bool) -> None:
        page = sample(window.from_ if first else lo, hi)
        if page is None:  # unknown: as dense as one page over the range (only steers the cut)
            known.append(_Segment(lo, hi, 1.0))
            return
        known.extend(_Segment(t, t, 1.0) for t in page.stamps)
        if page.more and page.stamps:
            reached = max(page.stamps)
            densities.append(len(page.stamps) / max((reached - lo) / step, 1.0))
            if reached + step <= hi:
                open_.append(_Segment(reached + step, hi, 0.0))

    def estimated(segment: _Segment) -> _Segment:
        """The rest of a range at the median density of the pages read: a page that ends in
        a burst would set a rest of weeks at the burst's density (far too many), a page of a
        trickle too few; the median is the typical stretch's."""
        density = statistics.median(densities) if densities else 0.0
        return _Segment(segment.lo, segment.hi, max(density * ((segment.hi - segment.lo) / step + 1), 1.0))

    parts = max(budget // 2, 2)
    granules = max(int((window.until - start) / step) + 1, 1)
    size = max(-(-granules // parts), 1)
    lo, used = start, 0
    while lo <= window.until:
        hi = min(lo + step * (size - 1), window.until)
        read(lo, hi, used == 0)
        used += 1
        lo = hi + step
    while open_ and used < budget:
        biggest = max(open_, key=lambda segment: estimated(segment).weight)
        open_.remove(biggest)
        read(biggest.lo, biggest.hi, False)
        used += 1
    return known + [estimated(segment) for segment in open_]


def _cut(window: Window, step: timedelta, segments: list[_Segment], count: int,
         estimates: bool = True) -> list[Slice]:
    """Boundaries at the estimate's quantiles, on granules, as slices that cover the window
    (each starts where the one before ends, as slicing._pieces)."""
    segments = sorted(segments, key=lambda s: (s.lo, s.hi))
    total = sum(s.weight for s in segments)
    if total <= 0:
        return []
    day = step >= timedelta(days=1)
    bounds: list[datetime] = []
    acc = 0.0
    targets = [total * k / count for k in range(1, count)]
    index = 0
    before: datetime | None = None  # where the segment before ends
    for segment in segments:
        while index < len(targets) and acc + segment.weight >= targets[index]:
            share = (targets[index] - acc) / segment.weight if segment.weight else 0.0
            at = segment.lo + (segment.hi - segment.lo) * share
            if segment.lo == segment.hi and before is not None and before < segment.lo:
                # a sampled stamp: cut between it and the one before, not on a record's own
                # granule (the boundary granule is in both slices)
                at = before + (segment.lo - before) / 2
            at = at.replace(microsecond=0)
            if day:
                at = at.replace(hour=0, minute=0, second=0)
            if at < window.until and (not bounds or at > bounds[-1]) and (window.from_ is None or at > window.from_):
                bounds.append(at)
            index += 1
        acc += segment.weight
        before = segment.hi
    if not bounds:
        return []
    edges = [*bounds, window.until]
    pieces: list[Slice] = []
    previous = 0.0
    for i, edge in enumerate(edges):
        upto = _weight_until(segments, edge) if i < len(bounds) else total
        pieces.append(Slice(from_=window.from_ if i == 0 else edges[i - 1], until=edge,
                            estimate=round(upto - previous) if estimates else None))
        previous = upto
    return pieces


def _weight_until(segments: list[_Segment], edge: datetime) -> float:
    """The estimated records stamped at or before ``edge``."""
    total = 0.0
    for s in segments:
        if s.hi <= edge:
            total += s.weight
        elif s.lo <= edge:
            total += s.weight * ((edge - s.lo) / (s.hi - s.lo))
    return total
