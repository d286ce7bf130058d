"""The OAI-PMH adapter: the partner's clock and one window's ListRecords stream.

An expired resumptionToken restarts the window from its frozen bounds (never from a saved
token), a bounded number of times, discarding what the broken attempt staged. A window the
repository refuses as too large (oai/client.py: WindowTooLarge) is cut in two halves that
overlap at the cut by one granule, as slices do (oai/slicing.py: a repository comparing
sub-second stamps raw serves a record stored at ``m + 0.5 s`` in neither of ``[.., m]`` and
``[m + 1 s, ..]``), each harvested in turn and cut again while refused, within the frozen
bounds and down to ``options.oai.max_window_splits`` levels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import closing
from datetime import datetime, timedelta
from typing import cast

from partner_harvest import durations
from partner_harvest.adapters import Adapter, IdSink, ItemSink, PartnerClock
from partner_harvest.errors import HarvestError, PartnerProtocolError
from partner_harvest.formats.checks import policy_of
from partner_harvest.oai import parse, slicing
from partner_harvest.oai.client import OaiClient, WindowTooLarge
from partner_harvest.oai.errors import BadResumptionToken, IdDoesNotExist
from partner_harvest.oai.parse import DAY_GRANULARITY, format_datestamp
from partner_harvest.oai.sampled_cut import PageSample
from partner_harvest.records import Check, HarvestItem, HarvestStats
from partner_harvest.registry import Partner, SliceSettings
from partner_harvest.window import DAY, SECONDS, Slice, Window

log = logging.getLogger(__name__)


class TokenRestartsExhausted(HarvestError):
    """The repository kept expiring tokens; the window never completed."""


class OaiAdapter(Adapter):
    """Harvests one OAI-PMH partner through an :class:`OaiClient`."""

    fetch_chunk = 100  # GetRecord is one request per id; the chunk only bounds memory

    def __init__(self, partner: Partner, client: OaiClient):
        super().__init__(partner)
        self.client = client
        client.validation = policy_of(partner.options.validation)  # the client parses
        # Halvings of a refused window before the run fails (registry options.oai).
        self.max_window_splits = partner.options.oai.max_window_splits
        # The reconcile's budget (registry options.reconcile): vanished candidates verified by
        # GetRecord per reconcile (the rest wait for the next), and the number of missing
        # records above which one ListRecords stream fetches them instead of GetRecord each.
        self.verify_limit: int | None = partner.options.reconcile.verify_limit
        self.bulk_missing_threshold: int | None = partner.options.reconcile.bulk_missing_threshold
        # Lists one request showed to be empty (window_is_empty); harvested without asking again.
        self._known_empty: set[tuple[str, str | None, str, str | None]] = set()

    def clock(self) -> PartnerClock:
        identify = self.client.identify()
        prefix = self.client.resolve_prefix(self.partner.metadata_prefix)
        granularity = DAY if identify.granularity == DAY_GRANULARITY else SECONDS
        log.info(
            "%s: repository %r, granularity %s, deletedRecord=%s, clock %s, prefix %s",
            self.partner_id, identify.repository_name, identify.granularity,
            identify.deleted_record, identify.response_date.isoformat(), prefix,
        )
        return PartnerClock(
            now=identify.response_date,
            granularity=granularity,
            protocol={
                "metadata_prefix": prefix,
                "oai_granularity": identify.granularity,
                "deleted_record": identify.deleted_record,
                "set": self.partner.set_spec,
                "earliest_datestamp": identify.earliest_datestamp,
            },
        )

    def plan_slices(self, window: Window, settings: SliceSettings) -> list[Slice]:
        """Set slices where the registry lists sets that partition the list, else datestamp
        slices of a big window (oai/slicing.py); [] keeps it whole."""
        prefix = _prefix(window)
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        # the whole list's first page serves both planners and the count-less cut
        asked: dict[tuple[datetime | None, datetime, str | None], tuple[int | None, PageSample | None]] = {}

        def page(from_: datetime | None, until: datetime, set_spec: str | None = None) -> tuple[int | None, PageSample | None]:
            key = (from_, until, set_spec or self.partner.set_spec)
            if key not in asked:
                asked[key] = slicing.first_page(self.client, prefix, key[2], oai_granularity, from_, until)
            return asked[key]

        def probe(from_: datetime | None, until: datetime, set_spec: str | None = None) -> int | None:
            return page(from_, until, set_spec)[0]

        def sample(from_: datetime | None, until: datetime) -> PageSample | None:
            return page(from_, until)[1]

        by_sets = slicing.plan_by_sets(window, settings, probe, self.partner_id)
        if by_sets is not None:
            return by_sets
        return slicing.plan(window, settings, probe, self.partner_id, sample)

    def _set_spec(self, window: Window) -> str | None:
        """The set a window lists: its slice's own (slicing.sets), else the partner's."""
        piece = window.protocol.slice
        return (piece.set_spec if piece is not None else None) or self.partner.set_spec

    def harvest(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        prefix = _prefix(window)
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        from_ = format_datestamp(window.from_, oai_granularity) if window.from_ else None
        until = format_datestamp(window.until, oai_granularity)
        set_spec = self._set_spec(window)
        restarts = 0
        while True:
            try:
                self._stream_refusable(prefix, window, set_spec, sink, stats)
                # a full harvest, or one slice of it (its own range), never the reconcile's bulk fetch
                piece = window.protocol.slice
                if (piece.of_full if piece is not None else window.is_full) and window.mode != "reconcile":
                    stats.checks = self._completeness(prefix, until, stats, from_, set_spec)
                return
            except BadResumptionToken as exc:
                restarts += 1
                request = f"ListRecords from={from_} until={until} prefix={prefix}" + (
                    f" set={set_spec}" if set_spec else "")
                if restarts > self.partner.max_token_restarts:
                    raise TokenRestartsExhausted(
                        self.partner_id, request,
                        f"resumptionToken expired {restarts} times ({exc}); the window was "
                        f"restarted {self.partner.max_token_restarts} times and never completed",
                    ) from exc
                log.warning(
                    "%s: resumptionToken rejected after %d pages (%s); restarting the window "
                    "from its frozen bounds (restart %d of %d)",
                    self.partner_id, stats.pages, exc, restarts, self.partner.max_token_restarts,
                )
                sink.reset()
                stats.reset()
                stats.restarts = restarts

    def _stream_refusable(self, prefix: str, window: Window, set_spec: str | None, sink: ItemSink,
                          stats: HarvestStats) -> None:
        """The window's stream; bisected while the repository refuses it as too large."""
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        sizes: list[int | None] = []
        self._stream_piece(prefix, window.from_, window.until, oai_granularity, set_spec, sink, stats,
                           _lower_guess(window), 0, sizes)
        if len(sizes) > 1:  # each piece's completeListSize counts its own list only
            stats.complete_list_size = None if None in sizes else sum(sizes)  # type: ignore[arg-type]

    def _stream_piece(self, prefix: str, low: datetime | None, high: datetime, oai_granularity: str,
                      set_spec: str | None, sink: ItemSink, stats: HarvestStats, guess: datetime,
                      depth: int, sizes: list[int | None]) -> None:
        from_ = format_datestamp(low, oai_granularity) if low else None
        until = format_datestamp(high, oai_granularity)
        pages = stats.pages
        stats.complete_list_size = None
        try:
            self._stream(prefix, from_, until, set_spec, sink, stats)
            sizes.append(stats.complete_list_size)
            return
        except WindowTooLarge as exc:
            if stats.pages != pages:
                raise  # refused in the middle of its chain: not a window the repository finds too large
            step = timedelta(days=1) if oai_granularity == DAY_GRANULARITY else timedelta(seconds=1)
            start = low or min(guess, high - 2 * step)
            if depth >= self.max_window_splits or high - start < 2 * step:  # halves sharing a granule: 3 at least
                raise WindowTooLarge(
                    self.partner_id, exc.request,
                    f"{exc.cause}; the window was split {depth} times (options.oai.max_window_splits="
                    f"{self.max_window_splits}) and the repository still refuses it") from exc
            middle = start + (high - start) / 2
            middle = middle.replace(microsecond=0) if step < timedelta(days=1) else middle.replace(
                hour=0, minute=0, second=0, microsecond=0)
            log.warning("%s: the repository refuses the window %s..%s as too large (%s); harvesting it as "
                        "two halves sharing the granule of the cut, %s..%s and %s..%s (split %d of at most %d)",
                        self.partner_id, from_ or "the beginning", until, exc.cause, from_ or "the beginning",
                        format_datestamp(middle, oai_granularity),
                        format_datestamp(middle, oai_granularity), until, depth + 1,
                        self.max_window_splits)
        self._stream_piece(prefix, low, middle, oai_granularity, set_spec, sink, stats, guess, depth + 1, sizes)
        self._stream_piece(prefix, middle, high, oai_granularity, set_spec, sink, stats, guess, depth + 1, sizes)

    def window_is_empty(self, window: Window) -> bool:
        """One ListRecords of the frozen window: empty (noRecordsMatch, or one page without
        items or token) means a quiet night; that list is then harvested from this answer.
        A window refused as too large is not known empty: the harvest bisects it."""
        if window.protocol.slice is not None:
            return False
        prefix = _prefix(window)
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        key = (prefix, format_datestamp(window.from_, oai_granularity) if window.from_ else None,
               format_datestamp(window.until, oai_granularity), self._set_spec(window))
        pages = self.client.list_pages("ListRecords", metadata_prefix=key[0], set_spec=key[3], from_=key[1],
                                       until=key[2])
        try:
            with closing(pages):
                first = next(pages, None)
        except WindowTooLarge as exc:  # the ordinary path bisects what the repository refuses
            log.info("%s: the quiet-night look was refused (%s); the window is harvested the usual way",
                     self.partner_id, exc.cause)
            return False
        if first is None or (not first.items and first.token is None):
            self._known_empty.add(key)
            return True
        return False

    def _stream(self, prefix: str, from_: str | None, until: str, set_spec: str | None, sink: ItemSink,
                stats: HarvestStats) -> None:
        if (prefix, from_, until, set_spec) in self._known_empty:
            stats.pages += 1  # the empty answer window_is_empty read, as a harvest would count it
            sink.write_page([])
            return
        started = time.monotonic()
        pages = self.client.list_pages(
            "ListRecords", metadata_prefix=prefix, set_spec=set_spec, from_=from_, until=until
        )
        with closing(pages):  # a failing sink stops the fetcher thread now (pipelining)
            self._stream_pages(pages, sink, stats, started)

    def _stream_pages(self, pages: Iterable[parse.ListPage], sink: ItemSink, stats: HarvestStats,
                      started: float) -> None:
        cleaned = 0
        for page in pages:
            stats.pages += 1
            items = cast(list[HarvestItem], page.items)  # a ListRecords page holds records only (parse_list_records)
            for item in items:
                stats.add(item)
            if page.complete_list_size is not None:
                stats.complete_list_size = page.complete_list_size
            if page.cleaned:
                cleaned += 1
                log.warning("%s: page %d contained invalid XML characters; they were stripped",
                            self.partner_id, stats.pages)
            sink.write_page(items)
            rate = stats.fetched / max(time.monotonic() - started, 1e-6)
            of = left = ""
            if stats.complete_list_size is not None:
                of = f" of {stats.complete_list_size}"
                if rate > 0 and page.token:
                    left = f", about {durations.human(max(stats.complete_list_size - stats.fetched, 0) / rate)} left"
            log.info(
                "%s: page %d: %d items; %d fetched%s (%d records, %d deleted, %d rejected), %.0f/s%s",
                self.partner_id, stats.pages, len(page.items), stats.fetched, of,
                stats.records, stats.tombstones, stats.rejected, rate, left,
            )
        stats.cleaned_pages = cleaned


    # -- completeness (I12) --------------------------------------------------------------

    def _completeness(self, prefix: str, until: str, stats: HarvestStats, from_: str | None = None,
                      set_spec: str | None = None) -> list[Check]:
        """Second witnesses of a full harvest, as record_check arguments, failures last
        (the audit row keeps the last one recorded).

        ``oai-complete-list-size``: the repository's own count on the list's last page.
        ``oai-list-identifiers`` (``options.completeness.list_identifiers``): a separate
        ListIdentifiers count of the same prefix, set and until, against everything
        fetched (records + tombstones + rejects). Either differing means the list stopped
        short, repeated itself, or changed while it was read.
        """
        checks: list[Check] = []
        if stats.complete_list_size is not None:
            expected = stats.complete_list_size
            checks.append((
                "oai-complete-list-size", expected, stats.fetched, expected == stats.fetched,
                f"completeListSize={expected} on the last page; fetched {stats.fetched} "
                f"({stats.records} records, {stats.tombstones} deleted, {stats.rejected} rejected)",
            ))
        if self.partner.options.completeness.list_identifiers:
            checks.append(self._list_identifiers_check(prefix, until, stats, from_, set_spec))
        checks.sort(key=lambda check: check[3], reverse=True)
        return checks

    def _list_identifiers_check(self, prefix: str, until: str, stats: HarvestStats, from_: str | None = None,
                                set_spec: str | None = None) -> Check:
        request = f"ListIdentifiers metadataPrefix={prefix} set={set_spec} until={until}"
        if from_:
            request += f" from={from_}"
        restarts = 0
        while True:
            listed = 0
            try:
                with closing(self.client.list_pages("ListIdentifiers", metadata_prefix=prefix,
                                                    set_spec=set_spec, from_=from_,
                                                    until=until)) as pages:
                    for page in pages:
                        listed += len(page.items)
                break
            except BadResumptionToken:
                restarts += 1
                if restarts <= self.partner.max_token_restarts:
                    continue
                return ("oai-list-identifiers", None, stats.fetched, False,
                        f"{request}: resumptionToken expired {restarts} times; nothing proven")
            except HarvestError as exc:  # the witness failing must not fail a finished harvest
                log.warning("%s: the ListIdentifiers count failed: %s", self.partner_id, exc)
                return ("oai-list-identifiers", None, stats.fetched, False,
                        f"{request}: could not count ({' '.join(str(exc).split())}); nothing proven")
        ok = listed == stats.fetched
        detail = (f"{request} lists {listed} headers; the harvest fetched {stats.fetched} "
                  f"({stats.records} records, {stats.tombstones} deleted, {stats.rejected} rejected)")
        if not ok:
            log.warning("%s: completeness check failed: %s", self.partner_id, detail)
        return ("oai-list-identifiers", listed, stats.fetched, ok, detail)

    # -- reconcile -------------------------------------------------------------------

    def plan_sweep(self, window: Window, slices: int, threshold: int) -> list[Slice]:
        """Datestamp ranges of the sweep, cut like a full harvest's slices (by counts, else by
        what the first pages show); the last one open-ended (see :meth:`sweep_ids`)."""
        settings = SliceSettings(threshold_records=threshold, target_records=1, max_slices=slices,
                                 without_count=slices)
        pieces = self.plan_slices(window, settings)
        return [*pieces[:-1], pieces[-1].model_copy(update={"open_end": True})] if len(pieces) > 1 else []

    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """Every header the partner lists now (ListIdentifiers: cheap, headers only), or one
        slice's datestamp range of them.

        No ``until`` (the last slice has none either): a record edited while the sweep runs
        gets a datestamp later than the reconcile's clock, and a sweep bounded by that clock
        would not list it at all. (Edited while a sliced sweep runs, a record may leave a
        range not yet swept for the last one, already swept: the GetRecord verification of
        vanished candidates finds it live.)
        """
        prefix = _prefix(window)
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        piece = window.protocol.slice
        from_ = format_datestamp(window.from_, oai_granularity) if piece is not None and window.from_ else None
        until = None if piece is None or piece.open_end else format_datestamp(window.until, oai_granularity)
        restarts = 0
        while True:
            try:
                with closing(self.client.list_pages("ListIdentifiers", metadata_prefix=prefix,
                                                    set_spec=self.partner.set_spec, from_=from_,
                                                    until=until)) as pages:
                    for page in pages:
                        stats.pages += 1
                        rows = [(h.identifier, _stamp(h), h.deleted) for h in page.items
                                if isinstance(h, parse.OaiHeader) and h.identifier]
                        stats.fetched += len(rows)
                        sink.write_page(rows)
                        if stats.pages % 20 == 0 or not page.token:
                            log.info("%s: reconcile sweep page %d: %d headers so far",
                                     self.partner_id, stats.pages, stats.fetched)
                return
            except BadResumptionToken:
                restarts += 1
                if restarts > self.partner.max_token_restarts:
                    raise
                log.warning("%s: resumptionToken expired during the sweep; restarting it", self.partner_id)
                sink.reset()
                stats.reset()

    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """GetRecord for ids the aggregation lacks; an id gone meanwhile is skipped."""
        items: list[HarvestItem] = []
        for identifier in identifiers:
            item = self._get_record(window, identifier)
            if item is None:
                log.info("%s: %s vanished during the reconcile; skipped", self.partner_id, identifier)
                continue
            items.append(item)
        return items

    def verify_vanished(self, window: Window, identifiers: list[str]) -> list[tuple[str, HarvestItem | None]]:
        """Ask the partner about ids the sweep did not list: None means idDoesNotExist.

        A sweep is not proof of absence: offset paging shifted by a concurrent deletion
        skips records, and some servers drop records re-dated mid-list.
        """
        return [(identifier, self._get_record(window, identifier)) for identifier in identifiers]

    def _get_record(self, window: Window, identifier: str) -> HarvestItem | None:
        prefix = _prefix(window)
        params = {"verb": "GetRecord", "identifier": identifier, "metadataPrefix": prefix}
        try:
            return self.client.call(params, lambda c: parse.parse_get_record(c, prefix, self.client.validation))  # type: ignore[return-value]
        except PartnerProtocolError as exc:
            if isinstance(exc.__cause__, IdDoesNotExist):
                return None
            raise


def _lower_guess(window: Window) -> datetime:
    """Where to cut an open-started window: its start is kept open (a wrong earliestDatestamp
    loses nothing, I13); the announced earliestDatestamp, else 30 years back, only places the cut."""
    earliest = window.protocol.earliest_datestamp
    return earliest if earliest is not None and earliest < window.until else window.until - timedelta(days=365 * 30)


def _prefix(window: Window) -> str:
    """The metadataPrefix the window was frozen with (the clock resolved ``auto``)."""
    prefix = window.protocol.metadata_prefix
    if prefix is None:
        raise ValueError(f"the {window.describe()} was frozen without a metadataPrefix")
    return prefix


def _stamp(header: parse.OaiHeader) -> datetime | None:
    try:
        return header.datestamp
    except ValueError:
        return None
