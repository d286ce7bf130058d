"""Window planning: which slice of the partner's history a run harvests.

``until`` is frozen once from the partner's own clock and then reused by every retry;
``from`` is the previous ``until`` minus a lag, floored to the repository's granularity,
so changes indexed late at the edge of the last window are fetched again (upserts are
idempotent, so the overlap is harmless).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

MODES = ("incremental", "full", "window")
DAY = "day"
SECONDS = "seconds"


class WindowError(ValueError):
    """The requested window cannot be planned (bad Params, partner clock behind, ...)."""


def as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def floor_to(value: datetime, granularity: str) -> datetime:
    value = as_utc(value).replace(microsecond=0)
    if granularity == DAY:
        return value.replace(hour=0, minute=0, second=0)
    return value


def parse_instant(text: str) -> datetime:
    """Parse ``YYYY-MM-DD`` or an ISO 8601 timestamp (``Z`` or offset) into UTC."""
    text = text.strip()
    if len(text) == 10:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return as_utc(datetime.fromisoformat(text))
    except ValueError:
        raise WindowError(f"not a date or ISO 8601 timestamp: {text!r}") from None


def format_instant(value: datetime) -> str:
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def _instant(value: object) -> object:
    """Text (XCom) parsed; a datetime in UTC to the second, as its JSON form keeps it."""
    if isinstance(value, str):
        return parse_instant(value)
    return as_utc(value).replace(microsecond=0) if isinstance(value, datetime) else value


# An instant in UTC; in JSON (XCom) ``YYYY-MM-DDThh:mm:ssZ``, read back from that or a date.
Instant = Annotated[
    datetime,
    BeforeValidator(_instant),
    PlainSerializer(lambda value: format_instant(value), return_type=str, when_used="json"),
]


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)


class ClockBehind(_Facts):
    """The partner's clock was behind our cursor by more than the lag when the window froze."""

    clock: str
    cursor: str


class ChannelPlan(_Facts):
    """The own window of a run's extra channel (Sierra's day-granular deletion polls, its item
    change polls to the second); ``from`` None: everything (a first load of the channel)."""

    from_: Instant | None = Field(default=None, alias="from")
    until: Instant
    skip: bool = False  # nothing to poll (a full load from scratch: deletions start tomorrow)
    granularity: str = DAY  # its cursor's (protocols.Channel.granularity)
    partner_clock: Instant | None = None
    clock_regressed: bool = False


class Slice(_Facts):
    """One slice of a big window, in every role it has: what an adapter plans (``channel``
    still empty), what harvest_runs records (store/slices), one piece of the mapped harvest
    as JSON (:meth:`to_json`, the XCom), and what a slice's sub-window knows of its slice
    (``WindowFacts.slice``, with ``resume_at`` and ``of_full``; pipeline.slice_window), as
    well as a reconcile sweep's slice (sliced_reconcile)."""

    channel: str = ""  # changes/001, ... once planned
    from_: Instant | None = Field(default=None, alias="from")
    until: Instant
    lo: int | None = None  # a Sierra id range [lo, hi] (hi None: open-ended); IIIF: page positions
    hi: int | None = None
    estimate: int | None = None  # records the plan expected (a count or an id span), for progress only
    set_spec: str | None = Field(default=None, alias="set")  # an OAI slice that is one set of the repository
    open_end: bool = False  # a reconcile sweep's last slice: listed without an until
    # An IIIF slice: its stream pages newest first (position lo is pages[0]; 0 is the frozen
    # last page) and the activities the plan counted on each; kept in harvest_runs, not XCom.
    pages: tuple[str, ...] = ()
    page_items: tuple[int, ...] = ()
    resume_at: int | None = None  # in a sub-window: the checkpoint a retried Sierra (or IIIF) slice resumes at
    of_full: bool = False  # in a sub-window: a slice of a full harvest proves its own range (I12)

    @property
    def unbounded(self) -> bool:
        """No upper bound (a Sierra id range without ``hi``, a sweep's ``open_end`` slice): it
        holds whatever lies above the plan's bound too, so at least its estimate."""
        return self.open_end or (self.lo is not None and self.hi is None)

    def to_json(self) -> dict[str, Any]:
        """The XCom form of a planned slice (page lists stay in harvest_runs: a slice reads them there)."""
        return self.model_dump(mode="json", by_alias=True, exclude={"pages", "page_items", "resume_at", "of_full"})


class IiifEntry(_Facts):
    """One activity of the last page an IIIF Change Discovery run froze (iiif/stream.Activity)."""

    kind: str
    when: str | None = None  # the exact endTime (startTime of a Refresh), microseconds kept
    object_id: str | None = None
    object_type: str | None = None
    see_also: tuple[tuple[str, str | None, str | None], ...] = ()  # (url, format, profile)
    target_id: str | None = None
    target_see_also: tuple[tuple[str, str | None, str | None], ...] = ()
    origin_id: str | None = None


class IiifFacts(_Facts):
    """What an IIIF Change Discovery run froze: the stream as it stood when the window froze."""

    collection: str  # the collection's id
    last_page: str  # the last page when the window froze: the walk starts here
    last_prev: str | None = None  # its prev link
    newest: str | None = None  # the newest activity's exact time: the run's upper bound
    total_items: int | None = None  # the collection's totalItems then (a second witness)
    tail: tuple[IiifEntry, ...] | None = None  # the last page's activities then (None: read again)


class DeliveryFile(_Facts):
    """One file of a dated delivery as the listing showed it when the window froze."""

    path: str  # relative to the partner's location
    size: int
    etag: str | None = None  # the store's ETag, or the modification time where there is none
    checksum: str | None = None  # "sha256:<hex>" (or md5, sha1, sha512) from the delivery's checksum file or manifest


class Delivery(_Facts):
    """One dated delivery of a file partner (files/): a full dump or a delta, and its files."""

    date: Instant
    kind: str  # full or delta
    files: tuple[DeliveryFile, ...]


class DeliveryFacts(_Facts):
    """What a file-delivery run froze: the deliveries it applies, in date order, and why the
    chain stops where it does (a delivery still being written, a gap)."""

    deliveries: tuple[Delivery, ...] = ()
    waiting: str | None = None


class WindowFacts(_Facts):
    """The facts frozen with a window (the partner's clock, the protocol's answers), read by
    every task of the run: typed here, JSON only at the XCom boundary (:meth:`Window.to_dict`)."""

    partner_clock: Instant | None = None  # the partner's own clock when the window froze
    clock_regressed: bool = False  # the clock trails the highest stamp applied runs saw
    clock_behind_cursor: ClockBehind | None = None
    epoch: int | None = None  # the operator epoch the run's writes are fenced by
    channels: dict[str, ChannelPlan] = Field(default_factory=dict)
    slice: Slice | None = None
    skip: bool = False  # a channel window with nothing to poll (ChannelPlan.skip)
    refresh: str | None = None  # why this run is a content refresh (a full harvest the content check asked for)
    # OAI-PMH: what Identify and the prefix resolution said
    metadata_prefix: str | None = None
    oai_granularity: str | None = None
    deleted_record: str | None = None
    set_spec: str | None = Field(default=None, alias="set")
    earliest_datestamp: Instant | None = None
    # Sierra: the bib fields the change poll asks for
    fields: str | None = None
    # A reconcile's sweep and fetch of an attached table (protocols.Channel.entity: items,
    # holdings) instead of the records
    entity: str | None = None
    # IIIF Change Discovery: the stream as it stood (upper bound, last page, totalItems)
    iiif: IiifFacts | None = None
    # File deliveries: the dated dumps and deltas the run applies
    files: DeliveryFacts | None = None
    # The run's changes list every record the partner held at this instant (a full dump): held
    # records stamped no later that no piece staged are purged by the apply (run.apply), reason
    # not_listed, through the shrink gate (gates.covers_whole_collection)
    whole_list_at: Instant | None = None
    # Where a resumed try of an unsliced window starts (Adapter.resumes_window): its checkpoint
    resume_at: int | None = None

    def with_(self, **changes: object) -> WindowFacts:
        """A copy with ``changes`` (validated)."""
        return type(self).model_validate({**self.model_dump(), **changes})


@dataclass(frozen=True)
class Window:
    """The frozen bounds of one run; serialisable to XCom as a plain dict.

    ``protocol`` may be given as a mapping (it is validated into :class:`WindowFacts`).
    """

    mode: str
    from_: datetime | None
    until: datetime
    granularity: str
    advances_cursor: bool
    protocol: WindowFacts = field(default_factory=WindowFacts)  # adapter facts frozen with it

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, WindowFacts):
            object.__setattr__(self, "protocol", WindowFacts.model_validate(self.protocol or {}))

    @property
    def partner_clock(self) -> datetime | None:
        """The partner's own clock when the window was frozen (it may trail ``until``)."""
        return self.protocol.partner_clock

    @property
    def is_full(self) -> bool:
        return self.from_ is None

    def with_facts(self, **changes: object) -> Window:
        return replace(self, protocol=self.protocol.with_(**changes))

    def to_dict(self) -> dict[str, Any]:
        """The XCom form (JSON): instants as ``YYYY-MM-DDThh:mm:ssZ``, unset facts left out."""
        return {
            "mode": self.mode,
            "from": format_instant(self.from_) if self.from_ else None,
            "until": format_instant(self.until),
            "granularity": self.granularity,
            "advances_cursor": self.advances_cursor,
            "protocol": self.protocol.model_dump(mode="json", by_alias=True, exclude_defaults=True),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Window:
        return cls(
            mode=data["mode"],
            from_=parse_instant(data["from"]) if data.get("from") else None,
            until=parse_instant(data["until"]),
            granularity=data["granularity"],
            advances_cursor=bool(data["advances_cursor"]),
            protocol=WindowFacts.model_validate(data.get("protocol") or {}),
        )

    def describe(self) -> str:
        start = format_instant(self.from_) if self.from_ else "the beginning"
        kind = "requested" if self.mode == "window" else self.mode  # never "window window"
        return f"{kind} window from {start} until {format_instant(self.until)} ({self.granularity})"


def backfill_day(tick: datetime) -> tuple[datetime, datetime]:
    """The window a backfill run harvests: the UTC day of its date (its cron tick), midnight to
    midnight. A backfill From 2024-11-01 To 2024-11-04 of a nightly 02:00 schedule makes the
    runs of Nov 1, 2 and 3 (02:00 ticks); they harvest Nov 1 00:00 .. Nov 4 00:00, the days
    the form names, not each tick's data interval (the day before the date in its name)."""
    day = as_utc(tick).replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day + timedelta(days=1)


def plan_window(
    *,
    mode: str,
    partner_clock: datetime,
    granularity: str,
    lag: timedelta,
    cursor_until: datetime | None,
    requested_from: datetime | None = None,
    requested_until: datetime | None = None,
    may_advance_cursor: bool = True,
) -> Window:
    """Decide the run's bounds; ``may_advance_cursor`` is False for backfills."""
    if mode not in MODES:
        raise WindowError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if granularity not in (DAY, SECONDS):
        raise WindowError(f"granularity must be {DAY!r} or {SECONDS!r}, got {granularity!r}")
    clock = floor_to(partner_clock, granularity)
    if mode == "window":
        if requested_from is None:
            raise WindowError("mode 'window' needs the 'from' Param")
        until = floor_to(requested_until, granularity) if requested_until else clock
        start = floor_to(requested_from, granularity)
        if start > until:
            raise WindowError(f"'from' ({format_instant(start)}) is after 'until' ({format_instant(until)})")
        return Window("window", start, until, granularity, advances_cursor=False)
    if mode == "full":
        return Window("full", None, clock, granularity, advances_cursor=False)
    if cursor_until is None:
        return Window("incremental", None, clock, granularity, advances_cursor=may_advance_cursor)
    start = floor_to(as_utc(cursor_until) - lag, granularity)
    # A partner clock behind our cursor (clock reset, failover) must not give from > until:
    # harvest up to the cursor again rather than refuse or skip.
    until = max(clock, floor_to(cursor_until, granularity))
    return Window("incremental", min(start, until), until, granularity, advances_cursor=may_advance_cursor)


def next_cursor(current: datetime | None, window: Window) -> datetime | None:
    """The cursor after this window applied: forward only, and only for incremental runs."""
    if not window.advances_cursor:
        return current
    if current is None or window.until > as_utc(current):
        return window.until
    return current


def channel_windows(window: Window) -> dict[str, Window]:
    """The own window of each of the run's extra channels."""
    return {name: own for name in window.protocol.channels if (own := channel_window(window, name)) is not None}


def channel_window(window: Window, channel: str) -> Window | None:
    """The own window of a run's extra channel, e.g. Sierra's deletions (a day window)."""
    plan = window.protocol.channels.get(channel)
    if plan is None:
        return None
    facts = WindowFacts(partner_clock=plan.partner_clock, clock_regressed=plan.clock_regressed, skip=plan.skip)
    return Window(window.mode, plan.from_, plan.until, plan.granularity, window.advances_cursor, facts)
