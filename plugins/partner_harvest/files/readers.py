"""Records out of one file, streamed: memory bounded by one record, whatever the file's size.

Each reader yields ``(item, position)``: the harvest item and where the file continues
after it. A position is a byte offset where the file can be entered there (plain CSV, TSV,
JSON Lines and MARC files: a resumed try seeks), else a record number (gzip, zip, XML: a
resumed try reads past that many records without staging them). Whatever a row cannot be
(too few fields, no identifier, not JSON, an unreadable MARC record) it is quarantined with
the reason, never dropped; the file's own damage (a truncated gzip, broken XML) fails the
file.

Every item of a delivery carries the delivery's date as its version stamp unless the
format names the record's own ``datestamp``.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from itertools import accumulate
from typing import IO, Any, cast

import msgspec
import pymarc
from lxml import etree

from partner_harvest.errors import PartnerDataError
from partner_harvest.files.spec import FormatOptions
from partner_harvest.files.storage import BLOCK, Storage
from partner_harvest.formats import get_format
from partner_harvest.formats.base import checked_by
from partner_harvest.formats.checks import Finding, Policy
from partner_harvest.records import HarvestItem, Record, Rejected, Tombstone
from partner_harvest.window import WindowError, parse_instant
from partner_harvest.xmlsafe import XmlInputError, iter_elements

Positioned = Iterator[tuple[HarvestItem, int]]
csv.field_size_limit(64 * 1024 * 1024)  # one field may be large; the record cap (max_record_bytes) still quarantines
RAW_KEPT = 64 * 1024  # what a quarantined row keeps of its raw text
CHUNK_BYTES = 1024 * 1024  # the whole lines a CSV reader takes from its stream at a time
_ENCODER = msgspec.json.Encoder()  # a row's JSON: four times json's speed (msgspec comes with Airflow)
_TRAILER = b" \r\n\t\x00\x1a"  # what MARC files carry after their last record


class Counting(io.RawIOBase):
    """A binary stream counting the bytes read and (optionally) hashing them."""

    def __init__(self, inner: IO[bytes], digest: Any = None):
        self.inner, self.digest, self.count = inner, digest, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        if self.digest is not None and n:
            self.digest.update(data)
        return n


def compression_of(path: str, setting: str) -> str:
    if setting != "auto":
        return setting
    lowered = path.lower()
    return "gzip" if lowered.endswith((".gz", ".gzip")) else "zip" if lowered.endswith(".zip") else "none"


def seeks(path: str, fmt: FormatOptions) -> bool:
    """Whether positions in this file are byte offsets (a resumed try seeks) or record numbers."""
    return fmt.kind != "xml" and compression_of(path, fmt.compression) == "none"


class FileReader:
    """Reads one partner's files as its options.files.format says."""

    def __init__(self, partner_id: str, fmt: FormatOptions, prefix: str, policy: Policy):
        self.partner_id, self.fmt, self.prefix, self.policy = partner_id, fmt, prefix, policy
        self.deleted_values = frozenset(v.strip().lower() for v in fmt.deleted_values)
        rejected, warnings = policy.judge((Finding("generic.no_title", "the record's title field is empty"),))
        self._no_title = (rejected.message if rejected else None, warnings)

    # -- entry -----------------------------------------------------------------------------

    def read(self, storage: Storage, path: str, stamp: datetime, start: int, digest: Any = None) -> tuple[Positioned, Counting]:
        """The file's items after ``start`` and the counting stream under them (bytes read, digest)."""
        compression = compression_of(path, self.fmt.compression)
        offset = start if seeks(path, self.fmt) else 0
        if self.fmt.kind in ("csv", "tsv") and offset:
            header = self._csv_header(storage, path)
        else:
            header = None
        counting = Counting(storage.open(path, offset), digest if offset == 0 else None)
        counting.count = offset
        stream: IO[bytes]
        if compression == "gzip":
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=counting, mode="rb"))
        elif compression == "zip":  # read at random by zipfile: a published digest is checked by one read ahead
            if counting.digest is not None:
                while counting.read(BLOCK):
                    pass
            return self._zip(storage, path, stamp, start), counting
        else:
            stream = io.BufferedReader(counting, 1024 * 1024)
        items = self._items(stream, path, stamp, offset, header)
        if not seeks(path, self.fmt):
            items = _numbered(items, start)
        return items, counting

    def _items(self, stream: IO[bytes], path: str, stamp: datetime, offset: int, header: list[str] | None) -> Positioned:
        kind = self.fmt.kind
        if kind in ("csv", "tsv"):
            return self._csv(stream, path, stamp, offset, header)
        if kind == "jsonl":
            return self._jsonl(stream, path, stamp, offset)
        if kind == "xml":
            return self._xml(stream, path, stamp)
        return self._marc(stream, path, stamp, offset)

    def _zip(self, storage: Storage, path: str, stamp: datetime, start: int) -> Positioned:
        """Every member of the archive in name order, as one stream of records (record numbers)."""
        with storage.open(path) as handle, zipfile.ZipFile(handle) as archive:
            names = sorted(n for n in archive.namelist() if not n.endswith("/"))
            number = 0
            for name in names:
                with archive.open(name) as member:
                    for item, _ in self._items(io.BufferedReader(cast(Any, member), 1024 * 1024),
                                               f"{path}!{name}", stamp, 0, None):
                        number += 1
                        if number > start:
                            yield item, number

    # -- CSV and TSV -----------------------------------------------------------------------

    def _dialect(self) -> dict[str, Any]:
        return {"delimiter": self.fmt.delimiter or ("\t" if self.fmt.kind == "tsv" else ",")}

    def _csv_header(self, storage: Storage, path: str) -> list[str]:
        with storage.open(path) as handle:
            lines = (line.decode(self.fmt.encoding, "surrogateescape") for line in io.BufferedReader(cast(Any, handle)))
            header = next(csv.reader(lines, **self._dialect()), None)
        if header is None:
            raise PartnerDataError(self.partner_id, f"read {storage.where}/{path}", "the file is empty: no header row")
        return _clean_header(header)

    def _csv(self, stream: IO[bytes], path: str, stamp: datetime, offset: int, header: list[str] | None) -> Positioned:
        encoding = self.fmt.encoding
        decode = partial(bytes.decode, encoding=encoding, errors="surrogateescape")
        # Lines come in batches; where a row ends is looked up from the reader's line count once
        # the row is done, not counted line by line.
        base, ends, first = offset, [0], 0  # the batch: its first byte, its lines' ends, its first line's number

        def lines() -> Iterator[str]:
            nonlocal base, ends, first
            while batch := stream.readlines(CHUNK_BYTES):
                base, first = base + ends[-1], first + len(ends) - 1
                ends = [0, *accumulate(map(len, batch))]
                yield from map(decode, batch)

        reader = csv.reader(lines(), **self._dialect())
        if header is None:
            top = next(reader, None)
            if top is None:
                return
            header = _clean_header(top)
        columns = {name: index for index, name in enumerate(header)}
        fmt = self.fmt
        id_at = self._column(columns, fmt.identifier, "identifier", path)
        deleted_at = self._column(columns, fmt.deleted, "deleted", path) if fmt.deleted else None
        title_at = self._column(columns, fmt.title, "title", path) if fmt.title else None
        stamp_at = self._column(columns, fmt.datestamp, "datestamp", path) if fmt.datestamp else None
        width, prefix, deleted_values, encode = len(header), self.prefix, self.deleted_values, _ENCODER.encode
        no_title_reject, no_title_warn = self._no_title
        keys = header
        next_row = base + ends[reader.line_num - first]
        for row in reader:
            begun = next_row  # where the row starts; position: where the file continues after it
            next_row = position = base + ends[reader.line_num - first]
            if not row:
                continue
            if len(row) != width:
                yield self._bad_row(row, id_at, path, begun, stamp,
                                    f"row has {len(row)} fields, the header {width}"), position
                continue
            identifier = row[id_at].strip()
            if not identifier:
                yield self._bad_row(row, id_at, path, begun, stamp, f"no identifier in column {fmt.identifier!r}"), position
                continue
            when = self._stamp(row[stamp_at], stamp) if stamp_at is not None else stamp
            if deleted_at is not None and row[deleted_at].strip().lower() in deleted_values:
                yield Tombstone(identifier, when), position
                continue
            try:
                metadata = encode(dict(zip(keys, row))).decode()
            except (msgspec.EncodeError, UnicodeEncodeError):  # a byte the encoding does not know (a lone surrogate)
                yield self._bad_row(row, id_at, path, begun, stamp, f"a field is not valid {encoding}"), position
                continue
            if title_at is not None:
                title = row[title_at].strip() or None
                if title is None:
                    if no_title_reject:
                        yield Rejected(identifier, no_title_reject, metadata, when, prefix), position
                        continue
                    yield Record(identifier, when, prefix, metadata, (), None, no_title_warn), position
                    continue
                yield Record(identifier, when, prefix, metadata, (), title), position
            else:
                yield Record(identifier, when, prefix, metadata), position

    def _column(self, columns: dict[str, int], name: str | None, what: str, path: str) -> int:
        if name not in columns:
            raise PartnerDataError(self.partner_id, f"read {path}", f"the header has no column {name!r} (options.files."
                                   f"format.{what}); it has {', '.join(list(columns)[:20])}")
        return columns[name]

    def _bad_row(self, row: list[str], id_at: int, path: str, position: int, stamp: datetime, why: str) -> Rejected:
        identifier = row[id_at].strip() if id_at < len(row) and row[id_at].strip() else f"{path}@{position}"
        return Rejected(identifier, f"{path}: {why}", json.dumps(row, ensure_ascii=False)[:RAW_KEPT], stamp, self.prefix)

    def _stamp(self, text: str, fallback: datetime) -> datetime:
        try:
            return parse_instant(text) if text.strip() else fallback
        except WindowError:
            return fallback

    # -- JSON Lines ------------------------------------------------------------------------

    def _jsonl(self, stream: IO[bytes], path: str, stamp: datetime, offset: int) -> Positioned:
        fmt, prefix = self.fmt, self.prefix
        ident, deleted = _getter(fmt.identifier), _getter(fmt.deleted)
        title_of, stamp_of = _getter(fmt.title), _getter(fmt.datestamp)
        no_title_reject, no_title_warn = self._no_title
        position = offset
        for raw in stream:
            position += len(raw)
            text = raw.decode(fmt.encoding, "surrogateescape").strip()
            if not text:
                continue
            try:
                document = _decode_json(text)
            except (ValueError, msgspec.DecodeError) as exc:
                yield Rejected(f"{path}@{position}", f"json.unreadable: {path}: {exc}", text[:RAW_KEPT], stamp, prefix), position
                continue
            if not isinstance(document, dict):
                yield Rejected(f"{path}@{position}", f"json.unreadable: {path}: a line is a JSON "
                               f"{type(document).__name__}, not an object", text[:RAW_KEPT], stamp, prefix), position
                continue
            identifier = _text(ident(document))
            if not identifier:
                yield Rejected(f"{path}@{position}", f"{path}: no identifier at {fmt.identifier!r}", text[:RAW_KEPT],
                               stamp, prefix), position
                continue
            when = self._stamp(_text(stamp_of(document)) or "", stamp) if fmt.datestamp else stamp
            if fmt.deleted and _text(deleted(document)).lower() in self.deleted_values:
                yield Tombstone(identifier, when), position
                continue
            if fmt.title:
                title = _text(title_of(document)) or None
                if title is None:
                    if no_title_reject:
                        yield Rejected(identifier, no_title_reject, text, when, prefix), position
                        continue
                    yield Record(identifier, when, prefix, text, (), None, no_title_warn), position
                    continue
                yield Record(identifier, when, prefix, text, (), title), position
            else:
                yield Record(identifier, when, prefix, text), position

    # -- XML -------------------------------------------------------------------------------

    def _xml(self, stream: IO[bytes], path: str, stamp: datetime) -> Positioned:
        fmt, prefix = self.fmt, self.prefix
        namespaces = dict(fmt.namespaces)
        tag = _clark(fmt.record or "", namespaces)
        ident = etree.XPath(_xpath(fmt.identifier or ""), namespaces=namespaces, smart_strings=False)
        deleted = etree.XPath(_xpath(fmt.deleted), namespaces=namespaces, smart_strings=False) if fmt.deleted else None
        checker = get_format(prefix)
        number = 0
        try:
            for element in iter_elements(stream, tag):
                number += 1
                identifier = _first_text(ident(element))
                text = etree.tostring(element, encoding="unicode")
                if not identifier:
                    yield Rejected(f"{path}#{number}", f"{path}: record {number} has no identifier at "
                                   f"{fmt.identifier!r}", text[:RAW_KEPT], stamp, prefix), number
                elif deleted is not None and _first_text(deleted(element)).lower() in self.deleted_values:
                    yield Tombstone(identifier, stamp), number
                else:
                    checked = checked_by(checker, element)
                    rejected, warnings = self.policy.judge(checked.findings)
                    if rejected is not None:
                        yield Rejected(identifier, rejected.message, text, stamp, prefix), number
                    else:
                        if checked.repair is not None:
                            checked.repair()
                            text = etree.tostring(element, encoding="unicode")
                        yield Record(identifier, stamp, prefix, text, (), checked.title, warnings), number
                element.clear()
                parent = element.getparent()
                if parent is not None:
                    while element.getprevious() is not None:
                        del parent[0]
        except XmlInputError as exc:
            raise PartnerDataError(self.partner_id, f"read {path}", f"XML after record {number}: {exc.cause}") from None

    # -- MARC 21 binary --------------------------------------------------------------------

    def _marc(self, stream: IO[bytes], path: str, stamp: datetime, offset: int) -> Positioned:
        position, number = offset, 0
        tag, _, code = (self.fmt.identifier or "001").partition("$")
        checker = get_format("marc21")
        while True:
            head = stream.read(5)
            if not head:
                return
            number += 1
            if not head.strip(_TRAILER):  # a newline, NUL or ^Z after the last record: the end
                if not stream.read(64 * 1024).strip(_TRAILER):
                    return
            if len(head) < 5 or not head.isdigit() or int(head) < 24:
                raise PartnerDataError(self.partner_id, f"read {path}", f"MARC record at byte {position} has no "
                                       f"readable length ({head!r}): the file is damaged or not ISO 2709")
            raw = head + stream.read(int(head) - 5)
            position += len(raw)
            where = f"{path}@{position - len(raw)}"
            if len(raw) < int(head):
                raise PartnerDataError(self.partner_id, f"read {path}", f"MARC record at byte {position - len(raw)} is "
                                       "cut short: the file is truncated")
            yield self._marc_item(raw, where, tag, code, stamp, checker), position

    def _marc_item(self, raw: bytes, where: str, tag: str, code: str, stamp: datetime, checker: Any) -> HarvestItem:
        shown = raw.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")[:RAW_KEPT]
        try:
            record = pymarc.Record(data=raw, to_unicode=True, force_utf8=False, utf8_handling="strict",
                                   hide_utf8_warnings=True)
        except Exception as exc:
            return Rejected(where, f"marc.unreadable: {type(exc).__name__}: {exc}", shown, stamp, "marc21")
        identifier = _marc_id(record, tag, code)
        if not identifier:
            return Rejected(where, f"MARC record has no identifier in {tag}{'$' + code if code else ''}", shown,
                            stamp, "marc21")
        if str(record.leader)[5:6] == "d":
            return Tombstone(identifier, stamp)
        try:
            element = etree.fromstring(pymarc.record_to_xml(record, namespace=True))
        except (ValueError, etree.XMLSyntaxError) as exc:
            return Rejected(identifier, f"marc.unreadable: cannot serialise ({exc})", shown, stamp, "marc21")
        checked = checked_by(checker, element)
        rejected, warnings = self.policy.judge(checked.findings)
        text = etree.tostring(element, encoding="unicode")
        if rejected is not None:
            return Rejected(identifier, rejected.message, text, stamp, "marc21")
        if checked.repair is not None:
            checked.repair()
            text = etree.tostring(element, encoding="unicode")
        return Record(identifier, stamp, "marc21", text, (), checked.title, warnings)


_decode_json = msgspec.json.Decoder().decode


def new_digest(checksum: str | None) -> Any:
    """A hash object for ``algorithm:hex``, None when there is nothing to verify."""
    if not checksum:
        return None
    return hashlib.new(checksum.split(":", 1)[0])


def _numbered(items: Positioned, start: int) -> Positioned:
    """Positions as record numbers, past the first ``start`` (a file without byte offsets)."""
    for number, (item, _) in enumerate(items, 1):
        if number > start:
            yield item, number


def _clean_header(header: list[str]) -> list[str]:
    if header and header[0].startswith("\ufeff"):
        header = [header[0][1:], *header[1:]]
    return [name.strip() for name in header]


def _getter(path: str | None) -> Callable[[Any], Any]:
    """A dotted path into a JSON document (a.b.0.c); a missing step gives None."""
    steps = [int(s) if s.isdigit() else s for s in path.split(".")] if path else []

    def get(document: Any) -> Any:
        value = document
        for step in steps:
            if isinstance(step, int) and isinstance(value, list):
                value = value[step] if step < len(value) else None
            elif isinstance(value, dict):
                value = value.get(step if isinstance(step, str) else str(step))
            else:
                return None
        return value

    return get


def _text(value: Any) -> str:
    if value is None or isinstance(value, (dict, list)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def _clark(name: str, namespaces: dict[str, str]) -> str:
    if name.startswith("{") or ":" not in name:
        return name
    prefix, local = name.split(":", 1)
    if prefix not in namespaces:
        raise ValueError(f"the record element {name!r} uses prefix {prefix!r}, not in options.files.format.namespaces")
    return f"{{{namespaces[prefix]}}}{local}"


def _xpath(path: str) -> str:
    return path if path.startswith(("@", ".", "/", "string(")) else f"./{path}" if path else "."


def _first_text(found: Any) -> str:
    if isinstance(found, str):
        return found.strip()
    for node in found if isinstance(found, list) else ():
        text = node if isinstance(node, str) else "".join(node.itertext())
        if text.strip():
            return text.strip()
    return ""


def _marc_id(record: pymarc.Record, tag: str, code: str) -> str:
    for field in record.get_fields(tag):
        if field.is_control_field():
            return (field.data or "").strip()
        for value in field.get_subfields(code or "a"):
            if value.strip():
                return value.strip()
    return ""
