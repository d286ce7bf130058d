"""The Sierra adapter: change poll, separate deletion poll, and the MARC export full load.

Ordering of a deletion against edits: ``deletedDate`` is a day, so a tombstone is stamped
at the last microsecond of that day (D 23:59:59.999999Z). Sierra stamps versions in whole
seconds, so it beats every edit stamped on D or earlier (ties are impossible) and loses to
a version stamped D+1 or later (a record re-created later).

Full load: the ``bibs/marc`` export with its resume and bisection, then the JSON API's
list of live ids as the second witness (I12): sierra/export.py.

Suppressed bibs (``options.sierra.suppressed``): ``purge`` (the default) holds only public
bibs: one the change poll shows suppressed is a deletion with reason ``suppressed``, the
full load turns the suppressed ids of its range (listed first, ``suppressed=true``) into
deletions, and its witness and the reconcile count public bibs only. ``flag`` holds them
carrying the warning ``sierra.suppressed``; ``keep`` holds them as any bib. A bib the API
lists without MARC (deleted in Sierra, still listed) is a deletion with reason ``no_marc``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from datetime import time as dtime
from typing import Any

import msgspec

from partner_harvest import durations
from partner_harvest.adapters import Adapter, IdSink, PartnerClock, StagingSink, SweptId
from partner_harvest.errors import ConfigurationError, HarvestError, PartnerAsksToWait
from partner_harvest.formats.checks import Finding, policy_of
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.registry import Partner, SliceSettings
from partner_harvest.sierra import marc
from partner_harvest.sierra.attached import AttachedPolls
from partner_harvest.sierra.client import RateLimited, SierraClient
from partner_harvest.sierra.export import SUPPRESSED, FullLoad
from partner_harvest.sierra.spec import DELETIONS
from partner_harvest.spread import Spread, in_turn, pooled
from partner_harvest.transport import widen
from partner_harvest.window import SECONDS, ChannelPlan, Slice, Window, floor_to, format_instant

log = logging.getLogger(__name__)
DEFAULT_FIELDS = ("id", "updatedDate", "createdDate", "deleted", "suppressed", "marc")
REQUIRED_FIELDS = ("id", "updatedDate", "marc")
DELETION_FIELDS = "id,deletedDate"
NO_MARC = "no_marc"  # deletions.reason: the API lists the bib without MARC (deleted, still listed)
FLAGGED = Finding("sierra.suppressed", "the bib is suppressed in the catalogue (not public)")
# Record numbers have no fixed width: 7 digits on most catalogues, 8 on large ones
# (907 $a ".b116512684"). Nothing here assumes a highest id: the export ends on 404/107
# or an empty block, and the slice plan probes upwards for the highest id.
def sierra_timestamp(value: datetime) -> str:
    """Sierra wants Z-suffixed UTC timestamps in date ranges."""
    return format_instant(value)


def parse_sierra_timestamp(text: str) -> datetime:
    return datetime.strptime(text.strip().replace("Z", ""), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def _midnight(day: date) -> datetime:
    """A day as the instant a day-granular channel window carries."""
    return datetime.combine(day, dtime(0), tzinfo=timezone.utc)


def end_of_day(day: date) -> datetime:
    """A deletion on `day` sorts after every whole-second version of that day, before D+1."""
    return datetime.combine(day, dtime(23, 59, 59, 999_999), tzinfo=timezone.utc)


class SierraAdapter(Adapter):
    """Harvests one Sierra catalogue through a :class:`SierraClient`."""

    fetch_chunk = 25  # ids per bibs?id=a,b,c request: long id lists fail on real servers

    def __init__(self, partner: Partner, client: SierraClient, *, sleep: Callable[[float], None] = time.sleep):
        super().__init__(partner)
        self.client = client
        self.sleep = sleep
        self.validation = policy_of(partner.options.validation)
        self.suppressed = partner.options.sierra.suppressed
        self.fields = tuple(partner.fields) or DEFAULT_FIELDS
        if self.suppressed != "keep" and "suppressed" not in self.fields:
            self.fields = (*self.fields, "suppressed")  # the poll must say which bibs are suppressed
        missing = [f for f in REQUIRED_FIELDS if f not in self.fields]
        if missing:
            raise ConfigurationError(partner.id, "registry", f"'fields' must include {', '.join(missing)}")
        self.now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
        self.attached = AttachedPolls(self)  # the items and holdings channels the partner chose
        self.known_empty: set[str] = set()  # polls a quiet night's look showed empty (window_is_empty)
        # (monotonic start, items fetched then) of this try's full load: its time left (write)
        self.progress_since: tuple[float, int] | None = None

    # -- window ----------------------------------------------------------------------

    def clock(self) -> PartnerClock:
        now = self.client.server_time()
        log.info("%s: Sierra server clock %s", self.partner_id, format_instant(now))
        return PartnerClock(now=now, granularity=SECONDS, protocol={"fields": ",".join(self.fields)})

    def plan_channels(self, window: Window, cursors: dict[str, datetime | None]) -> dict[str, ChannelPlan]:
        """Each channel's own window: the deletion polls' days from their day cursors minus the
        overlap; the items' and holdings' change polls from their own cursors minus the lag
        (none: every live one, by id ranges)."""
        plans = {DELETIONS: self._deletion_days(window, cursors.get(DELETIONS))}
        for name, kind in self.attached.kinds.items():
            if name == kind.deletions:
                plans[name] = self._deletion_days(window, cursors.get(name))
            else:
                plans[name] = self._change_window(window, cursors.get(name))
        return plans

    def _deletion_days(self, window: Window, cursor: datetime | None) -> ChannelPlan:
        overlap = timedelta(days=self.partner.deletion_overlap_days)
        until_day = window.until.date()
        if window.mode == "window" and window.from_ is not None:
            start = window.from_.date() - overlap
        elif cursor is not None:
            start = cursor.date() - overlap
        elif window.from_ is not None:
            start = window.from_.date() - overlap
        else:
            # A full load from scratch: the export is the live set; deletions start tomorrow.
            return ChannelPlan(until=_midnight(until_day), skip=True)
        start = min(start, until_day)
        return ChannelPlan(from_=_midnight(start), until=_midnight(until_day))

    def _change_window(self, window: Window, cursor: datetime | None) -> ChannelPlan:
        """An attached kind's change poll: as the bibs' window, on its own cursor."""
        if window.mode == "window" or window.mode == "full":
            return ChannelPlan(from_=window.from_, until=window.until, granularity=SECONDS)
        if cursor is None:
            return ChannelPlan(until=window.until, granularity=SECONDS)  # every live one
        start = floor_to(cursor - self.partner.lag, SECONDS)
        return ChannelPlan(from_=min(start, window.until), until=max(window.until, floor_to(cursor, SECONDS)),
                           granularity=SECONDS)

    # -- slices ----------------------------------------------------------------------

    def plan_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """A full load: export id ranges over the span of bib ids; a long change poll:
        updatedDate ranges of ``long_window`` each. [] keeps the run whole."""
        if settings.max_slices < 2:
            return []
        if window.is_full:
            return self._id_slices(window, settings)
        if window.from_ is not None and window.until - window.from_ > settings.long_window:
            return _time_slices(window, settings)
        return []

    def first_id_from(self, start: int) -> int | None:
        body = self.client.get_json("/bibs", {"fields": "id", "limit": 1, "id": f"[{start},]"}, empty_ok=True)
        entries = (body or {}).get("entries") or []
        try:
            return int(entries[0]["id"]) if entries else None
        except (KeyError, TypeError, ValueError):
            return None

    def _id_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """Equal id ranges: Sierra record numbers are handed out in sequence, so an id range
        holds about as many bibs as it is wide. The span comes from ``fields=id&limit=1``
        probes: the lowest id, then the highest: doubling steps up until no id lies above
        (ids have no fixed width), then bisection (about 2 x log2(span) requests)."""
        low = self.first_id_from(0)
        if low is None:
            return []
        # The rest as many at once as the pool allows beside the deletion poll (which runs
        # beside the plan), and only as exact as the cut needs: the last slice is open-ended.
        # The first round's first step, an id ``threshold_records`` above the lowest, tells
        # whether the catalogue is big enough to cut at all (none: it stays whole).
        width = max(1, self.partner.pool_slots - 1)
        widen(self.client.session, width)  # as many connections kept as probes at once
        with pooled(width, f"sierra-plan-{self.partner_id}") as spread:
            high, probes = self.highest_id(low, max(1, settings.threshold_records), spread,
                                           within=settings.threshold_records // 64, or_none_above=True)
        if high == low:
            return []  # no id that far above the lowest: small enough to stay whole
        probes += 1
        span = high - low + 1
        count = min(settings.max_slices, math.ceil(span / settings.target_records))
        log.info("%s: bib ids %d..%d (span %d, %d probes)", self.partner_id, low, high, span, probes)
        if span <= settings.threshold_records or count < 2:
            return []
        size = math.ceil(span / count)
        pieces: list[Slice] = []
        for index in range(count):
            lo = 0 if index == 0 else low + index * size
            hi = None if index == count - 1 else low + (index + 1) * size - 1  # the last one is open-ended
            pieces.append(Slice(until=window.until, lo=lo, hi=hi, estimate=size))
        return pieces

    def highest_id(self, high: int, step: int, spread: Spread = in_turn, within: int = 0,
                   or_none_above: bool = False) -> tuple[int, int]:
        """The highest bib id (at most ``within`` below it), given one that exists: doubling
        steps up until no id lies above (ids have no fixed width), then bisection; ``spread``
        sends a round's probes at once, as many as it is wide (a round of steps up, or cuts
        of the range left). Returns it and the probes it took. ``or_none_above``: when no id
        lies ``step`` above the given one, that one at once (the caller only asks whether
        the span is wider than a step)."""
        probes = 0
        width = max(1, spread.width)
        while True:  # an id exists at or above ``high``: find a probe with none above it
            points = [high + step * 2 ** i for i in range(width)]
            found = spread(points, self.first_id_from)
            probes += len(points)
            missing = next((i for i, f in enumerate(found) if f is None), None)
            if missing == 0 and or_none_above and probes == len(points):
                return high, probes
            if missing is not None:
                top = points[missing] - 1
                high = found[missing - 1] or high if missing else high
                break
            high, step = found[-1] or high, step * 2 ** width
        while top - high > within:
            points = sorted({high + (top - high) * (i + 1) // (width + 1) + 1 for i in range(width)})
            found = spread(points, self.first_id_from)
            probes += len(points)
            for point, first in zip(points, found):
                if first is None:
                    top = point - 1
                    break
                high = max(high, first)
        return high, probes

    # -- changes ---------------------------------------------------------------------

    # A slice (window.protocol.slice) writes its keyset position with every page and,
    # retried, resumes from it (``resume_at``) keeping what it staged (pipeline.harvest_piece).
    resumes_slices = True

    @contextmanager
    def _rate_limit_frees_the_slot(self) -> Iterator[None]:
        """A rate limit outside the export loop (a poll, the id enumeration) reschedules too.

        The transport leaves Sierra's 429 to the client, so no request sleeps its
        Retry-After; here the task gives its slot back for the wait the server named.
        """
        try:
            yield
        except RateLimited as exc:
            wait = exc.retry_after if exc.retry_after is not None else self.partner.options.export.rate_limit_wait
            raise PartnerAsksToWait(self.partner_id, exc.request, f"rate limited: {exc.cause}",
                                    self.now() + timedelta(seconds=wait)) from exc

    def harvest(self, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        piece = window.protocol.slice
        with self._rate_limit_frees_the_slot():
            if window.is_full:
                FullLoad(self, window, sink, stats, piece).run()
            else:
                self._change_poll(window, sink, stats, piece)

    def _change_params(self, window: Window) -> dict[str, Any]:
        assert window.from_ is not None
        return {
            "deleted": "false",
            "updatedDate": f"[{sierra_timestamp(window.from_)},{sierra_timestamp(window.until)}]",
            "fields": ",".join(self.fields),
        }

    def window_is_empty(self, window: Window) -> bool:
        """The first page of the change poll and of each planned channel's poll (the same
        requests the harvest makes): all empty is a quiet night, and those polls then ask
        nothing again. A channel without a window of its own yet (a first load) is not quiet;
        a failed look is not either (the usual way meets the failure)."""
        polls: dict[str, tuple[str, dict[str, Any]]] = {"changes": ("/bibs", self._change_params(window))}
        for name, plan in window.protocol.channels.items():
            if plan.skip:
                continue
            if plan.from_ is None:
                return False
            if name == DELETIONS:
                polls[name] = ("/bibs", self._deletion_params(plan))
            else:
                polls[name] = self.attached.poll(name, plan)
        try:
            for path, params in polls.values():
                if next(iter(self.client.pages(path, params, self.partner.page_size)), []):
                    return False
        except (HarvestError, RateLimited) as exc:
            log.info("%s: the quiet-night look failed (%s); the window is harvested the usual way", self.partner_id, exc)
            return False
        self.known_empty = set(polls)
        return True

    def _change_poll(self, window: Window, sink: StagingSink, stats: HarvestStats, piece: Slice | None = None) -> None:
        if piece is None and "changes" in self.known_empty:
            return  # a quiet night's look showed it empty (window_is_empty)
        params = self._change_params(window)
        start = (piece.resume_at or 0) if piece is not None else 0
        if piece is not None and start:
            log.info("%s: slice %s resumes its change poll at id %d", self.partner_id, piece.channel, start)
        for entries in self.client.bib_pages(params, self.partner.page_size, start_id=start):
            items = [self._entry_to_item(entry, window.until) for entry in entries]
            self.write(items, sink, stats, "changes", checkpoint=_after_last(entries) if piece is not None else None)

    def _entry_to_item(self, entry: dict[str, Any], fallback: datetime | None = None) -> HarvestItem:
        """One ``GET bibs`` entry as a record, deletion or reject.

        A bib is identified by its ``id``. An entry without a usable ``updatedDate``
        (recorded sandbox answers omit it) is stamped with its MARC's 005, else with
        ``fallback`` (the window's until), as an export record without 005 is.
        """
        bib_id = str(entry.get("id", "")).strip() or "(missing id)"
        if entry.get("deleted") is True:
            # Older Sierra versions return deleted stubs (id, deleted, deletedDate) here.
            return self._tombstone(entry, bib_id)
        fallback = fallback or self.now()
        try:
            updated: datetime | None = parse_sierra_timestamp(str(entry["updatedDate"]))
        except (KeyError, ValueError):
            updated = None
        if entry.get("suppressed") is True and self.suppressed == "purge":
            return Tombstone(bib_id, updated or fallback, SUPPRESSED)
        if not entry.get("marc"):
            unasked = sorted(set(entry) - set(self.fields))
            if unasked:  # an answer of other fields than asked (recorded servers do): nothing says the MARC is gone
                return Rejected(bib_id, f"bib without its 'marc' field, in an answer of fields not asked for "
                                f"({', '.join(unasked[:6])})", _json(entry), updated or fallback, marc.PREFIX)
            # Asked for and absent: deleted in Sierra but still listed. What was held of it must not stay.
            log.warning("%s: bib %s is listed without MARC: a deletion (no_marc)", self.partner_id, bib_id)
            return Tombstone(bib_id, updated or fallback, NO_MARC)
        try:
            record = marc.from_marc_json(entry["marc"])
        except Exception as exc:
            return Rejected(bib_id, f"MARC-in-JSON unreadable: {type(exc).__name__}: {exc}", _json(entry),
                            updated or fallback, marc.PREFIX)
        item = marc.to_item(record, bib_id, updated or marc.stamp_of(record) or fallback, self.validation)
        return self.flagged(item) if entry.get("suppressed") is True else item

    def flagged(self, item: HarvestItem) -> HarvestItem:
        """A suppressed bib's record with ``suppressed: flag``: it carries the warning."""
        if self.suppressed == "flag" and isinstance(item, Record):
            return msgspec.structs.replace(item, warnings=(*item.warnings, FLAGGED))
        return item

    def public_only(self, params: dict[str, Any]) -> dict[str, Any]:
        """A listing of live ids: with ``purge``, of public bibs only (suppressed ones are not held)."""
        return {**params, "suppressed": "false"} if self.suppressed == "purge" else params

    def _tombstone(self, entry: dict[str, Any], bib_id: str) -> HarvestItem:
        try:
            day = date.fromisoformat(str(entry["deletedDate"])[:10])
        except (KeyError, ValueError):
            return Rejected(bib_id, f"deleted bib without a usable deletedDate: {entry.get('deletedDate')!r}", _json(entry))
        return Tombstone(bib_id, end_of_day(day))

    # -- deletions -------------------------------------------------------------------

    def harvest_channel(self, channel: str, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        """The bibs' deletion poll, or one of the items' and holdings' polls (sierra/attached.py)."""
        with self._rate_limit_frees_the_slot():
            if channel == DELETIONS:
                self._poll_deletions(window, sink, stats)
            elif channel in self.known_empty:
                return  # a quiet night's look showed it empty (window_is_empty)
            elif channel in self.attached.kinds:
                self.attached.harvest(channel, window, sink, stats)
            else:
                super().harvest_channel(channel, window, sink, stats)

    def _poll_deletions(self, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        plan = window.protocol.channels.get(DELETIONS)
        if plan is None or plan.skip or plan.from_ is None:
            log.info("%s: no deletion poll for this window (full load from scratch)", self.partner_id)
            return
        if DELETIONS in self.known_empty:
            return
        for entries in self.client.bib_pages(self._deletion_params(plan), self.partner.page_size):
            items = [self._tombstone(entry, str(entry.get("id", "")).strip() or "(missing id)") for entry in entries]
            self.write(items, sink, stats, DELETIONS)

    @staticmethod
    def _deletion_params(plan: ChannelPlan) -> dict[str, Any]:
        assert plan.from_ is not None
        days = f"[{plan.from_.date().isoformat()},{plan.until.date().isoformat()}]"
        return {"deleted": "true", "deletedDate": days, "fields": DELETION_FIELDS}

    # -- full load -------------------------------------------------------------------

    def resumes_staging(self, channel: str, window: Window) -> bool:
        """Whether a new try of this channel keeps what an unfinished try staged (pipeline).

        The unsliced full load (a slice resumes from its own checkpoint), and the listing of
        every item or holdings record (a change channel without a cursor)."""
        if channel == "changes":
            return window.is_full and window.protocol.slice is None
        plan = window.protocol.channels.get(channel)
        kind = self.attached.kinds.get(channel)
        return plan is not None and kind is not None and channel == kind.entity and plan.from_ is None

    # -- reconcile -------------------------------------------------------------------

    def plan_sweep(self, window: Window, slices: int, threshold: int) -> list[Slice]:
        """Equal bib id ranges of the sweep (as a full load's slices; the last open-ended)."""
        settings = SliceSettings(threshold_records=threshold, target_records=1, max_slices=slices)
        return self._id_slices(window, settings) if slices >= 2 else []

    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """Every live bib id (keyset, ``fields=id``): the upstream set for a reconcile, or the
        ids of one slice's range."""
        if window.protocol.entity is not None:  # items or holdings: by id ranges
            with self._rate_limit_frees_the_slot():
                self.attached.sweep(window.protocol.entity, window, sink, stats)
            return
        piece = window.protocol.slice
        start, end = (piece.lo or 0, piece.hi) if piece is not None else (0, None)
        with self._rate_limit_frees_the_slot():
            for entries in self.client.bib_pages(self.public_only({"deleted": "false", "fields": "id"}),
                                                 self.partner.page_size, start_id=start, end_id=end):
                stats.pages += 1
                rows: list[SweptId] = [(str(e["id"]), None, False) for e in entries if e.get("id")]
                stats.fetched += len(rows)
                sink.write_page(rows)
        log.info("%s: reconcile sweep: %d live ids in %d pages", self.partner_id, stats.fetched, stats.pages)

    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """The bibs (or items, holdings: ``window.protocol.entity``) the aggregation lacks, by
        id list, with the harvest's own fields."""
        if window.protocol.entity is not None:
            with self._rate_limit_frees_the_slot():
                return self.attached.fetch(self.attached.kind_of_entity(window.protocol.entity), identifiers,
                                           window.until)
        items: list[HarvestItem] = []
        for start in range(0, len(identifiers), self.fetch_chunk):
            chunk = identifiers[start:start + self.fetch_chunk]
            params = {"id": ",".join(chunk), "fields": ",".join(self.fields), "deleted": "false", "limit": len(chunk)}
            body = self.client.get_json("/bibs", params, empty_ok=True) or {}
            items.extend(self._entry_to_item(entry, window.until) for entry in body.get("entries") or [])
        return items

    def deleted_since(self, identifiers: list[str]) -> list[HarvestItem]:
        """Listed live, gone by the fetch: deleted meanwhile? Their tombstones, from one id-list query per chunk."""
        items: list[HarvestItem] = []
        for start in range(0, len(identifiers), self.fetch_chunk):
            chunk = identifiers[start:start + self.fetch_chunk]
            params = {"id": ",".join(chunk), "fields": "id,deleted,deletedDate", "limit": len(chunk)}
            body = self.client.get_json("/bibs", params, empty_ok=True) or {}
            items.extend(self._tombstone(entry, str(entry.get("id", "")))
                         for entry in body.get("entries") or [] if entry.get("deleted") is True)
        return items

    # -- shared ----------------------------------------------------------------------

    def write(self, items: list[HarvestItem], sink: StagingSink, stats: HarvestStats, what: str,
              checkpoint: int | None = None) -> None:
        """One page into staging (a slice's with its keyset position), counted and logged."""
        stats.pages += 1
        for item in items:
            stats.add(item)
        sink.write_page(items, checkpoint=checkpoint)
        log.info("%s: %s page %d: %d items; %d fetched%s (%d records, %d deleted, %d rejected)%s",
                 self.partner_id, what, stats.pages, len(items), stats.fetched,
                 f" of ~{stats.expected} (id range)" if stats.expected is not None else "", stats.records,
                 stats.tombstones, stats.rejected, self._time_left(stats))

    def _time_left(self, stats: HarvestStats) -> str:
        """``, 120/s, about 4m 10s left`` at this try's rate, against the estimate (else empty)."""
        if stats.expected is None or self.progress_since is None:
            return ""
        began, before = self.progress_since
        rate = (stats.fetched - before) / max(time.monotonic() - began, 1e-6)
        if rate <= 0:
            return ""
        return f", {rate:.0f}/s, about {durations.human(max(stats.expected - stats.fetched, 0) / rate)} left"


def _after_last(entries: list[dict[str, Any]]) -> int | None:
    """The keyset position after a page: its last id + 1 (None when unusable)."""
    try:
        return int(entries[-1]["id"]) + 1 if entries else None
    except (KeyError, TypeError, ValueError):
        return None


def _time_slices(window: Window, settings: SliceSettings) -> list[Slice]:
    """Equal updatedDate ranges (whole seconds, inclusive) covering the window, each starting on
    the second the one before ends (as oai/slicing.py's): a server comparing stamps it keeps
    below the second would otherwise serve one stored at ``end + 0.5 s`` in neither range."""
    assert window.from_ is not None
    seconds = int((window.until - window.from_).total_seconds()) + 1
    count = min(settings.max_slices, math.ceil((window.until - window.from_) / settings.long_window))
    if count < 2:
        return []
    size = math.ceil(seconds / count)
    pieces: list[Slice] = []
    start = window.from_
    while start <= window.until:
        end = min(start + timedelta(seconds=size - 1), window.until)
        pieces.append(Slice(from_=pieces[-1].until if pieces else start, until=end))
        start = end + timedelta(seconds=1)
    return pieces


def _json(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False, sort_keys=True)[:200000]

