"""Items and holdings of a SimulatedCatalogue: records attached to bibs, with Sierra's quirks.

Each set shares the catalogue's clock and lock, so a checkout and the bib edits around it
are stamped in one sequence. What a real catalogue does that a harvester must survive:

- an item changes without its bib (a checkout moves status, due date and ``updatedDate``);
- it moves from one bib to another (``bibIds`` changes, its ``updatedDate`` moves, neither
  bib's does);
- it is deleted: only ``deletedDate`` (a date, no time) says when, ``updatedDate`` stays;
- it is suppressed (an edit: ``updatedDate`` moves);
- ``fixedFields`` values are numbers on one server and strings of digits on another
  (``mixed_fixed_types`` of the server), holdings ids and ``bibIds`` are JSON numbers
  (as recorded from a production server), item ids strings.

Ids are dense from ``first_id`` (by default the bibs' own first id: an item and a bib may
share a number, as in Sierra, whose record types number separately).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .catalogue import BibQuery, day_text, iso_z

if TYPE_CHECKING:
    from .catalogue import SimulatedCatalogue

_DELETED, _SUPPRESSED = 1, 2
_DAY = 86400
ITEM_LOCATIONS = ("main", "stack", "ref", "child", "stor")
ITEM_FIELDS = ("id", "updatedDate", "createdDate", "deletedDate", "deleted", "suppressed", "bibIds", "location",
               "status", "volumes", "barcode", "callNumber", "itemType", "holdCount", "fixedFields", "varFields")
HOLDING_FIELDS = ("id", "bibIds", "itemIds", "inheritLocation", "location", "updatedDate", "createdDate",
                  "deletedDate", "deleted", "suppressed", "fixedFields", "varFields")
DEFAULT_ITEM_FIELDS = ("id", "updatedDate", "createdDate", "deleted", "bibIds", "location", "status", "barcode",
                       "callNumber")


class AttachedSet:
    """A seeded, mutable set of items (``kind="items"``) or holdings records of a catalogue."""

    def __init__(self, catalogue: SimulatedCatalogue, kind: str, count: int, *, first_id: int | None = None,
                 seed: int = 7, deleted_fraction: float = 0.02, suppressed_fraction: float = 0.01) -> None:
        if kind not in ("items", "holdings"):
            raise ValueError("kind must be items or holdings")
        self.catalogue = catalogue
        self.kind = kind
        self.first_id = catalogue.first_id if first_id is None else first_id
        self.lock = catalogue.lock
        self.fields = ITEM_FIELDS if kind == "items" else HOLDING_FIELDS
        self.default_fields = DEFAULT_ITEM_FIELDS if kind == "items" else HOLDING_FIELDS
        self._rng = random.Random(seed * 7919 + len(kind))
        rng = self._rng
        bibs = len(catalogue)
        last = catalogue.clock_epoch - 1
        with self.lock:
            live_bibs = [int(b) for b in catalogue.sorted_live_ids()] or [catalogue.first_id]
        # Items spread over the bibs (one to a few each); a few belong to two bibs (bound-withs).
        self._bibs: list[tuple[int, ...]] = []
        for i in range(count):
            first = live_bibs[(i * len(live_bibs)) // max(count, 1)] if bibs else catalogue.first_id
            if i % 97 == 5 and len(live_bibs) > 1:
                self._bibs.append((first, live_bibs[(i * 31) % len(live_bibs)]))
            else:
                self._bibs.append((first,))
        self._created = array("q", [last - int(rng.random() * 365 * _DAY) for _ in range(count)])
        self._updated = array("q", [c + int(rng.random() * (last - c)) for c in self._created])
        self._version = array("I", [1]) * count
        self._status = bytearray(count)  # 0 available, 1 checked out
        self._due = array("q", [0]) * count
        self._location = bytearray(rng.randrange(len(ITEM_LOCATIONS)) for _ in range(count))
        self._flags = bytearray(count)
        self._deleted_at: dict[int, int] = {}
        for i in rng.sample(range(count), round(count * deleted_fraction)):
            self._flags[i] |= _DELETED
            self._deleted_at[i] = self._updated[i] + int(rng.random() * (last - self._updated[i]))
        for i in rng.sample(range(count), round(count * suppressed_fraction)):
            self._flags[i] |= _SUPPRESSED

    def __len__(self) -> int:
        return len(self._flags)

    # ------------------------------------------------------------- mutations
    def _id(self, i: int) -> str:
        return str(self.first_id + i)

    def _live(self) -> list[int]:
        return [i for i, f in enumerate(self._flags) if not f & _DELETED]

    def _pick(self, n: int, ids: Iterable[str | int] | None) -> list[int]:
        if ids is not None:
            picked = sorted({int(x) - self.first_id for x in ids})
            for i in picked:
                if not 0 <= i < len(self._flags) or self._flags[i] & _DELETED:
                    raise ValueError(f"{self.kind} {self.first_id + i} is not live")
            return picked
        live = self._live()
        if n > len(live):
            raise ValueError(f"asked for {n} {self.kind} but only {len(live)} are live")
        return sorted(self._rng.sample(live, n))

    def _touch(self, i: int, now: int) -> None:
        self._version[i] += 1
        self._updated[i] = now

    def checkout(self, n: int = 0, ids: Iterable[str | int] | None = None) -> list[str]:
        """Check out (or back in, if out) n random live items: status, due date and updatedDate
        move, the bib's do not."""
        with self.lock:
            picked = self._pick(n, ids)
            now = self.catalogue._tick()
            for i in picked:
                self._status[i] ^= 1
                self._due[i] = now + 21 * _DAY if self._status[i] else 0
                self._touch(i, now)
            return [self._id(i) for i in picked]

    def transfer(self, n: int = 0, ids: Iterable[str | int] | None = None) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """Move n random live items to another live bib; returns id -> (old bibs, new bibs)."""
        with self.lock:
            picked = self._pick(n, ids)
            live_bibs = [int(b) for b in self.catalogue.sorted_live_ids()]
            now = self.catalogue._tick()
            moved: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
            for i in picked:
                old = self._bibs[i]
                new = old[0]
                while new in old and len(live_bibs) > 1:
                    new = self._rng.choice(live_bibs)
                self._bibs[i] = (new,)
                self._location[i] = (self._location[i] + 1) % len(ITEM_LOCATIONS)
                self._touch(i, now)
                moved[self._id(i)] = (tuple(map(str, old)), (str(new),))
            return moved

    def delete(self, n: int = 0, ids: Iterable[str | int] | None = None) -> list[str]:
        """Delete n random live ones: deletedDate (a day) is set, updatedDate stays."""
        with self.lock:
            picked = self._pick(n, ids)
            now = self.catalogue._tick()
            for i in picked:
                self._flags[i] |= _DELETED
                self._deleted_at[i] = now
            return [self._id(i) for i in picked]

    def suppress(self, n: int = 0, ids: Iterable[str | int] | None = None, on: bool = True) -> list[str]:
        """Suppress (or unsuppress) these: an edit, so updatedDate moves."""
        with self.lock:
            if ids is None:
                live = [i for i in self._live() if bool(self._flags[i] & _SUPPRESSED) != on]
                picked = sorted(self._rng.sample(live, min(n, len(live))))
            else:
                picked = self._pick(0, ids)
            now = self.catalogue._tick()
            for i in picked:
                self._flags[i] = self._flags[i] | _SUPPRESSED if on else self._flags[i] & ~_SUPPRESSED
                self._touch(i, now)
            return [self._id(i) for i in picked]

    def add(self, n: int, bib: str | int | None = None) -> list[str]:
        """n new live ones on ``bib`` (else random live bibs)."""
        with self.lock:
            live_bibs = [int(b) for b in self.catalogue.sorted_live_ids()]
            now = self.catalogue._tick()
            start = len(self._flags)
            for _ in range(n):
                self._bibs.append((int(bib) if bib is not None else self._rng.choice(live_bibs),))
            self._created.extend([now] * n)
            self._updated.extend([now] * n)
            self._version.extend([1] * n)
            self._status.extend(bytes(n))
            self._due.extend([0] * n)
            self._location.extend(bytes(n))
            self._flags.extend(bytes(n))
            return [self._id(i) for i in range(start, start + n)]

    # --------------------------------------------------------------- queries
    def live(self, public_only: bool = False) -> dict[str, tuple[str, ...]]:
        """Live ones (``public_only``: not suppressed) with the bibs they belong to."""
        with self.lock:
            return {self._id(i): tuple(sorted(str(b) for b in self._bibs[i])) for i in self._live()
                    if not (public_only and self._flags[i] & _SUPPRESSED)}

    def bibs_of(self, ids: Iterable[str]) -> set[str]:
        with self.lock:
            return {str(b) for x in ids for b in self._bibs[int(x) - self.first_id]}

    def _match(self, i: int, q: BibQuery) -> bool:
        flags = self._flags[i]
        deleted = bool(flags & _DELETED)
        if q.deleted is not None and deleted != q.deleted:
            return False
        if q.suppressed is not None and bool(flags & _SUPPRESSED) != q.suppressed:
            return False
        if q.updated is not None:
            if deleted:
                if not q.legacy_deleted_stubs or not q.updated[0] <= self._deleted_at[i] <= q.updated[1]:
                    return False
            elif not q.updated[0] <= self._updated[i] <= q.updated[1]:
                return False
        if q.created is not None and not q.created[0] <= self._created[i] <= q.created[1]:
            return False
        if q.deleted_days is not None:
            if not deleted or not q.deleted_days[0] <= self._deleted_at[i] // _DAY <= q.deleted_days[1]:
                return False
        return True

    def select(self, q: BibQuery, offset: int = 0, limit: int | None = None) -> list[int]:
        """Indices matching every filter, by ascending id."""
        with self.lock:
            count = len(self._flags)
            if q.id_list is not None:
                candidates: Iterable[int] = sorted({n - self.first_id for n in q.id_list
                                                    if 0 <= n - self.first_id < count})
            else:
                lo = 0 if q.id_low is None else max(0, q.id_low - self.first_id)
                hi = count - 1 if q.id_high is None else min(count - 1, q.id_high - self.first_id)
                candidates = range(lo, hi + 1)
            wanted = None if limit is None else offset + limit
            out: list[int] = []
            for i in candidates:
                if self._match(i, q):
                    out.append(i)
                    if wanted is not None and len(out) >= wanted:
                        break
            return out[offset:]

    def render(self, i: int, names: tuple[str, ...], mixed_types: bool = False) -> dict[str, Any]:
        """One entry; a deleted one shows only id, deletedDate, deleted and (empty) bibIds."""
        with self.lock:
            number = self.first_id + i
            ident: Any = number if self.kind == "holdings" else str(number)  # holdings: JSON numbers (recorded)
            if self._flags[i] & _DELETED:
                stub = {"id": ident, "deletedDate": day_text(self._deleted_at[i]), "deleted": True, "bibIds": []}
                return {k: v for k, v in stub.items() if k in names}
            bibs = [b if self.kind == "holdings" else str(b) for b in self._bibs[i]]
            location = ITEM_LOCATIONS[self._location[i]]
            out: dict[str, Any] = {}
            for name in names:
                value = self._value(i, name, number, bibs, location, mixed_types)
                if value is not None:
                    out[name] = value
            if "id" in names:
                out["id"] = ident
            return out

    def _value(self, i: int, name: str, number: int, bibs: list[Any], location: str, mixed: bool) -> Any:
        out = bool(self._status[i])
        version = self._version[i]
        if name == "updatedDate":
            return iso_z(self._updated[i])
        if name == "createdDate":
            return iso_z(self._created[i])
        if name == "deleted":
            return False
        if name == "suppressed":
            return bool(self._flags[i] & _SUPPRESSED)
        if name == "bibIds":
            return bibs
        if name == "location":
            return {"code": location, "name": location.title()}
        if name == "status":
            status: dict[str, Any] = {"code": "-", "display": "CHECKED OUT" if out else "AVAILABLE"}
            if out:
                status["duedate"] = iso_z(self._due[i])
            return status
        if name == "volumes":
            return []
        if name == "barcode":
            return f"3{number:013d}"
        if name == "callNumber":
            return f"QA{number % 900 + 100} .S{number % 97} v.{version}"
        if name == "itemType":
            return number % 5
        if name == "holdCount":
            return number % 3
        if name == "itemIds":
            return []
        if name == "inheritLocation":
            return False
        if name == "fixedFields":
            # Numbers here, strings of digits on another server (mixed): both recorded.
            codes: dict[str, Any] = {"79": location, "88": "-" if not out else "o", "86": 1, "85": version,
                                     "61": number % 5}
            fields = {}
            for key, value in codes.items():
                if mixed and isinstance(value, int) and int(key) % 2:
                    value = str(value)
                fields[key] = {"label": {"79": "LOCATION", "88": "STATUS", "86": "AGENCY", "85": "REVISIONS",
                                         "61": "I TYPE"}[key], "value": value}
            return fields
        if name == "varFields":
            return [{"fieldTag": "b", "content": f"3{number:013d}"},
                    {"fieldTag": "c", "marcTag": "090", "ind1": " ", "ind2": " ",
                     "subfields": [{"tag": "a", "content": f"QA{number % 900 + 100}"},
                                   {"tag": "b", "content": version if mixed else str(version)}]}]
        return None
