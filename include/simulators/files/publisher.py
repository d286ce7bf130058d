"""A museum that publishes its collection as dated CSV files: full dumps and deltas.

The collection is a dict of objects; edits, deletions and additions accumulate until the
next delivery. ``full(date)`` writes every live object, ``delta(date)`` what changed since
the previous delivery (deleted objects as rows with ``deleted=true``). Where real
publishers vary, the publisher varies: a delivery written without its done-marker (still
uploading, or late), one re-uploaded in place with other content, a dump split in parts,
gzipped files, a checksum file. ``published`` is what the deliveries written so far say the
collection is, delivery by delivery: what an aggregation that applied them holds.

It writes through any fsspec filesystem: a local folder (served as an HTTP directory by
server.py) or an S3 bucket (the moto server in the tests).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

COLUMNS = ("object_id", "title", "maker", "date", "medium", "deleted")
MAKERS = ("Rembrandt van Rijn", "Johannes Vermeer", "Frans Hals", "Jan Steen", "Judith Leyster", "Anonymous")
MEDIA = ("oil on canvas", "etching", "pen and ink", "silver", "porcelain")

FULL = "{date}/full/objects-{part}.csv"
DELTA = "{date}/delta/changes.csv"
MARKER = "{date}/_SUCCESS"
SUMS = "{date}/SHA256SUMS"
# The registry options of a partner reading this publisher (tests and the demo).
OPTIONS = {
    "full": "{date:%Y%m%d}/full/objects-*.csv*",
    "delta": "{date:%Y%m%d}/delta/changes.csv*",
    "done_marker": "{date:%Y%m%d}/_SUCCESS",
    "every": "1d",
    "format": {"kind": "csv", "identifier": "object_id", "deleted": "deleted", "title": "title"},
}


@dataclass
class Publisher:
    """The museum's collection and the deliveries it wrote to ``root`` of the filesystem ``fs``."""

    fs: Any
    root: str
    seed: int = 7
    live: dict[str, dict[str, str]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    published: dict[str, dict[str, str]] = field(default_factory=dict)  # as the last delivery left it
    deliveries: list[tuple[str, str]] = field(default_factory=list)  # (date, kind) in the order written
    next_id: int = 1

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.root = self.root.rstrip("/")

    # -- the collection --------------------------------------------------------------------

    def create(self, count: int) -> list[str]:
        made = []
        for _ in range(count):
            identifier = f"RM-{self.next_id:06d}"
            self.next_id += 1
            self.live[identifier] = self._object(identifier, 1)
            self.changed.add(identifier)
            self.deleted.discard(identifier)
            made.append(identifier)
        return made

    def edit(self, count: int) -> list[str]:
        chosen = self.random.sample(sorted(self.live), min(count, len(self.live)))
        for identifier in chosen:
            version = int(self.live[identifier]["title"].rsplit(" v", 1)[1]) + 1
            self.live[identifier] = self._object(identifier, version)
            self.changed.add(identifier)
        return chosen

    def delete(self, count: int, *, announce: bool = True) -> list[str]:
        """``announce=False``: gone without a deletion row (only the next full dump shows it)."""
        chosen = self.random.sample(sorted(self.live), min(count, len(self.live)))
        for identifier in chosen:
            del self.live[identifier]
            self.changed.discard(identifier)
            if announce:
                self.deleted.add(identifier)
        return chosen

    def _object(self, identifier: str, version: int) -> dict[str, str]:
        rng = self.random
        return {"object_id": identifier, "title": f"Object {identifier[3:]}, \"study\" v{version}",
                "maker": rng.choice(MAKERS), "date": str(rng.randint(1600, 1700)), "medium": rng.choice(MEDIA),
                "deleted": ""}

    # -- deliveries ------------------------------------------------------------------------

    def full(self, date: datetime, *, parts: int = 1, marker: bool = True, gz: bool = False,
             sums: bool = False) -> list[str]:
        """Every live object, split in ``parts`` files; the pending changes are in it."""
        ids = sorted(self.live)
        paths = []
        for part in range(parts):
            rows = [self.live[i] for i in ids[part::parts]]
            paths.append(self._write(FULL.format(date=_day(date), part=f"{part + 1:03d}"), rows, gz))
        self.published = {i: dict(self.live[i]) for i in ids}
        self.changed.clear()
        self.deleted.clear()
        self._finish(date, "full", paths, marker, sums)
        return paths

    def delta(self, date: datetime, *, marker: bool = True, gz: bool = False, sums: bool = False) -> str:
        """What changed since the last delivery: changed objects, then deleted ones."""
        rows = [self.live[i] for i in sorted(self.changed)]
        rows += [{**dict.fromkeys(COLUMNS, ""), "object_id": i, "deleted": "true"} for i in sorted(self.deleted)]
        path = self._write(DELTA.format(date=_day(date)), rows, gz)
        for identifier in self.changed:
            self.published[identifier] = dict(self.live[identifier])
        for identifier in self.deleted:
            self.published.pop(identifier, None)
        self.changed.clear()
        self.deleted.clear()
        self._finish(date, "delta", [path], marker, sums)
        return path

    def reupload_delta(self, date: datetime, edits: int) -> str:
        """The delta of ``date`` rewritten in place with ``edits`` more objects edited in it
        (the partner fixed its export): the same name, other content."""
        path = DELTA.format(date=_day(date))
        current = self._read(path)
        for identifier in self.edit(edits):
            current = [r for r in current if r["object_id"] != identifier] + [self.live[identifier]]
            self.published[identifier] = dict(self.live[identifier])
            self.changed.discard(identifier)
        self._write(path, current, False)
        return path

    def mark_done(self, date: datetime) -> None:
        self._pipe(MARKER.format(date=_day(date)), b"")

    def published_ids(self) -> set[str]:
        return set(self.published)

    def _finish(self, date: datetime, kind: str, paths: list[str], marker: bool, sums: bool) -> None:
        if sums:
            lines = [f"{hashlib.sha256(self.fs.cat(f'{self.root}/{p}')).hexdigest()}  {p.split('/', 1)[1]}"
                     for p in paths]
            self._pipe(SUMS.format(date=_day(date)), ("\n".join(lines) + "\n").encode())
        if marker:
            self.mark_done(date)
        self.deliveries.append((_day(date), kind))

    def _write(self, path: str, rows: list[dict[str, str]], gz: bool) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(rows)
        data = buffer.getvalue().encode("utf-8")
        if gz:
            path += ".gz"
            data = gzip.compress(data, mtime=0)
        self._pipe(path, data)
        return path

    def _pipe(self, path: str, data: bytes) -> None:
        full = f"{self.root}/{path}"
        if self.fs.protocol in ("file", ("file", "local")) or "file" in self.fs.protocol:
            self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe(full, data)

    def _read(self, path: str) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO(self.fs.cat(f"{self.root}/{path}").decode("utf-8"))))


def _day(date: datetime) -> str:
    return date.strftime("%Y%m%d")
