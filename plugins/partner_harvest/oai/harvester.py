"""The OAI-PMH adapter: the partner's clock and one window's lists.

A window is one list per set of the partner's selection (oai/selection.py), through
ListRecords or, with ``options.oai.method: identifiers_then_get``, ListIdentifiers and a
GetRecord for each live header (for repositories whose ListRecords breaks); an incremental
window of a partner with sets also lists the whole repository's headers, for the records
that left them.

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
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import TypeVar, cast

from partner_harvest import durations
from partner_harvest.adapters import Adapter, IdSink, PartnerClock, StagingSink
from partner_harvest.errors import HarvestError, PartnerHttpError, PartnerProtocolError
from partner_harvest.formats.checks import policy_of
from partner_harvest.oai import parse, slicing
from partner_harvest.oai.client import Forbidden, OaiClient, WindowTooLarge
from partner_harvest.oai.errors import BadResumptionToken, CannotDisseminateFormat, IdDoesNotExist
from partner_harvest.oai.parse import DAY_GRANULARITY, format_datestamp
from partner_harvest.oai.sampled_cut import PageSample
from partner_harvest.oai.selection import EXCLUDED, Selection
from partner_harvest.records import Check, HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.registry import Partner, SliceSettings
from partner_harvest.spread import pooled
from partner_harvest.store.staging import held_stamps
from partner_harvest.transport import widen
from partner_harvest.window import DAY, SECONDS, Slice, Window

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

# GetRecord answers HTTP 403 in a row after which the route is taken to be gone: the run
# stops instead of asking for every other record of the window (one 403 quarantines its record).
MAX_FORBIDDEN_IN_A_ROW = 10
# What a list of the window is keyed by, for lists one request showed to be empty:
# (prefix, from, until, set); set None is the whole repository.
_ListKey = tuple[str, "str | None", str, "str | None"]


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
        self.selection = Selection.of(partner)
        self.method = partner.options.oai.method
        if self.method == "identifiers_then_get":  # a list stream of GetRecords brings nothing a GetRecord each does not
            self.bulk_missing_threshold = None
        self._get_workers = partner.pool_slots  # GetRecords at once (one in a slice: pool_slots slices run)
        if self.method == "identifiers_then_get":
            widen(client.session, partner.pool_slots + 1)  # and the list's own request
        self._sweeping = False  # the list being streamed is the leavers' sweep (selection.py)
        self._not_held = 0  # listed records of excluded sets this harvest did not stage (none held)
        # Lists one request showed to be empty (window_is_empty); harvested without asking again.
        self._known_empty: set[_ListKey] = set()

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

        lists = self.selection.lists

        def page(from_: datetime | None, until: datetime, set_spec: str | None = None) -> tuple[int | None, PageSample | None]:
            key = (from_, until, set_spec)
            if key not in asked:
                asked[key] = slicing.first_page(self.client, prefix, key[2], oai_granularity, from_, until)
            return asked[key]

        def probe(from_: datetime | None, until: datetime, set_spec: str | None = None) -> int | None:
            if set_spec is not None:  # a set of slicing.sets
                return page(from_, until, set_spec)[0]
            counts = [page(from_, until, spec)[0] for spec in lists]  # the selection's lists, summed
            return None if None in counts else sum(counts)  # type: ignore[arg-type]

        def sample(from_: datetime | None, until: datetime) -> PageSample | None:
            return page(from_, until, lists[0])[1] if len(lists) == 1 else None

        # Until the plan is made no other task of the run talks to the partner: its probes go
        # out as many at once as the partner's pool has slots (slicing.Spread).
        width = max(1, self.partner.pool_slots)
        widen(self.client.session, width)
        with pooled(width, f"oai-plan-{self.partner_id}") as spread:
            by_sets = slicing.plan_by_sets(window, settings, probe, self.partner_id, spread)
            if by_sets is not None:
                return by_sets
            return slicing.plan(window, settings, probe, self.partner_id, sample, spread)

    def _lists(self, window: Window) -> tuple[str | None, ...]:
        """The sets a window lists: its slice's own (slicing.sets), else the selection's."""
        piece = window.protocol.slice
        return (piece.set_spec,) if piece is not None and piece.set_spec is not None else self.selection.lists

    def _sweeps(self, window: Window) -> bool:
        """Whether the window also lists the whole repository's headers for the records that
        left the partner's sets (an incremental window, or a slice of one; never a full
        harvest, where nothing held can have left, nor the reconcile's bulk fetch)."""
        piece = window.protocol.slice
        full = piece.of_full if piece is not None else window.is_full
        return self.selection.sweeps_leavers and not full and window.mode != "reconcile"

    def harvest(self, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        prefix = _prefix(window)
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        from_ = format_datestamp(window.from_, oai_granularity) if window.from_ else None
        until = format_datestamp(window.until, oai_granularity)
        lists = self._lists(window)
        set_spec = lists[0] if len(lists) == 1 else ",".join(str(spec) for spec in lists)  # as logs name it
        self._get_workers = 1 if window.protocol.slice is not None else max(1, self.partner.pool_slots)
        restarts = 0
        while True:
            try:
                self._not_held = 0
                sizes: list[int | None] = []
                for spec in lists:  # their union: the apply keeps one version per identifier
                    self._stream_refusable(prefix, window, spec, sink, stats)
                    sizes.append(stats.complete_list_size)
                listed = None if None in sizes else sum(sizes)  # type: ignore[arg-type]
                # what the lists announce, less the excluded records not staged (none held)
                stats.complete_list_size = None if listed is None else listed - self._not_held
                if self._sweeps(window):
                    self._sweep_leavers(prefix, window, sink, stats)
                # a full harvest, or one slice of it (its own range), never the reconcile's bulk fetch
                piece = window.protocol.slice
                if (piece.of_full if piece is not None else window.is_full) and window.mode != "reconcile":
                    stats.checks = self._completeness(prefix, window, stats, lists)
                return
            except BadResumptionToken as exc:
                restarts += 1
                request = f"{self._verb} from={from_} until={until} prefix={prefix}" + (
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

    def _stream_refusable(self, prefix: str, window: Window, set_spec: str | None, sink: StagingSink,
                          stats: HarvestStats) -> None:
        """The window's stream; bisected while the repository refuses it as too large."""
        sizes: list[int | None] = []

        def piece(from_: str | None, until: str | None) -> None:
            assert until is not None  # a harvest's window always has its frozen until
            stats.complete_list_size = None
            self._stream(prefix, from_, until, set_spec, sink, stats)
            sizes.append(stats.complete_list_size)

        self._in_pieces(piece, lambda: stats.pages, window.from_, window.until, window)
        if len(sizes) > 1:  # each piece's completeListSize counts its own list only
            stats.complete_list_size = None if None in sizes else sum(sizes)  # type: ignore[arg-type]

    def _in_pieces(self, list_piece: Callable[[str | None, str | None], None], pages: Callable[[], int],
                   low: datetime | None, high: datetime | None, window: Window, depth: int = 0) -> None:
        """``list_piece(from, until)`` of ``low..high`` (None: open), or, while the repository
        refuses it as too large before its first page (``pages()`` unchanged), of two halves
        sharing the granule of the cut, each cut again while refused, down to
        ``max_window_splits`` levels. Every list of a window goes through here (the harvest,
        the leavers' sweep, the completeness witness, the reconcile's sweep): a shortcut is
        refused the same way the ordinary path is. An open end is cut below the window's
        frozen until, the upper half staying open; an open start keeps its first piece open
        (a wrong earliestDatestamp loses nothing)."""
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        from_ = format_datestamp(low, oai_granularity) if low else None
        until = format_datestamp(high, oai_granularity) if high else None
        before = pages()
        try:
            list_piece(from_, until)
            return
        except WindowTooLarge as exc:
            if pages() != before:
                raise  # refused in the middle of its chain: not a window the repository finds too large
            step = timedelta(days=1) if oai_granularity == DAY_GRANULARITY else timedelta(seconds=1)
            top = high or window.until
            start = low or min(_lower_guess(window), top - 2 * step)
            if depth >= self.max_window_splits or top - start < 2 * step:  # halves sharing a granule: 3 at least
                raise WindowTooLarge(
                    self.partner_id, exc.request,
                    f"{exc.cause}; the window was split {depth} times (options.oai.max_window_splits="
                    f"{self.max_window_splits}) and the repository still refuses it") from exc
            middle = start + (top - start) / 2
            middle = middle.replace(microsecond=0) if step < timedelta(days=1) else middle.replace(
                hour=0, minute=0, second=0, microsecond=0)
            cut = format_datestamp(middle, oai_granularity)
            log.warning("%s: the repository refuses the window %s..%s as too large (%s); listing it as two halves "
                        "sharing the granule of the cut, %s..%s and %s..%s (split %d of at most %d)",
                        self.partner_id, from_ or "the beginning", until or "now", exc.cause,
                        from_ or "the beginning", cut, cut, until or "now", depth + 1, self.max_window_splits)
        self._in_pieces(list_piece, pages, low, middle, window, depth + 1)
        self._in_pieces(list_piece, pages, middle, high, window, depth + 1)

    @property
    def _verb(self) -> str:
        """The verb of the window's lists: ListRecords, or ListIdentifiers (identifiers_then_get)."""
        return "ListIdentifiers" if self.method == "identifiers_then_get" else "ListRecords"

    def window_is_empty(self, window: Window) -> bool:
        """One list request of the frozen window: empty (noRecordsMatch, or one page without
        items or token) means a quiet night; that list is then harvested from this answer.
        The whole repository's ListIdentifiers when the window sweeps for leavers (empty,
        every set's list is empty too), else the window's one list. A window refused as too
        large is not known empty: the harvest bisects it."""
        lists = self._lists(window)
        if window.protocol.slice is not None or (len(lists) > 1 and not self._sweeps(window)):
            return False
        prefix = _prefix(window)
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        sweep = self._sweeps(window)
        key: _ListKey = (prefix, format_datestamp(window.from_, oai_granularity) if window.from_ else None,
                         format_datestamp(window.until, oai_granularity), None if sweep else lists[0])
        verb = "ListIdentifiers" if sweep else self._verb
        pages = self.client.list_pages(verb, metadata_prefix=key[0], set_spec=key[3], from_=key[1], until=key[2],
                                       ahead=False)  # one look: no second page asked for ahead
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

    def _is_known_empty(self, key: _ListKey) -> bool:
        """A list one request showed empty; or any list of a window whose whole repository is."""
        return key in self._known_empty or (*key[:3], None) in self._known_empty

    def _stream(self, prefix: str, from_: str | None, until: str, set_spec: str | None, sink: StagingSink,
                stats: HarvestStats) -> None:
        if self._is_known_empty((prefix, from_, until, set_spec)):
            stats.pages += 1  # the empty answer window_is_empty read, as a harvest would count it
            sink.write_page([])
            return
        started = time.monotonic()
        if self._sweeping:
            self._stream_headers(prefix, from_, until, sink, stats, started)
            return
        pages = self.client.list_pages(self._verb, metadata_prefix=prefix, set_spec=set_spec, from_=from_,
                                       until=until, ahead=self.method == "list_records")
        with closing(pages):  # a failing sink stops the fetcher thread now (pipelining)
            if self.method == "list_records":
                self._stream_pages(pages, sink, stats, started,
                                   lambda page: self._selected(cast(list[HarvestItem], page.items), sink))
                return
            with ThreadPoolExecutor(self._get_workers, thread_name_prefix=f"oai-get-{self.partner_id}") as pool:
                forbidden = [0]  # GetRecords answered 403 in a row, across pages
                self._stream_pages(pages, sink, stats, started,
                                   lambda page: self._get_records(page, prefix, pool, sink, forbidden))

    # -- identifiers_then_get ------------------------------------------------------------

    def _get_records(self, page: parse.ListPage, prefix: str, pool: ThreadPoolExecutor, sink: StagingSink,
                     forbidden: list[int]) -> list[HarvestItem]:
        """One ListIdentifiers page as items: a deleted header is a deletion (no GetRecord); a
        live one is the record a GetRecord returns now (``_get_workers`` at a time)."""
        headers = [h for h in page.items if isinstance(h, parse.OaiHeader)]
        todo = [h for h in headers if h.identifier and h.datestamp and not h.deleted
                and self.selection.excluded_by(h.set_specs) is None]
        fetched = _in_order(pool, lambda h: self._get_listed(h, prefix), todo, self._get_workers)
        items: list[HarvestItem] = []
        with closing(fetched):  # a stop sends nothing more
            for header in headers:
                if not header.identifier or header.datestamp is None:
                    problems = [p for p, bad in (("no <identifier>", not header.identifier),
                                                 (f"no usable <datestamp> {header.datestamp_text!r}",
                                                  header.datestamp is None)) if bad]
                    items.append(Rejected(header.identifier or parse.MISSING_IDENTIFIER,
                                          f"{'deleted ' if header.deleted else ''}header: {'; '.join(problems)}", "",
                                          header.datestamp, prefix))
                elif header.deleted:
                    items.append(Tombstone(header.identifier, header.datestamp))
                elif self.selection.excluded_by(header.set_specs) is not None:
                    items.append(Tombstone(header.identifier, header.datestamp, EXCLUDED))
                else:
                    item = next(fetched)
                    if isinstance(item, Forbidden):
                        forbidden[0] += 1
                        if forbidden[0] >= MAX_FORBIDDEN_IN_A_ROW:
                            raise PartnerHttpError(self.partner_id, item.request, (
                                f"{forbidden[0]} GetRecord requests in a row answered HTTP 403 Forbidden: the "
                                f"repository refuses its GetRecord route (gone, or closed to us); stopping instead "
                                f"of asking for every other record. The last: {item.cause}"))
                        items.append(Rejected(header.identifier, f"GetRecord answered {item.cause}", "",
                                              header.datestamp, prefix))
                        continue
                    forbidden[0] = 0
                    items.append(item)
        return self._selected(items, sink)

    def _get_listed(self, header: parse.OaiHeader, prefix: str) -> HarvestItem | Forbidden:
        """The record a listed header names, as GetRecord returns it now. idDoesNotExist: it
        was deleted between the two requests (OAI-PMH 2.0, 4.1), a deletion at the listed
        datestamp; a repository without persistent deletions simply has nothing left to hold.
        A 403 is returned, not raised: the caller counts them in a row."""
        identifier = header.identifier or ""
        stamp = header.datestamp
        assert stamp is not None
        params = {"verb": "GetRecord", "identifier": identifier, "metadataPrefix": prefix}
        try:
            return self.client.call(params, lambda c: parse.parse_get_record(c, prefix, self.client.validation))  # type: ignore[return-value]
        except Forbidden as exc:
            return exc
        except PartnerProtocolError as exc:
            if isinstance(exc.__cause__, IdDoesNotExist):
                log.info("%s: %s was listed, then GetRecord says idDoesNotExist: deleted meanwhile",
                         self.partner_id, identifier)
                return Tombstone(identifier, stamp)
            if isinstance(exc.__cause__, CannotDisseminateFormat):
                return Rejected(identifier, f"GetRecord: {exc.cause}", "", stamp, prefix)
            raise

    # -- the selection -------------------------------------------------------------------

    def _selected(self, items: list[HarvestItem], sink: StagingSink) -> list[HarvestItem]:
        """A page's items as the partner's selection has them: a record in an excluded set is
        a deletion, staged only when the aggregation holds it (selection.py); the others are
        counted in ``_not_held`` (the lists' counts include them)."""
        if not self.selection.excluded:
            return items
        judged = [self.selection.judge(item) for item in items]
        excluded = [i.identifier for i in judged if isinstance(i, Tombstone) and i.reason == EXCLUDED]
        if not excluded:
            return judged
        held = held_stamps(sink.conn, self.partner_id, excluded)
        kept = [i for i in judged if not (isinstance(i, Tombstone) and i.reason == EXCLUDED) or i.identifier in held]
        self._not_held += len(judged) - len(kept)
        return kept

    def _sweep_leavers(self, prefix: str, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        """The whole repository's headers of the window (ListIdentifiers): a record held here
        that left the partner's sets, moved into an excluded one, or was deleted (a set's list
        may omit a deletion) becomes a deletion. Bisected like any list when refused as too large."""
        self._sweeping = True
        try:
            self._stream_refusable(prefix, window, None, sink, stats)
        finally:
            self._sweeping = False

    def _stream_headers(self, prefix: str, from_: str | None, until: str, sink: StagingSink, stats: HarvestStats,
                        started: float) -> None:
        pages = self.client.list_pages("ListIdentifiers", metadata_prefix=prefix, set_spec=None, from_=from_,
                                       until=until)
        with closing(pages):
            self._stream_pages(pages, sink, stats, started, lambda page: self._leavers(page, sink), "sweep ")
        stats.complete_list_size = None  # the sweep's count is the repository's, not the selection's

    def _leavers(self, page: parse.ListPage, sink: StagingSink) -> list[HarvestItem]:
        gone: list[HarvestItem] = []
        for header in page.items:
            if not isinstance(header, parse.OaiHeader) or not header.identifier or header.datestamp is None:
                continue
            leaves, reason = self.selection.leaver(header.set_specs, header.deleted)
            if leaves:
                gone.append(Tombstone(header.identifier, header.datestamp, reason))
        held = held_stamps(sink.conn, self.partner_id, [item.identifier for item in gone])
        return [item for item in gone if item.identifier in held]

    def _stream_pages(self, pages: Iterable[parse.ListPage], sink: StagingSink, stats: HarvestStats,
                      started: float, items_of: Callable[[parse.ListPage], list[HarvestItem]],
                      what: str = "") -> None:
        cleaned = 0
        for page in pages:
            stats.pages += 1
            items = items_of(page)
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
                "%s: %spage %d: %d items; %d fetched%s (%d records, %d deleted, %d rejected), %.0f/s%s",
                self.partner_id, what, stats.pages, len(items), stats.fetched, of,
                stats.records, stats.tombstones, stats.rejected, rate, left,
            )
        stats.cleaned_pages = cleaned


    # -- completeness (I12) --------------------------------------------------------------

    def _completeness(self, prefix: str, window: Window, stats: HarvestStats,
                      lists: tuple[str | None, ...] = (None,)) -> list[Check]:
        """Second witnesses of a full harvest, as record_check arguments, failures last
        (the audit row keeps the last one recorded).

        ``oai-complete-list-size``: the repository's own count on the list's last page
        (summed over the selection's lists). ``oai-list-identifiers``
        (``options.completeness.list_identifiers``): a separate ListIdentifiers count of the
        same prefix, sets and window (cut as the harvest's lists were, when the repository
        refuses it as too large), against everything fetched (records + tombstones +
        rejects). Either differing means a list stopped short, repeated itself, or changed
        while it was read. Records of excluded sets that were not staged (none held) are
        taken off both counts.
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
            checks.append(self._list_identifiers_check(prefix, window, stats, lists))
        checks.sort(key=lambda check: check[3], reverse=True)
        return checks

    def _list_identifiers_check(self, prefix: str, window: Window, stats: HarvestStats,
                                lists: tuple[str | None, ...] = (None,)) -> Check:
        oai_granularity = window.protocol.oai_granularity or DAY_GRANULARITY
        request = (f"ListIdentifiers metadataPrefix={prefix} set={','.join(str(spec) for spec in lists)} "
                   f"until={format_datestamp(window.until, oai_granularity)}")
        if window.from_:
            request += f" from={format_datestamp(window.from_, oai_granularity)}"
        restarts = 0
        while True:
            tally = _Tally(-self._not_held)
            try:
                for set_spec in lists:
                    def piece(from_: str | None, until: str | None, set_spec: str | None = set_spec,
                              tally: _Tally = tally) -> None:
                        with closing(self.client.list_pages("ListIdentifiers", metadata_prefix=prefix,
                                                            set_spec=set_spec, from_=from_,
                                                            until=until)) as chain:
                            for page in chain:
                                tally.pages += 1
                                tally.headers += len(page.items)

                    self._in_pieces(piece, tally.pages_so_far, window.from_, window.until, window)
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
        listed = tally.headers
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

        The selection's: one sweep per set of the partner's (a record in two is listed twice;
        the plan counts it once); a header in an excluded set is listed as deleted (held, it
        is removed); a record that left the sets is not listed, and its GetRecord shows it
        outside them (verify_vanished). A sweep the repository refuses as too large is cut as a
        harvest's window is (``_in_pieces``; the last piece still open-ended; a record listed
        in two pieces is one row of the plan, as one in two sets).
        """
        prefix = _prefix(window)
        piece = window.protocol.slice
        low = window.from_ if piece is not None else None
        high = None if piece is None or piece.open_end else window.until
        restarts = 0
        while True:
            try:
                for set_spec in self.selection.lists:
                    def sweep(from_: str | None, until: str | None, set_spec: str | None = set_spec) -> None:
                        with closing(self.client.list_pages("ListIdentifiers", metadata_prefix=prefix,
                                                            set_spec=set_spec, from_=from_,
                                                            until=until)) as pages:
                            for page in pages:
                                stats.pages += 1
                                rows = [(h.identifier, _stamp(h),
                                         h.deleted or self.selection.excluded_by(h.set_specs) is not None)
                                        for h in page.items if isinstance(h, parse.OaiHeader) and h.identifier]
                                stats.fetched += len(rows)
                                sink.write_page(rows)
                                if stats.pages % 20 == 0 or not page.token:
                                    log.info("%s: reconcile sweep page %d: %d headers so far",
                                             self.partner_id, stats.pages, stats.fetched)

                    self._in_pieces(sweep, lambda: stats.pages, low, high, window)
                return
            except BadResumptionToken:
                restarts += 1
                if restarts > self.partner.max_token_restarts:
                    raise
                log.warning("%s: resumptionToken expired during the sweep; restarting it", self.partner_id)
                sink.reset()
                stats.reset()

    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """GetRecord for ids the aggregation lacks (and the content check's sample), as many at
        once as :meth:`_get_each` sends; an id gone meanwhile is skipped."""
        items: list[HarvestItem] = []
        for identifier, item in self._get_each(window, identifiers):
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
        return self._get_each(window, identifiers)

    def _get_each(self, window: Window, identifiers: list[str]) -> list[tuple[str, HarvestItem | None]]:
        """A GetRecord for each id, in order, the partner's pool's slots at once: only the
        reconcile's settle asks (every slice swept, no other task of the run talks to the
        partner, as the plan's probes: spread.py); each request still paced by the host's
        politeness. The first error raises and nothing more is sent, as one after the other."""
        width = min(max(1, self.partner.pool_slots), len(identifiers))
        if width < 2:
            return [(identifier, self._get_record(window, identifier)) for identifier in identifiers]
        widen(self.client.session, self.partner.pool_slots + 1)
        with ThreadPoolExecutor(width, thread_name_prefix=f"oai-get-{self.partner_id}") as pool:
            with closing(_in_order(pool, lambda identifier: self._get_record(window, identifier), identifiers,
                                   width)) as answers:
                return list(zip(identifiers, answers))

    def _get_record(self, window: Window, identifier: str) -> HarvestItem | None:
        """The record now, as the selection has it (one outside the sets, or in an excluded
        one, is a deletion); None: idDoesNotExist."""
        prefix = _prefix(window)
        params = {"verb": "GetRecord", "identifier": identifier, "metadataPrefix": prefix}
        try:
            item: HarvestItem = self.client.call(  # type: ignore[assignment]
                params, lambda c: parse.parse_get_record(c, prefix, self.client.validation))
        except PartnerProtocolError as exc:
            if isinstance(exc.__cause__, IdDoesNotExist):
                return None
            raise
        if isinstance(item, Record):
            leaves, reason = self.selection.leaver(item.set_specs, False)
            if leaves:
                return Tombstone(item.identifier, item.datestamp, reason)
        return item


@dataclass
class _Tally:
    """Headers and pages a witness's lists counted."""

    headers: int = 0
    pages: int = 0

    def pages_so_far(self) -> int:
        return self.pages


def _in_order(pool: ThreadPoolExecutor, call: Callable[[T], R], inputs: list[T], ahead: int) -> Generator[R, None, None]:
    """``call`` of each input on ``pool``, results in input order, at most ``ahead`` in flight;
    nothing more is sent once the caller stops asking (a run that stops on 403s)."""
    pending: deque[Future[R]] = deque()
    queue = iter(inputs)
    try:
        for value in islice(queue, ahead):
            pending.append(pool.submit(call, value))
        while pending:
            yield pending.popleft().result()
            for value in islice(queue, 1):
                pending.append(pool.submit(call, value))
    finally:
        for future in pending:
            future.cancel()


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
