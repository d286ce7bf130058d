"""In-memory model of a Sierra ILS bib catalogue, free of HTTP.

Storage is parallel arrays indexed by ``int(id) - first_id``, so 100k bibs
build in a fraction of a second and ids stay sorted for free (keyset paging
is a slice). Time is a simulated clock, never the wall clock, so incremental
harvest tests are deterministic. Descriptive values (title, author, ...) are
derived from a hash of the bib number, not stored.
"""

from __future__ import annotations

import random
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

from ..clock import EPOCH, iso_seconds
from ..model import SimulatedModel
from .marc8 import encodable

if TYPE_CHECKING:
    from .attached import AttachedSet

_YEAR = 365 * 86400
_DAY = 86400
_DELETED, _SUPPRESSED, _NO_MARC = 1, 2, 4
MAX_ID = 999_999_999  # 7 digits on most catalogues, 8 on large ones (.b116512684): never compare ids as text
OVERSIZED_ITEMS = 1400  # enough 945s to push an export record past 99,999 bytes

TITLES: tuple[str, ...] = (
    "A history of the northern rivers",
    "Gardens & orchards of the old town",
    "Café society in Vienna",
    "Straße und Stadt: urban essays",
    "Ærøskøbing harbour records",
    "Łódź in the age of textiles",
    "São Paulo modernism",
    "Dvořák and the Bohemian song",
    'The "quiet" revolution',
    "Less <is> more: design notes",
    "Ελληνική ποίηση: an anthology",
    "東京の街並み (Tokyo streetscapes)",
    "Practical bookbinding",
    "Introduction to cataloguing",
    "Sea charts of the Baltic",
    "Naïve painters of Provence",
)
AUTHORS: tuple[str, ...] = (
    "Smith, Jane",
    "Müller, Jürgen",
    "Nørgaard, Ida",
    "García, Lucía",
    "Ōtsuka, Kenji",
    "O'Brien, Siobhán",
    "Dvořáková, Eliška",
    "Łukasiewicz, Piotr",
    "Nguyễn, Thị Lan",
    "Andersson, Karl",
)
LANGS: tuple[tuple[str, str], ...] = (
    ("eng", "English"), ("eng", "English"), ("eng", "English"), ("fre", "French"),
    ("ger", "German"), ("spa", "Spanish"), ("swe", "Swedish"), ("fin", "Finnish"), ("jpn", "Japanese"),
)
MATERIAL_TYPES: tuple[tuple[str, str], ...] = (
    ("a", "BOOK"), ("a", "BOOK"), ("a", "BOOK"), ("z", "E-BOOK"), ("g", "DVD"), ("j", "MUSIC CD"),
    ("c", "MUSIC SCORE"),
)
COUNTRIES: tuple[tuple[str, str], ...] = (
    ("xxu", "United States"), ("enk", "England"), ("gw ", "Germany"), ("fr ", "France"),
    ("sw ", "Sweden"), ("ja ", "Japan"),
)
LOCATIONS: tuple[str, ...] = ("main", "stack", "ref", "spec", "child")
SUBJECTS: tuple[str, ...] = ("History", "Art", "Music", "Cartography", "Poetry", "Architecture",
                             "Bookbinding", "Economic history")
MARC8_TITLES: tuple[str, ...] = tuple(t for t in TITLES if encodable(t) and not t.isascii())  # with diacritics


def _mix(number: int, seed: int) -> int:
    """A cheap, well-spread 32-bit hash of (bib number, seed)."""
    h = (number * 0x9E3779B1 + seed * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def check_digit(number: int) -> str:
    """Sierra's record-number check digit: weights 2,3,4... from the right, mod 11."""
    total = sum(int(d) * w for w, d in enumerate(reversed(str(number)), start=2))
    rem = total % 11
    return "x" if rem == 10 else str(rem)


def iso_z(epoch: int) -> str:
    """Second-precision UTC timestamp as Sierra prints it: 2021-10-07T13:52:27Z."""
    return iso_seconds(EPOCH + timedelta(seconds=epoch))


def day_text(epoch: int) -> str:
    return (EPOCH + timedelta(seconds=epoch)).strftime("%Y-%m-%d")


class Bib(NamedTuple):
    """Immutable snapshot of one bib as the API sees it right now."""

    id: str
    updated: int  # epoch seconds
    created: int
    version: int
    deleted: bool
    deleted_at: int | None  # epoch seconds of the deletion (only the day is ever exposed)
    suppressed: bool
    items: int
    invalid: bool  # its MARC lacks a 245
    title: str
    author: str
    publish_year: int
    lang: tuple[str, str]  # (code, name)
    material_type: tuple[str, str]  # (code, value)
    country: tuple[str, str]
    location: str
    subject: str
    isbn: str | None
    marc8: bool = False  # the export writes it in MARC-8 (leader/09 blank)
    no_005: bool = False  # its MARC lacks the 005 transaction stamp
    no_ids: bool = False  # its MARC lacks both 001 and (in the export) 907
    bad_utf8: bool = False  # the export writes a 0xFF byte into its 245 (bad UTF-8, or unmapped MARC-8)
    no_marc: bool = False  # listed without MARC (deleted in Sierra, still listed): no marc field, no export

    @property
    def number(self) -> int:
        return int(self.id)

    @property
    def updated_date(self) -> datetime:
        return EPOCH + timedelta(seconds=self.updated)

    @property
    def created_date(self) -> datetime:
        return EPOCH + timedelta(seconds=self.created)

    @property
    def deleted_date(self) -> date | None:
        """Date only, like Sierra's deletedDate."""
        if self.deleted_at is None:
            return None
        return (EPOCH + timedelta(seconds=self.deleted_at)).date()

    @property
    def bcode3(self) -> str:
        """Fixed field 31; "-" means not suppressed, "n" suppressed."""
        return "n" if self.suppressed else "-"


@dataclass(frozen=True)
class BibQuery:
    """ANDed filters of GET /bibs, already parsed; all bounds inclusive (epoch seconds/days)."""

    id_low: int | None = None
    id_high: int | None = None
    id_list: tuple[int, ...] | None = None
    updated: tuple[int, int] | None = None
    created: tuple[int, int] | None = None
    deleted_days: tuple[int, int] | None = None  # days since epoch
    deleted: bool | None = None
    suppressed: bool | None = None
    legacy_deleted_stubs: bool = False  # 2017 behaviour: updatedDate windows also match deletions


class SimulatedCatalogue(SimulatedModel[str | int]):
    """A seeded, mutable Sierra bib catalogue with a simulated clock.

    Public methods are thread-safe (one re-entrant lock, ``lock``) because the
    HTTP server reads while tests or the control API mutate.
    """

    _noun = "bibs"

    def __init__(
        self,
        bibs: int = 1000,
        deleted_fraction: float = 0.02,
        seed: int = 1,
        start_clock: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc),
        first_id: int = 1_000_001,
        suppressed_fraction: float = 0.01,
        oversized_every: int = 0,
        invalid_every: int = 0,
        mutation_step: timedelta = timedelta(seconds=60),
        *,
        marc8_every: int = 0,
        no_005_every: int = 0,
        no_id_every: int = 0,
        bad_utf8_every: int = 0,
        nul_every: int = 0,
        poison_every: int = 0,
    ) -> None:
        """Deleted and suppressed bibs are a random sample, so they fall in every export block.

        ``*_every``: every n-th bib is MARC-8 in the export, lacks 005, lacks 001/907,
        or carries an invalid UTF-8 byte in the export, or a NUL character in its title
        (MARC-in-JSON ``\u0000``, a 0x00 byte in the export; real catalogues hold such
        control characters from old imports) (0 = never). ``poison_every``: every n-th
        bib is one bib2Marc cannot convert: a ``bibs/marc`` block holding it answers 500
        code 135 on every try, as a production catalogue does on certain ranges; the JSON
        API serves it normally. Ids may start anywhere from 1,000,000 and cross into 8 or
        9 digits (``first_id``).
        """
        everies = (oversized_every, invalid_every, marc8_every, no_005_every, no_id_every, bad_utf8_every, nul_every)
        if bibs < 0 or min(everies) < 0:
            raise ValueError("bibs and the *_every options must be >= 0")
        if not 0 <= deleted_fraction <= 1 or not 0 <= suppressed_fraction <= 1:
            raise ValueError("fractions must lie in [0, 1]")
        if not 1_000_000 <= first_id or first_id + bibs - 1 > MAX_ID or poison_every < 0:
            raise ValueError("ids must lie in 1000000..999999999 and poison_every must be >= 0")
        self.seed = seed
        self.first_id = first_id
        self.oversized_every = oversized_every
        self.invalid_every = invalid_every
        self.marc8_every = marc8_every
        self.no_005_every = no_005_every
        self.no_id_every = no_id_every
        self.bad_utf8_every = bad_utf8_every
        self.nul_every = nul_every
        self.poison_every = poison_every
        super().__init__(start_clock, mutation_step, mutation_seed=seed * 1_000_003 + 29)
        self._build(bibs, deleted_fraction, suppressed_fraction)
        self.attached: dict[str, AttachedSet] = {}  # items, holdings (attach)

    def attach(self, kind: str, count: int, **options: Any) -> AttachedSet:
        """Give the catalogue ``count`` items or holdings records (attached.AttachedSet)."""
        from .attached import AttachedSet

        made = AttachedSet(self, kind, count, seed=self.seed, **options)
        self.attached[kind] = made
        return made

    def _build(self, count: int, deleted_fraction: float, suppressed_fraction: float) -> None:
        rng = random.Random(self.seed)
        rand = rng.random
        last = int(self._clock) - 1
        # Created over the year before start, updated somewhere between created and start.
        created = [last - int(rand() * _YEAR) for _ in range(count)]
        self._created = array("q", created)
        self._updated = array("q", [c + int(rand() * (last - c)) for c in created])
        self._version = array("I", [1]) * count
        self._flags = bytearray(count)
        self._deleted_at: dict[int, int] = {}
        for i in rng.sample(range(count), round(count * deleted_fraction)):
            self._flags[i] |= _DELETED
            self._deleted_at[i] = self._updated[i] + int(rand() * (last - self._updated[i]))
        for i in rng.sample(range(count), round(count * suppressed_fraction)):
            self._flags[i] |= _SUPPRESSED
        self._deleted_sorted = sorted(self._deleted_at)
        # Indexes by timestamp, kept sorted: edits and adds append (or, after the clock was
        # rewound, insert in order), leaving stale entries behind that _match filters out.
        order = sorted(range(count), key=self._updated.__getitem__)
        self._upd_keys = array("q", [self._updated[i] for i in order])
        self._upd_idx = array("l", order)
        order = sorted(range(count), key=self._created.__getitem__)
        self._cre_keys = array("q", [self._created[i] for i in order])
        self._cre_idx = array("l", order)

    # ------------------------------------------------------------- mutations
    def _index(self, bib_id: str | int) -> int:
        i = int(bib_id) - self.first_id
        if not 0 <= i < len(self._flags):
            raise KeyError(str(bib_id))
        return i

    def _live_indices(self) -> list[int]:
        return [i for i, f in enumerate(self._flags) if not f & _DELETED]

    def _live_indices_for(self, ids: Iterable[str | int]) -> list[int]:
        indices = set()
        for bib_id in ids:
            i = self._index(bib_id)
            if self._flags[i] & _DELETED:
                raise ValueError(f"{bib_id} is deleted (Sierra never undeletes)")
            indices.add(i)
        return sorted(indices)

    def _id(self, i: int) -> str:
        return str(self.first_id + i)

    def _apply_edit(self, indices: list[int]) -> list[str]:
        """Version + 1, updatedDate = the new clock."""
        now = self._tick()
        for i in indices:
            self._version[i] += 1
            self._updated[i] = now
            _index_add(self._upd_keys, self._upd_idx, now, [i])
        return [self._id(i) for i in indices]

    def _apply_delete(self, indices: list[int]) -> list[str]:
        """Flag as deleted; updatedDate stays as it was."""
        now = self._tick()  # deliberately NOT written to updatedDate (production quirk)
        for i in indices:
            self._flags[i] |= _DELETED
            self._deleted_at[i] = now
            insort(self._deleted_sorted, i)
        return [self._id(i) for i in indices]

    def add(self, n: int) -> list[str]:
        """Append n new live bibs with ids after the highest existing one."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self.lock:
            first = len(self._flags)
            if self.first_id + first + n - 1 > MAX_ID:
                raise ValueError("ids would leave the 7-digit range")
            now = self._tick()
            new = range(first, first + n)
            for arr in (self._updated, self._created):
                arr.extend([now] * n)
            _index_add(self._upd_keys, self._upd_idx, now, new)
            _index_add(self._cre_keys, self._cre_idx, now, new)
            self._version.extend([1] * n)
            self._flags.extend(bytes(n))
            return [self._id(i) for i in new]

    # --------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._flags)

    @property
    def last_id(self) -> int:
        return self.first_id + len(self._flags) - 1

    def is_oversized(self, number: int) -> bool:
        return self.oversized_every > 0 and (number - self.first_id + 1) % self.oversized_every == 0

    def is_invalid(self, number: int) -> bool:
        return self.invalid_every > 0 and (number - self.first_id + 1) % self.invalid_every == 0

    def _every(self, every: int, number: int) -> bool:
        return every > 0 and (number - self.first_id + 1) % every == 0

    def is_marc8(self, number: int) -> bool:
        return self._every(self.marc8_every, number)

    def lacks_005(self, number: int) -> bool:
        return self._every(self.no_005_every, number)

    def lacks_ids(self, number: int) -> bool:
        return self._every(self.no_id_every, number)

    def is_poison(self, number: int) -> bool:
        return self._every(self.poison_every, number)

    def has_bad_utf8(self, number: int) -> bool:
        return self._every(self.bad_utf8_every, number)

    def _bib(self, i: int) -> Bib:
        number = self.first_id + i
        h = _mix(number, self.seed)
        flags = self._flags[i]
        version = self._version[i]
        marc8 = self.is_marc8(number)
        title = MARC8_TITLES[h % len(MARC8_TITLES)] if marc8 else TITLES[h % len(TITLES)]
        if version > 1:  # edits change visible content, so a harvest can prove it saw them
            title = f"{title} (revision {version - 1})"
        if self._every(self.nul_every, number):
            title = f"{title}\x00"
        year = 1900 + (h >> 4) % 126
        return Bib(
            id=str(number), updated=self._updated[i], created=self._created[i], version=version,
            deleted=bool(flags & _DELETED), deleted_at=self._deleted_at.get(i),
            suppressed=bool(flags & _SUPPRESSED),
            items=OVERSIZED_ITEMS if self.is_oversized(number) else 1 + (h >> 8) % 3,
            invalid=self.is_invalid(number), title=title, author=AUTHORS[(h >> 5) % len(AUTHORS)],
            publish_year=year, lang=LANGS[(h >> 11) % len(LANGS)],
            material_type=MATERIAL_TYPES[(h >> 14) % len(MATERIAL_TYPES)],
            country=COUNTRIES[(h >> 17) % len(COUNTRIES)], location=LOCATIONS[(h >> 20) % len(LOCATIONS)],
            subject=SUBJECTS[(h >> 23) % len(SUBJECTS)],
            isbn=None if h % 5 == 0 else f"978{number:07d}{h % 1000:03d}",
            marc8=marc8, no_005=self.lacks_005(number), no_ids=self.lacks_ids(number),
            bad_utf8=self.has_bad_utf8(number), no_marc=bool(flags & _NO_MARC),
        )

    def __getitem__(self, bib_id: str | int) -> Bib:
        """`get` for one that exists: KeyError when there is none."""
        found = self.get(bib_id)
        if found is None:
            raise KeyError(bib_id)
        return found

    def get(self, bib_id: str | int) -> Bib | None:
        """The bib (live or deleted), or None if the id was never issued."""
        try:
            i = int(bib_id) - self.first_id
        except ValueError:
            return None
        with self.lock:
            return self._bib(i) if 0 <= i < len(self._flags) else None

    def bibs(self, numbers: Iterable[int]) -> list[Bib]:
        """Snapshots of many bibs under one lock acquisition (numbers must exist)."""
        with self.lock:
            return [self._bib(n - self.first_id) for n in numbers]

    def suppress(self, ids: Iterable[str | int], on: bool = True) -> list[str]:
        """Suppress (``on``) or unsuppress these live bibs: BCODE3 changes, an edit, so their
        updatedDate moves to the new clock; the content stays."""
        with self.lock:
            indices = self._live_indices_for(ids)
            now = self._tick()
            for i in indices:
                self._flags[i] = self._flags[i] | _SUPPRESSED if on else self._flags[i] & ~_SUPPRESSED
                self._updated[i] = now
                _index_add(self._upd_keys, self._upd_idx, now, [i])
            return [self._id(i) for i in indices]

    def strip_marc(self, ids: Iterable[str | int], touch: bool = True) -> list[str]:
        """These live bibs lose their MARC but stay listed (deleted in Sierra, still listed): no
        ``marc`` field, left out of the export; ``touch`` moves their updatedDate too."""
        with self.lock:
            indices = self._live_indices_for(ids)
            now = self._tick()
            for i in indices:
                self._flags[i] |= _NO_MARC
                if touch:
                    self._updated[i] = now
                    _index_add(self._upd_keys, self._upd_idx, now, [i])
            return [self._id(i) for i in indices]

    def public_ids(self) -> set[str]:
        """Live bibs that are not suppressed and have MARC: what a discovery layer shows."""
        with self.lock:
            return {self._id(i) for i in self._live_indices() if not self._flags[i] & (_SUPPRESSED | _NO_MARC)}

    def live_ids(self) -> set[str]:
        with self.lock:
            return {self._id(i) for i in self._live_indices()}

    def sorted_live_ids(self) -> list[str]:
        with self.lock:
            return [self._id(i) for i in self._live_indices()]

    def deleted_ids(self) -> set[str]:
        with self.lock:
            return {self._id(i) for i in self._deleted_sorted}

    def counts(self) -> dict[str, int]:
        with self.lock:
            deleted = len(self._deleted_sorted)
            return {"live": len(self._flags) - deleted, "deleted": deleted, "total": len(self._flags)}

    def _match(self, i: int, q: BibQuery) -> bool:
        flags = self._flags[i]
        is_deleted = flags & _DELETED
        if q.deleted is not None and bool(is_deleted) != q.deleted:
            return False
        if q.suppressed is not None and bool(flags & _SUPPRESSED) != q.suppressed:
            return False
        if q.updated is not None:
            if is_deleted:
                if not q.legacy_deleted_stubs:
                    return False
                stamp = self._deleted_at[i]
            else:
                stamp = self._updated[i]
            if not q.updated[0] <= stamp <= q.updated[1]:
                return False
        if q.created is not None and not q.created[0] <= self._created[i] <= q.created[1]:
            return False
        if q.deleted_days is not None:
            if not is_deleted or not q.deleted_days[0] <= self._deleted_at[i] // _DAY <= q.deleted_days[1]:
                return False
        return True

    def select(self, q: BibQuery, offset: int = 0, limit: int | None = None) -> list[int]:
        """Bib numbers matching every filter of `q`, ascending, after skipping `offset`.

        Picks the cheapest candidate source: the id range (scanned until `limit`
        matches), a timestamp index window, or the (small) list of deletions.
        """
        with self.lock:
            lo = 0 if q.id_low is None else max(0, q.id_low - self.first_id)
            hi = len(self._flags) - 1 if q.id_high is None else min(len(self._flags) - 1,
                                                                     q.id_high - self.first_id)
            if q.id_list is not None:
                candidates: Iterable[int] = sorted({n - self.first_id for n in q.id_list
                                                    if 0 <= n - self.first_id < len(self._flags)})
            else:
                candidates = self._candidates(q, lo, hi)
            wanted = None if limit is None else offset + limit
            out: list[int] = []
            for i in candidates:
                if self._match(i, q):
                    out.append(i + self.first_id)
                    if wanted is not None and len(out) >= wanted:
                        break
            return out[offset:]

    def _candidates(self, q: BibQuery, lo: int, hi: int) -> Iterable[int]:
        if hi < lo:
            return ()
        best, best_size = "range", hi - lo + 1
        windows = {}
        if q.deleted or q.deleted_days is not None:
            a, b = bisect_left(self._deleted_sorted, lo), bisect_right(self._deleted_sorted, hi)
            if b - a < best_size:
                best, best_size = "deleted", b - a
            windows["deleted"] = (a, b)
        if q.updated is not None:
            a, b = bisect_left(self._upd_keys, q.updated[0]), bisect_right(self._upd_keys, q.updated[1])
            if (b - a) * 4 < best_size:  # sorting costs more than scanning, so demand a clear win
                best, best_size = "updated", b - a
            windows["updated"] = (a, b)
        if q.created is not None:
            a, b = bisect_left(self._cre_keys, q.created[0]), bisect_right(self._cre_keys, q.created[1])
            if (b - a) * 4 < best_size:
                best, best_size = "created", b - a
            windows["created"] = (a, b)
        if best == "range":
            return range(lo, hi + 1)
        a, b = windows[best]
        if best == "deleted":
            return self._deleted_sorted[a:b]
        index = self._upd_idx if best == "updated" else self._cre_idx
        picked = {i for i in index[a:b] if lo <= i <= hi}
        if best == "updated" and q.legacy_deleted_stubs:
            picked.update(i for i in self._deleted_sorted if lo <= i <= hi)
        return sorted(picked)


def _index_add(keys: array, idx: array, stamp: int, entries: Iterable[int]) -> None:
    """Add entries stamped ``stamp`` to a sorted timestamp index.

    Appending keeps it sorted while the clock only moves forward; after a rewind (a clock
    reset fault) the stamp lands inside the index, or bisect would miss those changes.
    """
    entries = list(entries)
    if not keys or stamp >= keys[-1]:
        keys.extend([stamp] * len(entries))
        idx.extend(entries)
        return
    at = bisect_right(keys, stamp)
    keys[at:at] = array(keys.typecode, [stamp] * len(entries))
    idx[at:at] = array(idx.typecode, entries)
