"""The protocol adapter contract: what the pipeline and the reconcile need from a protocol.

A new protocol subclasses :class:`Adapter`: it must implement the abstract methods (the
partner's clock, a window's changes, the reconcile's sweep and fetch) and may override
the others, whose defaults say "this protocol has no such thing". The pipeline calls
every method unconditionally; nothing is looked up by name. docs/design/adapters.md
describes the contract and how a third protocol plugs in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from partner_harvest.records import HarvestItem, HarvestStats
from partner_harvest.window import ChannelPlan, Slice, Window

if TYPE_CHECKING:
    import psycopg

    from partner_harvest.registry import Partner, SliceSettings
    from partner_harvest.store import RunRef


class StagingSink(Protocol):
    """Where an adapter streams a channel, page by page: in a run, the run channel's staging
    in PostgreSQL (store.staging.StagingWriter).

    ``write_page`` stores one page in its own transaction; a resumable adapter passes its
    position after the page (``checkpoint``: where a retried slice resumes). ``reset`` drops
    what the channel staged (a restarted token chain). ``conn`` and ``run`` name the staging
    for an adapter that compares in SQL (Sierra's completeness proof and its resume after
    the staged prefix, IIIF's held versions); None for a sink that is no database (a
    benchmark's list), where such an adapter says what it cannot do."""

    seq: int  # the last staged item's position; a resumed try continues after it

    @property
    def conn(self) -> psycopg.Connection[Any] | None: ...

    @property
    def run(self) -> RunRef | None: ...

    @property
    def attempt(self) -> int | None: ...

    def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None: ...

    def reset(self) -> None: ...


# One row of the reconcile's sweep: (identifier, datestamp or None, deleted).
SweptId = tuple[str, "datetime | None", bool]


class IdSink(Protocol):
    """Where the reconcile's sweep goes (store.reconcile.IdSweepWriter)."""

    def write_page(self, headers: list[SweptId]) -> None: ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class PartnerClock:
    """The partner's own idea of now, and the facts the window must be written in."""

    now: datetime
    granularity: str  # window.DAY or window.SECONDS
    protocol: dict[str, Any] = field(default_factory=dict)


# What plan_channels returns: channel name -> its own window.
ChannelPlans = dict[str, ChannelPlan]
# What verify_vanished returns: each identifier with the partner's answer (None: gone).
Verdicts = list[tuple[str, HarvestItem | None]]


class Adapter(ABC):
    """One partner's protocol: built by factory.build_adapter from the registry entry.

    Must provide: :meth:`clock`, :meth:`harvest`, :meth:`sweep_ids`, :meth:`fetch_records`.
    May provide (defaults below): the extra channels its spec declares
    (protocols.ProtocolSpec.channels; :meth:`plan_channels`, :meth:`harvest_channel`), slices
    (:meth:`plan_slices`, :attr:`resumes_slices`), resuming an interrupted try's staging
    (:meth:`resumes_staging`, :attr:`resumes_window`), settling the frozen window against what
    was applied (:meth:`settle_window`), a cheap look at a quiet window (:meth:`window_is_empty`),
    verifying vanished records (:attr:`verify_limit`, :meth:`verify_vanished`) and a bulk
    fetch of many missing records (:attr:`bulk_missing_threshold`).
    """

    fetch_chunk: ClassVar[int] = 100
    """Identifiers per :meth:`fetch_records` / :meth:`verify_vanished` call (bounds memory and URLs)."""

    resumes_slices: ClassVar[bool] = False
    """Whether a slice interrupted mid-way resumes from its checkpoint (store/slices.resumable)
    instead of restarting from its own start; default False (an OAI token cannot be resumed)."""

    resumes_window: ClassVar[bool] = False
    """Whether an unsliced window interrupted mid-way resumes at its checkpoint as a slice does
    (store/slices.resumable), reading it as ``window.protocol.resume_at``; default False."""

    verify_limit: int | None = None
    """Vanished reconcile candidates confirmed per reconcile with :meth:`verify_vanished`;
    None (the default): the protocol's sweep is authoritative and nothing is verified."""

    bulk_missing_threshold: int | None = None
    """More records missing locally than this come back through one :meth:`harvest` stream
    instead of :meth:`fetch_records`; None (the default): always by identifier."""

    def __init__(self, partner: Partner):
        self.partner = partner
        self.partner_id = partner.id
        self.responses = 0  # responses the partner's session received (factory.build_adapter counts them)

    # -- must -------------------------------------------------------------------------

    @abstractmethod
    def clock(self) -> PartnerClock:
        """Ask the partner for its clock; called once per run, by pipeline.freeze_window."""

    @abstractmethod
    def harvest(self, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        """Stream the window's changes page by page into ``sink`` (a slice's window too)."""

    def window_is_empty(self, window: Window) -> bool:
        """Whether one cheap request (one per extra channel the window planned) shows the
        window holds no change (a quiet night); the adapter then harvests that window, and
        those channels, without asking again. Default: cannot tell."""
        return False

    @abstractmethod
    def sweep_ids(self, window: Window, sink: IdSink, stats: HarvestStats) -> None:
        """The reconcile's sweep: every identifier the partner holds now, as
        ``(identifier, datestamp or None, deleted)`` rows written page by page into ``sink``."""

    @abstractmethod
    def fetch_records(self, window: Window, identifiers: list[str]) -> list[HarvestItem]:
        """The current version of each identifier, fetched by identifier: the reconcile's
        missing records and the content check's sample (content_check.py). An identifier the
        partner no longer holds is left out (or comes back as a Tombstone)."""

    # -- may --------------------------------------------------------------------------

    def plan_channels(self, window: Window, cursors: dict[str, datetime | None]) -> ChannelPlans:
        """The own window of each of its spec's extra channels, from its cursor; default none."""
        return {}

    def harvest_channel(self, channel: str, window: Window, sink: StagingSink, stats: HarvestStats) -> None:
        """Stream the extra channel ``channel`` (one its spec declares and ``plan_channels`` planned)."""
        raise NotImplementedError(f"{type(self).__name__} has no channel {channel!r}")

    def plan_slices(self, window: Window, settings: SliceSettings) -> Sequence[Slice]:
        """How to cut a big window into slices (registry ``slicing``); default: never (whole)."""
        return []

    def settle_window(self, window: Window, conn: psycopg.Connection) -> Window:
        """The frozen window settled against what the aggregation already applied of the
        partner (read on ``conn``), once its bounds are known: an adapter whose partner
        publishes whole deliveries keeps only those not yet applied. Default: as frozen."""
        return window

    def plan_sweep(self, window: Window, slices: int, threshold: int) -> Sequence[Slice]:
        """How to cut the reconcile's sweep into about ``slices`` ranges when the partner holds
        more than ``threshold`` records (sliced_reconcile.py); :meth:`sweep_ids` then gets each
        range's sub-window (``window.protocol.slice``). Default: never (one sweep)."""
        return []

    def resumes_staging(self, channel: str, window: Window) -> bool:
        """Whether a new try of ``channel`` keeps what an unfinished try of the same frozen
        window staged (and resumes after it); default False: each try starts clean."""
        return False

    def verify_vanished(self, window: Window, identifiers: list[str]) -> Verdicts:
        """Ask the partner about records the sweep no longer lists; called only when
        :attr:`verify_limit` is set."""
        raise NotImplementedError(f"{type(self).__name__} does not verify vanished records")
