"""The harvest contract: what every protocol adapter yields and the store consumes.

Adapters (OAI-PMH, Sierra) turn partner responses into these three shapes; nothing
downstream of an adapter knows which protocol a record came from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from partner_harvest.formats.checks import Finding

# The three items are msgspec structs, not dataclasses: a frozen dataclass took 1.3-2.5 µs to
# build (a CSV row costs about 10 in all), a struct 0.1. Untracked by the garbage collector
# (gc=False): they hold strings, stamps and tuples, no cycle. A copy with other fields:
# msgspec.structs.replace.


class Record(msgspec.Struct, frozen=True, gc=False):
    """A live record as the partner publishes it, validated and ready to upsert."""

    identifier: str
    datestamp: datetime  # timezone-aware UTC; the partner's version stamp
    metadata_prefix: str
    metadata: str  # the raw XML of the payload element, serialised
    set_specs: tuple[str, ...] = ()
    title: str | None = None
    # What is odd but usable about it (formats/checks.py): stored with the record, counted per run
    warnings: tuple[Finding, ...] = ()
    # An attached record (a library's item or holdings record) lands in the table ``entity``
    # names instead of ``records``, with ``metadata`` its JSON and ``parents`` the records
    # (bibs) it belongs to (store/attached.py). None: a record.
    entity: str | None = None
    parents: tuple[str, ...] = ()

    @property
    def content_hash(self) -> str:
        """Identifies the payload so a replay with the same datestamp is a no-op."""
        # SHA-256 of the payload's UTF-8, a NUL, and the set specs joined by US (one encode)
        text = self.metadata + "\x00" + "\x1f".join(self.set_specs)
        if self.parents:  # an attached record moved to other records is another version
            text += "\x00" + "\x1f".join(self.parents)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Tombstone(msgspec.Struct, frozen=True, gc=False):
    """The partner says this record is gone as of ``datestamp``, or it is no longer one to hold.

    ``reason``: why, when it is not the partner's own deletion notice (a Sierra bib
    suppressed or listed without MARC, an OAI-PMH record outside the partner's sets); the
    purge's ``deletions.reason``, which the change feed carries. None: ``tombstone``.
    """

    identifier: str
    datestamp: datetime
    reason: str | None = None
    entity: str | None = None  # an attached record's table (Record.entity); None: a record


class Rejected(msgspec.Struct, frozen=True, gc=False):
    """A record that failed validation; it goes to quarantine, never silently away."""

    identifier: str
    reason: str
    raw: str
    datestamp: datetime | None = None
    metadata_prefix: str | None = None


HarvestItem = Record | Tombstone | Rejected


# A completeness check (I12) an adapter ran: (kind, expected, found, ok, detail), recorded
# on the channel's audit row by the pipeline (store.runs.record_check).
Check = tuple[str, "int | None", "int | None", bool, str]


@dataclass(slots=True)
class HarvestStats:
    """Running totals of one harvest channel; becomes the ``harvest_runs`` row."""

    pages: int = 0
    fetched: int = 0
    records: int = 0
    tombstones: int = 0
    rejected: int = 0
    complete_list_size: int | None = None
    restarts: int = 0
    # Items the channel should bring, for its progress and time left only (Sierra: the id
    # span); never a check, never the end of a listing. completeListSize, when known, wins.
    expected: int | None = None
    checks: list[Check] = field(default_factory=list)  # second witnesses (I12) the adapter ran
    cleaned_pages: int = 0  # OAI-PMH pages whose XML had to be cleaned before it parsed

    def add(self, item: HarvestItem) -> None:
        self.fetched += 1
        if isinstance(item, Record):
            self.records += 1
        elif isinstance(item, Tombstone):
            self.tombstones += 1
        else:
            self.rejected += 1

    def reset(self) -> None:
        """Forget a partial window (an expired token restarts it from scratch)."""
        self.pages = self.fetched = self.records = self.tombstones = self.rejected = 0
        self.complete_list_size = None
