"""Cutting a big OAI-PMH window into datestamp slices of similar size.

The size of a range is the ``completeListSize`` its first ListIdentifiers page announces
(or the page's own length when the list fits in one page): one cheap request per probe.
The largest range is bisected in time, down to the repository's granularity, until every
slice holds about ``target_records`` or ``max_slices`` is reached. Slices cover the frozen
window and overlap by one granule: each starts where the previous one ends. OAI-PMH
``from``/``until`` are inclusive granules, so disjoint slices ``[.., m]`` and ``[m + 1 s, ..]``
would do, but a repository that stores sub-second stamps and compares them raw returns a
record stored at ``m + 0.5 s`` in neither (I13); with the overlap it is in the
second, and a record stamped ``m`` may come twice, which the apply merges (one version per
identifier). The counts only steer the cut; a repository whose count
is wrong (I13) gets uneven slices, never missing ones. Without any count, a full harvest
is cut into ``without_count`` equal time ranges. A repository without a usable
``earliestDatestamp`` (none, unparseable, or 1970, as real ones announce: I13) is bisected
from 1970: the empty halves before its first record cost a probe each, not a slice.

Where the registry lists sets that partition the repository (``slicing.sets``), the sets
are the first cut instead, but only when the sets' counts add up to the whole list's: a
record in no listed set, in two of them, or a deleted record the repository no longer
lists in its set would otherwise be missed or fetched twice. A set bigger than
``target_records`` is then bisected in time like a whole list (its own counts steer), so
a big set does not make one slice that is expensive to redo.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from partner_harvest.oai import sampled_cut
from partner_harvest.oai.client import OaiClient, WindowTooLarge
from partner_harvest.oai.errors import BadResumptionToken
from partner_harvest.oai.parse import DAY_GRANULARITY, OaiHeader, format_datestamp
from partner_harvest.registry import SliceSettings
from partner_harvest.spread import Spread, in_turn
from partner_harvest.window import Slice, Window, floor_to

log = logging.getLogger(__name__)

Probe = Callable[..., "int | None"]  # (from_, until[, set_spec]) -> the list's size, or None


# The plan's count probes are requests to the partner: a cap, whatever the counts say. Halving
# 1970..now down to a second takes 31; a plan of 8 slices from the epoch needs about 40.
_MAX_PROBES = 64
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # where a repository without a usable earliestDatestamp starts


def granule(oai_granularity: str) -> timedelta:
    return timedelta(days=1) if oai_granularity == DAY_GRANULARITY else timedelta(seconds=1)


def list_size(client: OaiClient, prefix: str, set_spec: str | None, oai_granularity: str,
              from_: datetime | None, until: datetime) -> int | None:
    """How many headers ListIdentifiers lists for the range, from its first page alone."""
    return first_page(client, prefix, set_spec, oai_granularity, from_, until)[0]


def first_page(client: OaiClient, prefix: str, set_spec: str | None, oai_granularity: str,
               from_: datetime | None, until: datetime) -> tuple[int | None, sampled_cut.PageSample | None]:
    """The range's size from its first ListIdentifiers page alone (None: not announced),
    and what the page shows of its datestamps (sampled_cut.py); one request (not pipelined: a
    second page asked for ahead would be wasted, and waited for when the chain closes)."""
    pages = client.list_pages(
        "ListIdentifiers", metadata_prefix=prefix, set_spec=set_spec,
        from_=format_datestamp(from_, oai_granularity) if from_ else None,
        until=format_datestamp(until, oai_granularity), ahead=False,
    )
    try:
        page = next(iter(pages))
    except BadResumptionToken:  # cannot happen on a first page; counted as unknown
        return None, None
    except WindowTooLarge as exc:  # unknown: the harvest bisects what the repository refuses
        log.info("a count probe was refused as too large (%s); that range's size is unknown", exc.cause)
        return None, None
    finally:
        pages.close()
    stamps = tuple(stamp for h in page.items if isinstance(h, OaiHeader) and (stamp := _stamp(h)) is not None)
    sample = sampled_cut.PageSample(stamps, page.token is not None)
    if page.token is None:
        return len(page.items), sample
    return page.complete_list_size, sample


def _stamp(header: OaiHeader) -> datetime | None:
    try:
        return header.datestamp
    except ValueError:
        return None


def _considered(window: Window, settings: SliceSettings) -> bool:
    """A full harvest, or a window longer than ``long_window``, with slicing on."""
    long = window.until - window.from_ > settings.long_window if window.from_ else False
    return settings.max_slices >= 2 and (window.is_full or long)


def plan_by_sets(window: Window, settings: SliceSettings, probe: Probe, partner_id: str = "",
                 spread: Spread = in_turn) -> list[Slice] | None:
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
    asked = dict(zip(settings.sets, spread(list(settings.sets), lambda spec: probe(window.from_, window.until, spec))))
    described = ", ".join(f"{spec}: {'unknown' if n is None else n}" for spec, n in asked.items())
    counts = {spec: n for spec, n in asked.items() if n is not None}
    if total is None or len(counts) < len(asked):
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
    start = window.from_ or _earliest(window) or EPOCH
    ranges = [_Range(start, window.until, counts[spec], spec, splittable=start < window.until) for spec in kept]
    probes = 1 + len(settings.sets) + _bisect(ranges, window, start, settings, probe, spread)
    pieces = [piece for spec in kept for piece in _pieces([r for r in ranges if r.set_spec == spec], window)]
    log.info("%s: %d records announced, in %d sets: %s; %d slices after %d count probes: %s", partner_id, total,
             len(kept), described, len(pieces), probes,
             ", ".join(f"{p.set_spec} {p.estimate}" for p in pieces))
    return pieces


def plan(window: Window, settings: SliceSettings, probe: Probe, partner_id: str = "",
         sample: sampled_cut.Sampler | None = None, spread: Spread = in_turn) -> list[Slice]:
    """The slices of ``window`` (from_, until, estimate); [] when it stays whole.

    ``sample``: a range's first page (the probe's, cached); with it, a full harvest of a
    repository without counts is cut by what its first pages show (sampled_cut.py), else
    into equal time ranges."""
    oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
    step = granule(oai_granularity)
    if not _considered(window, settings):
        return []
    announced = window.from_ or _earliest(window)
    if announced is not None and announced >= window.until:
        return []
    total = probe(window.from_, window.until)
    if total is None:
        count = min(settings.without_count if window.is_full else 1, settings.max_slices)
        if sample is not None and count >= 2:
            pieces = sampled_cut.plan(window, announced, step, count, sample, spread=spread)
            log.info("%s: no completeListSize; %d slices cut by what the first pages show: %s", partner_id,
                     len(pieces), ", ".join(f"..{p.until:%Y-%m-%dT%H:%M:%S} ~{p.estimate}" for p in pieces))
            return pieces if len(pieces) >= 2 else []
        if announced is None:  # neither a count nor a start: nothing to cut by
            return []
        return _equal_ranges(window, announced, step, count)
    if total <= settings.threshold_records:
        return []
    start = announced or EPOCH
    ranges = [_Range(start, window.until, total)]
    probes = 1 + _bisect(ranges, window, start, settings, probe, spread)
    pieces = _pieces(ranges, window)
    log.info("%s: %d records announced; %d slices after %d count probes: %s", partner_id,
             total, len(pieces), probes, ", ".join(str(p.estimate) for p in pieces))
    if len(pieces) < 2:
        return []
    return pieces


@dataclass
class _Range:
    """A datestamp range of the list (or of one set), ``count`` records by its announcement."""

    lo: datetime
    hi: datetime
    count: int | None
    set_spec: str | None = None
    splittable: bool = True


def _bisect(ranges: list[_Range], window: Window, start: datetime | None, settings: SliceSettings, probe: Probe,
            spread: Spread | None = None) -> int:
    """Cut the biggest ranges in time, in place, until every range holds about
    ``target_records`` or there are ``max_slices`` that hold records; returns the count
    probes it made. Empty halves (before the first record of a repository whose
    earliestDatestamp is the epoch or missing, a quiet decade) do not use up the slices.

    ``spread`` (partner_harvest.spread) sends a round's probes at once, as many as it is wide: the
    biggest ranges are halved, one probe each, or with fewer of them than probes the biggest
    is cut in more parts at once (each probe counts the range up to one cut); in turn, one
    probe a round. The counts only steer: a wrong one gives uneven slices, never missing ones."""
    spread = spread or in_turn
    step = granule(window.protocol.oai_granularity or DAY_GRANULARITY)
    day = step == timedelta(days=1)
    probes = 0
    while (held := sum(1 for r in ranges if r.count != 0)) < settings.max_slices and probes < _MAX_PROBES:
        candidates = sorted((r for r in ranges if r.splittable and r.count is not None
                             and r.count > settings.target_records), key=lambda r: -(r.count or 0))
        if not candidates:
            break
        room = min(spread.width, settings.max_slices - held, _MAX_PROBES - probes)
        chosen = candidates[:room]
        cuts: list[tuple[_Range, list[datetime]]] = []
        for i, r in enumerate(chosen):
            wanted = room // len(chosen) + (1 if i < room % len(chosen) else 0)
            points = sorted({floor_to(r.lo + (r.hi - r.lo) * k / (wanted + 1), "day" if day else "seconds")
                             for k in range(1, wanted + 1)})
            points = [t for t in points if t >= r.lo and t + step <= r.hi]
            if points:
                cuts.append((r, points))
            else:
                r.splittable = False  # one granule: cannot be cut
        if not cuts:
            continue

        def count(job: tuple[_Range, datetime]) -> int | None:
            r, at = job
            from_ = None if r.lo == start and window.from_ is None else r.lo
            return probe(from_, at) if r.set_spec is None else probe(from_, at, r.set_spec)

        counted = spread([(r, at) for r, points in cuts for at in points], count)
        probes += len(counted)
        for r, points in cuts:
            lefts, counted = counted[:len(points)], counted[len(points):]
            if any(left is None for left in lefts):
                r.splittable = False
                continue
            parts: list[_Range] = []
            lo, before = r.lo, 0
            for at, left in zip(points, lefts):
                assert left is not None
                parts.append(_Range(lo, at, left if not parts else max(left - before, 0), r.set_spec))
                lo, before = at + step, left
            parts.append(_Range(lo, r.hi, max((r.count or 0) - before, 0), r.set_spec))
            index = ranges.index(r)
            ranges[index:index + 1] = parts
    return probes


def _pieces(ranges: list[_Range], window: Window) -> list[Slice]:
    """One list's (or one set's) ranges as slices that cover the window: empty ranges
    dropped, each kept one starting where the one before ends (the boundary granule in
    both: see the module's docstring), the first at the window's own (perhaps open) start."""
    kept = [r for r in ranges if r.count != 0] or ranges[:1]
    pieces: list[Slice] = []
    for i, r in enumerate(kept):
        piece = Slice(from_=window.from_ if i == 0 else pieces[-1].until,
                      until=window.until if i == len(kept) - 1 else r.hi, estimate=r.count, set_spec=r.set_spec)
        pieces.append(piece)
    return pieces


def _earliest(window: Window) -> datetime | None:
    return window.protocol.earliest_datestamp


def _equal_ranges(window: Window, start: datetime, step: timedelta, count: int) -> list[Slice]:
    """``count`` equal time ranges from ``start`` to until, on granule boundaries, each
    starting where the one before ends (overlapping by that granule, as ``_pieces``)."""
    if count < 2:
        return []
    granules = int((window.until - start) / step) + 1  # both ends included
    count = min(count, granules)
    if count < 2:
        return []
    size = math.ceil(granules / count)
    pieces: list[Slice] = []
    lo = start
    while lo <= window.until:
        hi = min(lo + step * (size - 1), window.until)
        pieces.append(Slice(from_=window.from_ if not pieces else pieces[-1].until, until=hi))
        lo = hi + step
    return pieces
