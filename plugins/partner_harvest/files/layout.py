"""How a partner lays out its deliveries: dated patterns, completeness, and the chain to apply.

A pattern such as ``{date:%Y%m%d}/objects-*.csv.gz`` matches files at the location; the
text the placeholder matched is the delivery's date. A delivery is a date, a kind (full or
delta) and every file of that kind and date. It is complete when its done-marker exists,
when the checksum file or ResourceSync list of its date lists each of its files (the list
then says which files it has), or, with none of them, when no file of it changed for
``settle``. What it never is: complete because it exists.

The chain is what a run applies, in date order: the newest complete full dump, then each
complete delta after it while no gap (more than ``every`` between two deliveries) and no
incomplete delivery stops it (no full dump: from the oldest delta). What stops it is said
(``Chain.waiting``); nothing after the stop is applied.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from partner_harvest.errors import PartnerCapExceeded
from partner_harvest.files import manifests
from partner_harvest.files.spec import FilesOptions
from partner_harvest.files.storage import Entry, Storage
from partner_harvest.window import Delivery, DeliveryFile, format_instant

log = logging.getLogger(__name__)

FULL, DELTA = "full", "delta"
_DIRECTIVES = {
    "Y": r"\d{4}", "y": r"\d{2}", "m": r"\d{2}", "d": r"\d{2}", "H": r"\d{2}", "M": r"\d{2}", "S": r"\d{2}",
    "j": r"\d{3}", "b": r"[A-Za-z]{3}", "f": r"\d{1,6}", "%": "%",
}
_PLACEHOLDER = re.compile(r"\{date:([^}]+)\}")


class Pattern:
    """A dated file pattern: which paths it matches, their dates, and its path for one date."""

    def __init__(self, text: str):
        self.text = text
        found = _PLACEHOLDER.search(text)
        if found is None:
            raise ValueError(f"pattern {text!r} has no {{date:FORMAT}} placeholder")
        self.format = found.group(1)
        regex, position = "", 0
        for match in _PLACEHOLDER.finditer(text):
            regex += _literal(text[position:match.start()]) + f"(?P<d{match.start()}>{_date_regex(match.group(1))})"
            position = match.end()
        self.regex = re.compile(regex + _literal(text[position:]) + "$")
        fixed = re.split(r"\{date:|\*", text, maxsplit=1)[0]
        self.prefix = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
        self.depth = text.count("/") - self.prefix.count("/") - (1 if self.prefix else 0) + 1

    def date_of(self, path: str) -> datetime | None:
        """The date the path's placeholder text names, or None when the path is not of this pattern."""
        match = self.regex.match(path)
        if match is None:
            return None
        texts = {value for key, value in match.groupdict().items() if key.startswith("d")}
        if len(texts) != 1:
            return None  # two placeholders naming two dates: not one delivery
        try:
            date = datetime.strptime(texts.pop(), self.format)
        except ValueError:
            return None
        return date.replace(tzinfo=timezone.utc)

    def path_for(self, date: datetime) -> str:
        """The pattern's path for ``date`` (a marker, checksum file or manifest: no wildcard)."""
        return _PLACEHOLDER.sub(lambda m: date.strftime(m.group(1)), self.text)


def _literal(text: str) -> str:
    return "".join("[^/]*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", text) if part)


def _date_regex(fmt: str) -> str:
    out, index = "", 0
    while index < len(fmt):
        char = fmt[index]
        if char == "%" and index + 1 < len(fmt):
            code = fmt[index + 1]
            if code not in _DIRECTIVES:
                raise ValueError(f"date format {fmt!r}: %{code} is not supported (use {' '.join('%' + c for c in _DIRECTIVES)})")
            out += _DIRECTIVES[code]
            index += 2
            continue
        out += re.escape(char)
        index += 1
    return out


@dataclass
class Found:
    """One delivery as listed: its files now, whether it is complete, and why not."""

    date: datetime
    kind: str
    files: list[Entry] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    complete: bool = False
    why_not: str | None = None

    def frozen(self) -> Delivery:
        return Delivery(date=self.date, kind=self.kind, files=tuple(
            DeliveryFile(path=e.path, size=e.size, etag=e.etag, checksum=self.checksums.get(e.path))
            for e in self.files))


@dataclass(frozen=True)
class Chain:
    """What a run may apply, in date order, and why it stops where it does."""

    deliveries: tuple[Delivery, ...]
    waiting: str | None
    listed: int  # deliveries found at the location


class Layout:
    """A partner's options.files read against its storage."""

    def __init__(self, partner_id: str, options: FilesOptions, storage: Storage):
        self.partner_id, self.options, self.storage = partner_id, options, storage
        self.patterns = {kind: Pattern(text) for kind, text in ((FULL, options.full), (DELTA, options.delta)) if text}
        self.marker = Pattern(options.done_marker) if options.done_marker else None
        self.checksums = Pattern(options.checksums) if options.checksums else None
        self.manifest = Pattern(options.manifest) if options.manifest else None

    def list(self, now: datetime) -> list[Found]:
        """Every delivery at the location, each judged complete or not, in date order (full first at one date)."""
        found: dict[tuple[datetime, str], Found] = {}
        seen = 0
        listings: dict[tuple[str, int], list[Entry]] = {}
        for kind, pattern in self.patterns.items():
            key = (pattern.prefix, pattern.depth)
            if key not in listings:
                listings[key] = self.storage.find(pattern.prefix, pattern.depth)
            for entry in listings[key]:
                date = pattern.date_of(entry.path)
                if date is None or self._is_companion(entry.path):
                    continue
                seen += 1
                if seen > self.options.max_deliveries:
                    raise PartnerCapExceeded(self.partner_id, f"list {self.storage.where}",
                                             f"more than options.files.max_deliveries = {self.options.max_deliveries} "
                                             "dated files at the location")
                found.setdefault((date, kind), Found(date, kind)).files.append(self.storage.complete(entry))
        deliveries = [found[key] for key in sorted(found, key=lambda k: (k[0], k[1] != FULL))]
        for delivery in deliveries:
            self._judge(delivery, now)
        return deliveries

    def _is_companion(self, path: str) -> bool:
        """A marker, checksum file or manifest is never a data file, even when a data pattern matches it."""
        return any(p is not None and p.date_of(path) is not None for p in (self.marker, self.checksums, self.manifest))

    def _judge(self, delivery: Found, now: datetime) -> None:
        """Complete or not, and why not; a manifest or checksum file also says which files the delivery has."""
        if self.marker is not None:
            marker = self.marker.path_for(delivery.date)
            if self.storage.info(marker) is None:
                delivery.why_not = f"no done-marker {marker} yet"
                return
        if self.manifest is not None:
            path = self.manifest.path_for(delivery.date)
            if not self._by_list(delivery, path, manifests.resourcesync):
                return
        if self.checksums is not None:
            path = self.checksums.path_for(delivery.date)
            if not self._by_list(delivery, path, manifests.checksum_file):
                return
        if self.marker is None and self.manifest is None and self.checksums is None and self.options.settle:
            newest = max((e.modified for e in delivery.files if e.modified is not None), default=None)
            if newest is not None and now - newest < self.options.settle:
                delivery.why_not = (f"its files were modified {format_instant(newest)}, less than settle "
                                    f"({self.options.settle}) ago: still being written?")
                return
        delivery.complete = True

    def _by_list(self, delivery: Found, path: str, read: object) -> bool:
        """Read a checksum file or manifest: the files it lists must all be there at the listed length."""
        if self.storage.info(path) is None:
            delivery.why_not = f"no {path} yet"
            return False
        base = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        listed = read(self.storage.read_small(path), base, self.storage.where)  # type: ignore[operator]
        mine = {e.path: e for e in delivery.files}
        wanted: list[Entry] = []
        for name, (length, digest) in listed.items():
            entry = mine.get(name) or self.storage.info(name)
            if entry is None:
                delivery.why_not = f"{path} lists {name}, which is not there yet"
                return False
            if length is not None and entry.size != length:
                delivery.why_not = f"{name} is {entry.size} bytes, {path} says {length}: still being uploaded?"
                return False
            if digest is not None:
                delivery.checksums[name] = digest
            wanted.append(entry)
        kind_pattern = self.patterns[delivery.kind]
        kept = [e for e in wanted if kind_pattern.date_of(e.path) is not None] or wanted
        if not kept:
            delivery.why_not = f"{path} lists no file"
            return False
        missing = sorted(set(mine) - {e.path for e in kept})
        if missing and self.manifest is not None:
            log.warning("%s: delivery %s: %s are not in its manifest and are left out", self.partner_id,
                        format_instant(delivery.date), ", ".join(missing[:5]))
        if self.manifest is not None:
            delivery.files = sorted(kept, key=lambda e: e.path)
        elif missing:
            delivery.why_not = f"{path} does not list {', '.join(missing[:3])}: still being uploaded?"
            return False
        return True


def chain(listed: Iterable[Found], every: timedelta | None) -> Chain:
    """The newest complete full dump and the complete deltas after it, up to a gap or an incomplete one."""
    deliveries = list(listed)
    fulls = [d for d in deliveries if d.kind == FULL and d.complete]
    anchor = fulls[-1] if fulls else None
    deltas = [d for d in deliveries if d.kind == DELTA and (anchor is None or d.date > anchor.date)]
    picked: list[Found] = [anchor] if anchor is not None else []
    waiting: str | None = None
    previous = anchor.date if anchor is not None else None
    for delta in deltas:
        if every is not None and previous is not None and delta.date - previous > every:
            waiting = (f"a gap: nothing between {format_instant(previous)} and the delta of "
                       f"{format_instant(delta.date)} (deltas every {every}); it waits for the missing delta or a "
                       "newer full dump")
            break
        if not delta.complete:
            waiting = f"the delta of {format_instant(delta.date)} is not complete: {delta.why_not}"
            break
        picked.append(delta)
        previous = delta.date
    if waiting is None:
        newer_full = [d for d in deliveries if d.kind == FULL and not d.complete
                      and (anchor is None or d.date > anchor.date)]
        if newer_full:
            waiting = f"the full dump of {format_instant(newer_full[-1].date)} is not complete: {newer_full[-1].why_not}"
    return Chain(tuple(d.frozen() for d in picked), waiting, len(deliveries))
