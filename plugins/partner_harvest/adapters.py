"""What the pipeline needs from a protocol adapter; OAI-PMH and Sierra both provide it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from partner_harvest.records import HarvestItem, HarvestStats
from partner_harvest.window import Window


class ItemSink(Protocol):
    """Where harvested pages go (the staging table in production)."""

    def write_page(self, items: list[HarvestItem]) -> None: ...

    def reset(self) -> None: ...


class StagingSink(ItemSink, Protocol):
    """A sink staging into PostgreSQL (``StagingWriter``): an adapter that proves its
    completeness (I12) compares in SQL on ``conn`` and records the check on ``run``."""

    conn: Any  # psycopg.Connection
    run: Any  # store.RunRef


@dataclass(frozen=True)
class PartnerClock:
    """The partner's own idea of now, and the facts the window must be written in."""

    now: datetime
    granularity: str  # window.DAY or window.SECONDS
    protocol: dict[str, Any] = field(default_factory=dict)


class Adapter(Protocol):
    """A protocol adapter. Optional extras, looked up by the pipeline when present:
    ``plan_channels`` + ``poll_deletions`` (a deletions channel with its own cursor, Sierra)
    and ``sweep_ids`` + ``fetch_records`` + ``fetch_chunk`` (the weekly reconcile)."""

    partner_id: str

    def clock(self) -> PartnerClock:
        """Ask the partner for its clock; called once, by freeze_window."""

    def harvest(self, window: Window, sink: ItemSink, stats: HarvestStats) -> None:
        """Stream the window's changes page by page into ``sink``."""
