"""In-memory model of a museum collection as an OAI-PMH repository sees it.

Kept free of HTTP so tests can drive it directly. Storage is a handful of
parallel arrays indexed by record number - 1, so 200k records build and filter
in milliseconds and cost a few bytes each. Time is a simulated clock, never the
wall clock, so incremental-harvest tests are deterministic.
"""

from __future__ import annotations

import random
import re
from array import array
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from ..clock import EPOCH, epoch_seconds
from ..model import SimulatedModel

ID_PREFIX = "oai:sim.example:rec-"
TYPES: tuple[str, ...] = ("painting", "print", "sculpture")
# The first three departments line up with TYPES; "asian-art" cuts across them.
DEPARTMENTS: tuple[str, ...] = ("paintings", "prints", "sculpture", "asian-art")
SETS: tuple[tuple[str, str], ...] = (
    ("type", "Object type"),
    ("type:painting", "Paintings"),
    ("type:print", "Prints"),
    ("type:sculpture", "Sculpture"),
    ("dept", "Curatorial department"),
    ("dept:paintings", "Department of Paintings"),
    ("dept:prints", "Department of Prints and Drawings"),
    ("dept:sculpture", "Department of Sculpture"),
    ("dept:asian-art", "Department of Asian Art"),
)
GRANULARITY_SECONDS = {"seconds": 1, "day": 86400}
DELETED_POLICIES = ("persistent", "transient", "no")
# What Identify says the earliest datestamp is: the truth, or what real servers send (I13):
# a later time than some records carry (e.g. the date the repository software was set up,
# after a migration kept older stamps), no such element, or the epoch.
EARLIEST_DATESTAMPS = ("true", "late", "absent", "epoch")
# How from/until are compared with the stored stamps (I13): at the granularity, as OAI-PMH
# says (an until covers its whole second or day), or "raw": the repository stores sub-second
# stamps (it reports them truncated) and compares them with the argument as given, so
# until=m excludes a record stored at m + 0.5 s, and from=m + 1 s excludes it too.
STAMP_COMPARISONS = ("granular", "raw")
# How the records' datestamps spread over the year before the clock (I13):
# "uniform", or "clustered": a few bursts (a migration, a bulk edit) hold most records and
# a trickle fills only part of the year, so equal time ranges hold very unequal counts;
# the seed varies the bursts' number, places, widths and shares.
SPREADS = ("uniform", "clustered")
# The order a list returns its records in (I13): by identifier (DSpace, EPrints: by item
# id), or by datestamp (repositories that page with a datestamp index).
LIST_ORDERS = ("identifier", "datestamp")
SUPPORTED_FORMATS = ("oai_dc", "lido")
# Which setSpecs a header lists (I13): every level of each set's path ("type",
# "type:painting"), or only the deepest ("type:painting"), which places the record in
# "type" too by the set hierarchy; set=type selects it either way.
HEADER_SETS = ("path", "leaf")

LIVE, TOMBSTONE, GONE = 0, 1, 2
_YEAR = 365 * 86400
_ID_RE = re.compile(r"oai:sim\.example:rec-(\d{7,})")
_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SECONDS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_DAY_CACHE: dict[int, str] = {}  # days since epoch -> "YYYY-MM-DD" (shared, grows by days only)
_HOUR_MINUTE = tuple(f"T{m // 60:02d}:{m % 60:02d}:" for m in range(1440))
_SECOND = tuple(f"{s:02d}Z" for s in range(60))


def _kind_for(number: int, seed: int) -> int:
    """Pack (type index, department index) as type*4+dept from a seeded hash."""
    h = (number * 2654435761 + seed * 40503) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 2246822519) & 0xFFFFFFFF
    h ^= h >> 13
    kind_type = h % 3
    dept = 3 if (h >> 8) % 5 == 0 else kind_type
    return kind_type * 4 + dept


def _sets_for_kind(kind: int) -> tuple[str, ...]:
    return ("type", f"type:{TYPES[kind >> 2]}", "dept", f"dept:{DEPARTMENTS[kind & 3]}")


SET_SPECS_BY_KIND: dict[int, tuple[str, ...]] = {
    t * 4 + d: _sets_for_kind(t * 4 + d) for t in range(len(TYPES)) for d in range(len(DEPARTMENTS))
}
LEAF_SPECS_BY_KIND: dict[int, tuple[str, ...]] = {kind: specs[1::2] for kind, specs in SET_SPECS_BY_KIND.items()}


def identifier_for(number: int) -> str:
    """OAI identifier of record `number` (1-based, zero-padded to 7 digits)."""
    return f"{ID_PREFIX}{number:07d}"


def number_for(identifier: str) -> int | None:
    """Record number encoded in an identifier, or None if it is not one of ours."""
    match = _ID_RE.fullmatch(identifier)
    return int(match.group(1)) if match else None


def parse_oai_date(text: str) -> tuple[int, str]:
    """Parse an OAI-PMH UTCdatetime into (epoch seconds, "day" | "seconds").

    Raises ValueError for anything else, so the server can answer badArgument.
    """
    if _DAY_RE.fullmatch(text):
        parsed, granularity = datetime.strptime(text, "%Y-%m-%d"), "day"
    elif _SECONDS_RE.fullmatch(text):
        parsed, granularity = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ"), "seconds"
    else:
        raise ValueError(f"not an OAI-PMH date: {text!r}")
    return int(parsed.replace(tzinfo=timezone.utc).timestamp()), granularity


def _clustered_stamps(rng: random.Random, start: int, count: int) -> list[int]:
    """Stamps of a repository whose records cluster: 2-6 bursts (hours to a few days wide)
    hold 50-85% of them, the rest trickle over the last 30-70% of the year; in a random
    order, independent of identifiers."""
    filled = int(_YEAR * rng.uniform(0.3, 0.7))  # the trickle's part of the year
    bursts = [(start - 1 - int(rng.random() * _YEAR), int(rng.uniform(3600, 4 * 86400)), rng.uniform(0.5, 2.0))
              for _ in range(rng.randint(2, 6))]
    weights = [weight for _, _, weight in bursts]
    in_bursts = rng.uniform(0.5, 0.85)
    stamps = []
    for _ in range(count):
        if rng.random() < in_bursts:
            centre, width, _ = rng.choices(bursts, weights)[0]
            stamps.append(min(start - 1, max(start - _YEAR, centre + int(rng.gauss(0, width / 2)))))
        else:
            stamps.append(start - 1 - int(rng.random() * filled))
    return stamps


class Record(NamedTuple):
    """Immutable snapshot of one record; cheap to create in bulk."""

    number: int
    stamp: int  # datestamp (or deletion datestamp), epoch seconds
    version: int
    deleted: bool
    kind: int
    invalid: bool
    alias: str = ""  # the identifier of a record renamed under a new prefix (rename)
    content: int = 0  # the number whose content it carries (a renamed record: its original's)

    @property
    def identifier(self) -> str:
        return self.alias or identifier_for(self.number)

    @property
    def content_number(self) -> int:
        """What its payload is made from: its own number, or a renamed record's original."""
        return self.content or self.number

    @property
    def datestamp(self) -> datetime:
        return datetime.fromtimestamp(self.stamp, timezone.utc)

    @property
    def object_type(self) -> str:
        return TYPES[self.kind >> 2]

    @property
    def department(self) -> str:
        return DEPARTMENTS[self.kind & 3]

    @property
    def sets(self) -> tuple[str, ...]:
        return SET_SPECS_BY_KIND[self.kind]


class SimulatedRepository(SimulatedModel[str]):
    """A seeded, mutable collection with a simulated clock.

    All public methods are thread-safe (one re-entrant lock), because the HTTP
    server reads while tests or the control API mutate.
    """

    _noun = "records"

    def __init__(
        self,
        records: int = 1000,
        deleted_fraction: float = 0.05,
        granularity: str = "seconds",
        formats: tuple[str, ...] = ("oai_dc", "lido"),
        deleted_record: str = "persistent",
        page_size: int = 100,
        seed: int = 1,
        start_clock: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc),
        invalid_every: int = 0,
        mutation_step: timedelta = timedelta(seconds=60),
        deleted_in_sets: bool = True,
        earliest_datestamp: str = "true",
        stamps: str = "granular",
        spread: str = "uniform",
        list_order: str = "identifier",
        header_sets: str = "path",
    ) -> None:
        if granularity not in GRANULARITY_SECONDS:
            raise ValueError(f"granularity must be one of {sorted(GRANULARITY_SECONDS)}")
        if deleted_record not in DELETED_POLICIES:
            raise ValueError(f"deleted_record must be one of {DELETED_POLICIES}")
        unknown = [f for f in formats if f not in SUPPORTED_FORMATS]
        if unknown:
            raise ValueError(f"unsupported formats {unknown}; supported: {SUPPORTED_FORMATS}")
        if stamps not in STAMP_COMPARISONS:
            raise ValueError(f"stamps must be one of {STAMP_COMPARISONS}")
        if spread not in SPREADS or list_order not in LIST_ORDERS:
            raise ValueError(f"spread must be one of {SPREADS}, list_order one of {LIST_ORDERS}")
        if header_sets not in HEADER_SETS:
            raise ValueError(f"header_sets must be one of {HEADER_SETS}")
        self.header_sets = header_sets
        if earliest_datestamp not in EARLIEST_DATESTAMPS:
            raise ValueError(f"earliest_datestamp must be one of {EARLIEST_DATESTAMPS}")
        if records < 0 or page_size < 1 or invalid_every < 0 or not 0 <= deleted_fraction <= 1:
            raise ValueError("records>=0, page_size>=1, invalid_every>=0, 0<=deleted_fraction<=1")
        self.granularity = granularity
        # oai_dc is mandatory in OAI-PMH, so it is always disseminated.
        self.formats: tuple[str, ...] = ("oai_dc",) + tuple(f for f in dict.fromkeys(formats) if f != "oai_dc")
        self.deleted_record = deleted_record
        self.page_size = page_size
        self.seed = seed
        self.invalid_every = invalid_every
        # False: a deleted record belongs to no set any more, as on repositories that drop a
        # deleted item's set membership: set-restricted lists omit its tombstone (I13).
        self.deleted_in_sets = deleted_in_sets
        self.earliest_datestamp = earliest_datestamp
        self.stamps = stamps
        self.spread = spread
        self.list_order = list_order
        self._fraction: dict[int, int] = {}  # index -> milliseconds past the stored second (restamp)
        # Records renamed under another prefix (rename): index -> (identifier, content number),
        # and identifier -> number to find them by.
        self._aliases: dict[int, tuple[str, int]] = {}
        self._by_alias: dict[str, int] = {}
        super().__init__(start_clock, mutation_step, mutation_seed=seed * 1_000_003 + 17)
        self._unit = GRANULARITY_SECONDS[granularity]
        self._build(records, deleted_fraction)

    def _build(self, count: int, deleted_fraction: float) -> None:
        rng = random.Random(self.seed)
        start = int(self._clock)
        rand = rng.random
        # Spread over [start - 365 days, start - 1 s], independent of identifier order.
        if self.spread == "clustered":
            self._stamp = array("q", _clustered_stamps(rng, start, count))
        else:
            self._stamp = array("q", [start - 1 - int(rand() * _YEAR) for _ in range(count)])
        self._version = array("I", [1]) * count
        self._kind = bytearray(_kind_for(n, self.seed) for n in range(1, count + 1))
        self._state = bytearray(count)
        gone = GONE if self.deleted_record == "no" else TOMBSTONE
        for index in rng.sample(range(count), round(count * deleted_fraction)):
            self._state[index] = gone

    # ------------------------------------------------------------- mutations
    def _live_indices(self) -> list[int]:
        return [i for i, state in enumerate(self._state) if state == LIVE]

    def _identifier(self, index: int) -> str:
        alias = self._aliases.get(index)
        return alias[0] if alias else identifier_for(index + 1)

    def _number(self, identifier: str) -> int | None:
        return self._by_alias.get(identifier) or number_for(identifier)

    def _live_indices_for(self, ids: Iterable[str]) -> list[int]:
        indices = []
        for identifier in ids:
            number = self._number(identifier)
            if number is None or not 1 <= number <= len(self._state):
                raise KeyError(identifier)
            if self._state[number - 1] != LIVE:
                raise ValueError(f"{identifier} is not live")
            indices.append(number - 1)
        return sorted(set(indices))

    def _apply_edit(self, indices: list[int]) -> list[str]:
        """New version, datestamp = the new clock."""
        now = self._tick()
        for i in indices:
            self._version[i] += 1
            self._stamp[i] = now
            self._fraction.pop(i, None)
        return [self._identifier(i) for i in indices]

    def edit_silently(self, n: int) -> list[str]:
        """Edit n random live records WITHOUT moving their datestamps (I13): a new version, so
        new content, under the old stamp, as repositories whose bulk jobs or database fixes
        bypass the stamp do. No incremental harvest can see it."""
        with self.lock:
            return self._edit_in_place(self._pick_live(n))

    def edit_silently_ids(self, identifiers: Iterable[str]) -> list[str]:
        """:meth:`edit_silently` of these live records."""
        with self.lock:
            return self._edit_in_place(self._live_indices_for(identifiers))

    def _edit_in_place(self, indices: list[int]) -> list[str]:
        for i in indices:
            self._version[i] += 1
        return [self._identifier(i) for i in indices]

    def rename(self, prefix: str, *, restamp: bool = True) -> list[tuple[str, str]]:
        """Every live record gets a new identifier under ``prefix`` (a new OAI base or identifier
        scheme): the old identifier is deleted (a tombstone, or vanished under deletedRecord=no)
        and a record with the same content appears under ``prefix`` + its number, stamped now
        (``restamp``) or keeping its stamp. Returns (old, new) pairs."""
        if not prefix or prefix == ID_PREFIX:
            raise ValueError("rename needs a prefix other than the repository's own")
        with self.lock:
            live = self._live_indices()
            now = self._tick()
            gone = GONE if self.deleted_record == "no" else TOMBSTONE
            pairs = []
            for i in live:
                content = self._aliases.get(i, ("", i + 1))[1]
                new_identifier = f"{prefix}{content:07d}"
                if new_identifier in self._by_alias:
                    raise ValueError(f"{new_identifier} exists already: rename to another prefix")
                stamp = now if restamp else self._stamp[i]
                self._state[i] = gone
                self._stamp[i] = now
                index = len(self._state)
                self._stamp.append(stamp)
                self._version.append(self._version[i])
                self._kind.append(self._kind[i])
                self._state.append(LIVE)
                self._aliases[index] = (new_identifier, content)
                self._by_alias[new_identifier] = index + 1
                pairs.append((self._identifier(i), new_identifier))
            return pairs

    def restamp(self, identifiers: Iterable[str], when: datetime) -> None:
        """Store ``when`` (sub-second: its milliseconds are kept) as these records' stamp;
        reported truncated to the granularity, compared raw with ``stamps="raw"``."""
        with self.lock:
            for i in self._live_indices_for(identifiers):
                self._stamp[i] = epoch_seconds(when)
                self._fraction[i] = when.microsecond // 1000

    def _milliseconds(self, index: int) -> int:
        """The stored stamp's milliseconds past its second: a restamp's, else a seeded
        spread (every record of a "raw" repository has some)."""
        return self._fraction.get(index, (index * 7919 + self.seed) % 1000)

    def _apply_delete(self, indices: list[int]) -> list[str]:
        """Tombstone, or vanish under deletedRecord=no."""
        now = self._tick()
        gone = GONE if self.deleted_record == "no" else TOMBSTONE
        for i in indices:
            self._state[i] = gone
            self._stamp[i] = now
        return [self._identifier(i) for i in indices]

    def add(self, n: int) -> list[str]:
        """Append n new live records numbered after the highest existing one."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self.lock:
            now = self._tick()
            first = len(self._state) + 1
            numbers = range(first, first + n)
            self._stamp.extend([now] * n)
            self._version.extend([1] * n)
            self._kind.extend(_kind_for(num, self.seed) for num in numbers)
            self._state.extend(bytes(n))
            return [identifier_for(num) for num in numbers]

    def recreate(self, n: int) -> list[str]:
        """Bring n random deleted records back under their old identifiers (a re-publish):
        live again with a new version, datestamp = the new clock. Fewer if fewer are deleted."""
        with self.lock:
            dead = [i for i, state in enumerate(self._state) if state != LIVE]
            picked = sorted(self._mutation_rng.sample(dead, min(n, len(dead))))
            now = self._tick()
            for i in picked:
                self._state[i] = LIVE
                self._version[i] += 1
                self._stamp[i] = now
            return [self._identifier(i) for i in picked]

    def move_sets(self, n: int) -> list[str]:
        """Move n random live records to another type and department (sets change, the
        datestamp with them, as the protocol requires); the title stays."""
        with self.lock:
            picked = self._pick_live(min(n, len(self._live_indices())))
            now = self._tick()
            for i in picked:
                kind = self._kind[i]
                self._kind[i] = (((kind >> 2) + 1) % len(TYPES)) * 4 + ((kind & 3) + 1) % len(DEPARTMENTS)
                self._stamp[i] = now
            return [self._identifier(i) for i in picked]

    def move_to(self, identifiers: Iterable[str], object_type: str | None = None,
                department: str | None = None) -> list[str]:
        """Move these live records to ``object_type`` and/or ``department`` (their sets change,
        the datestamp with them); the ones already there are left alone."""
        with self.lock:
            moved = []
            indices = self._live_indices_for(identifiers)
            now = self._tick()
            for i in indices:
                kind = self._kind[i]
                type_index = TYPES.index(object_type) if object_type is not None else kind >> 2
                dept_index = DEPARTMENTS.index(department) if department is not None else kind & 3
                if type_index * 4 + dept_index != kind:
                    self._kind[i] = type_index * 4 + dept_index
                    self._stamp[i] = now
                    self._fraction.pop(i, None)
                    moved.append(self._identifier(i))
            return moved

    def in_sets(self, identifier: str) -> tuple[str, ...]:
        """Every set the record is in, each level of the hierarchy included."""
        record = self.get(identifier)
        return SET_SPECS_BY_KIND[record.kind] if record is not None else ()

    # --------------------------------------------------------------- queries
    def is_invalid(self, number: int) -> bool:
        """True when this record deliberately serves a payload with an empty title."""
        return self.invalid_every > 0 and number % self.invalid_every == 0

    def _record(self, number: int) -> Record | None:
        i = number - 1
        if not 0 <= i < len(self._state):
            return None
        state = self._state[i]
        if state == GONE:
            return None
        alias, content = self._aliases.get(i, ("", 0))
        return Record(number, self._stamp[i], self._version[i], state == TOMBSTONE, self._kind[i],
                      self.is_invalid(content or number), alias, content)

    def __getitem__(self, identifier: str) -> Record:
        """`get` for one that exists: KeyError when there is none."""
        found = self.get(identifier)
        if found is None:
            raise KeyError(identifier)
        return found

    def get(self, identifier: str) -> Record | None:
        """The live record or tombstone, or None (unknown, or vanished under 'no')."""
        number = self._number(identifier)
        if number is None:
            return None
        with self.lock:
            return self._record(number)

    def records(self, numbers: Iterable[int]) -> list[Record | None]:
        """Current state of many records at once (one lock acquisition)."""
        with self.lock:
            return [self._record(n) for n in numbers]

    def live_identifiers(self) -> set[str]:
        with self.lock:
            return {self._identifier(i) for i in self._live_indices()}

    def sorted_live_identifiers(self) -> list[str]:
        with self.lock:
            return [self._identifier(i) for i in self._live_indices()]

    def deleted_identifiers(self) -> set[str]:
        """Every deleted record: tombstones, plus vanished ones under deletedRecord=no."""
        with self.lock:
            return {self._identifier(i) for i, s in enumerate(self._state) if s != LIVE}

    def counts(self) -> dict[str, int]:
        with self.lock:
            live = self._state.count(LIVE)
            return {"live": live, "deleted": len(self._state) - live, "total": len(self._state)}

    def earliest_stamp(self) -> int:
        """Lowest datestamp ever assigned, truncated to the granularity."""
        with self.lock:
            low = min(self._stamp) if self._stamp else self.clock_epoch
        return low - low % self._unit

    def announced_earliest_stamp(self) -> int | None:
        """What Identify announces as earliestDatestamp (``earliest_datestamp``); None: no element.
        ``late``: the median record's stamp, so about half the records are older."""
        if self.earliest_datestamp == "absent":
            return None
        if self.earliest_datestamp == "epoch":
            return 0
        if self.earliest_datestamp == "late":
            with self.lock:
                stamps = sorted(self._stamp)
            if stamps:
                middle = stamps[len(stamps) // 2]
                return middle - middle % self._unit
        return self.earliest_stamp()

    def format_stamp(self, stamp: int) -> str:
        """A datestamp as the repository reports it (at its granularity).

        Hot path of every page: day strings are cached, the time part is arithmetic.
        """
        day, seconds = divmod(stamp, 86400)
        text = _DAY_CACHE.get(day)
        if text is None:
            text = _DAY_CACHE[day] = (EPOCH + timedelta(days=day)).strftime("%Y-%m-%d")
        if self._unit == 86400:
            return text
        minute, second = divmod(seconds, 60)
        return f"{text}{_HOUR_MINUTE[minute]}{_SECOND[second]}"

    def _bounds(self, from_: datetime | str | None, until: datetime | str | None) -> tuple[int, int]:
        low, high = -(2**62), 2**62
        if from_ is not None:
            stamp, unit = self._as_stamp(from_)
            low = stamp - stamp % unit
        if until is not None:
            stamp, unit = self._as_stamp(until)
            high = stamp - stamp % unit + unit - 1
        return low, high

    def _as_stamp(self, value: datetime | str) -> tuple[int, int]:
        if isinstance(value, str):
            stamp, granularity = parse_oai_date(value)
            return stamp, max(self._unit, GRANULARITY_SECONDS[granularity])
        return epoch_seconds(value), self._unit

    def _set_filter(self, set_spec: str) -> bytearray:
        allowed = bytearray(16)
        for kind, specs in SET_SPECS_BY_KIND.items():
            if set_spec in specs:
                allowed[kind] = 1
        return allowed

    def select_numbers(
        self, from_: datetime | str | None = None, until: datetime | str | None = None,
        set_spec: str | None = None,
    ) -> list[int]:
        """Numbers of visible records in the window, in the list's order (``list_order``:
        ascending = identifier order, or by datestamp).

        Strings are OAI dates: a day-only `until` covers the whole day.
        """
        numbers = self._select(from_, until, set_spec)
        if self.list_order == "datestamp":
            with self.lock:
                numbers.sort(key=lambda n: (self._stamp[n - 1], n))
        return numbers

    def _select(self, from_: datetime | str | None, until: datetime | str | None,
                set_spec: str | None) -> list[int]:
        if self.stamps == "raw":
            return self._select_raw(from_, until, set_spec)
        low, high = self._bounds(from_, until)
        with self.lock:
            stamps, states = self._stamp, self._state
            if set_spec is None:
                return [i + 1 for i, (t, s) in enumerate(zip(stamps, states))
                        if s != GONE and low <= t <= high]
            allowed = self._set_filter(set_spec)
            hidden = GONE if self.deleted_in_sets else TOMBSTONE  # GONE is hidden either way
            return [i + 1 for i, (t, s, k) in enumerate(zip(stamps, states, self._kind))
                    if s < hidden and allowed[k] and low <= t <= high]

    def _select_raw(self, from_: datetime | str | None, until: datetime | str | None,
                    set_spec: str | None) -> list[int]:
        """select_numbers of a repository comparing sub-second stamps raw: the arguments
        are instants (a day is its midnight), not granules."""
        low = self._as_stamp(from_)[0] * 1000 if from_ is not None else -(2**62)
        high = self._as_stamp(until)[0] * 1000 if until is not None else 2**62
        allowed = self._set_filter(set_spec) if set_spec is not None else None
        hidden = GONE if (set_spec is None or self.deleted_in_sets) else TOMBSTONE
        with self.lock:
            return [i + 1 for i, (t, s, k) in enumerate(zip(self._stamp, self._state, self._kind))
                    if s < hidden and (allowed is None or allowed[k])
                    and low <= t * 1000 + self._milliseconds(i) <= high]

    def select(
        self, from_: datetime | str | None = None, until: datetime | str | None = None,
        set_spec: str | None = None,
    ) -> list[Record]:
        """Visible records (tombstones included) whose datestamp, at the repository
        granularity, lies in [from_, until] inclusive, ordered by identifier."""
        with self.lock:
            return [r for r in self.records(self.select_numbers(from_, until, set_spec)) if r]
