"""The server-side path of a plain or gzip CSV/TSV file: PostgreSQL parses it and builds the staging rows.

The ordinary path (readers.py) parses each row, encodes its JSON and hashes it in Python,
several times slower than a raw COPY of the same file. Here the file's bytes go to the
server in chunks of about ``CHUNK_BYTES`` cut at a row boundary: COPY (FORMAT csv) parses a
chunk into a temporary table of text columns and one INSERT ... SELECT builds the rows the
ordinary path stages (the same JSON: ``to_json`` escapes as msgspec does; the same content
hash; the same flags, warnings and kept stamps). Each chunk commits with its checkpoint (a
byte offset, or a record number in a gzip file), where a killed try resumes as on the
ordinary path.

No shortcut without the tolerance of the long way: a chunk holds only rows both parsers read
alike (``_grammar``: fields unquoted without quotes, or quoted with inner quotes doubled);
the first other row (a stray quote, a blank line, a bare CR, a last row without its
newline), and any chunk the server refuses (invalid UTF-8, a NUL, a short or long row) or
the rules would judge (an empty or overlong identifier, an oversized record, a deletion
marker the server cannot lower as Python does), is read by the ordinary reader from that
very byte, for ``DETOUR_BYTES`` at least: its outcome is the ordinary path's.
"""

from __future__ import annotations

import codecs
import csv
import logging
import re
from collections.abc import Callable, Iterator
from functools import partial
from itertools import islice
from typing import IO, Any

import msgspec
import psycopg
from psycopg import sql

from partner_harvest.files.readers import FileReader, Positioned, clean_header, compression_of, seeks
from partner_harvest.files.storage import BLOCK, Storage
from partner_harvest.formats.checks import warnings_json
from partner_harvest.records import HarvestItem, HarvestStats
from partner_harvest.store.staging import MAX_IDENTIFIER_BYTES, StagingWriter

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
DETOUR_BYTES = 1024 * 1024
WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())  # what str.strip() strips (none above)
LOWERS_TO_ASCII = "\u212a"  # KELVIN SIGN: the one non-ASCII character str.lower() turns into ASCII
TABLE = "ph_file_rows"
PAGES_PER_LOG = 8

Flush = Callable[[list[HarvestItem], int], None]


def why_not(reader: FileReader, path: str, sink: object) -> str | None:
    """Why a file takes the ordinary path; None: the server-side one."""
    fmt = reader.fmt
    delimiter = reader.dialect()["delimiter"]
    if fmt.kind not in ("csv", "tsv") or compression_of(path, fmt.compression) == "zip":
        return "not a plain or gzip CSV or TSV file"
    if type(sink) is not StagingWriter or sink.conn.info.parameter_status("server_encoding") != "UTF8":
        return "not staged into a UTF-8 database"
    if codecs.lookup(fmt.encoding).name != "utf-8" or fmt.datestamp:
        return "not UTF-8, or each row names its own datestamp"
    if not all(v.isascii() for v in reader.deleted_values) or not delimiter.isascii() or delimiter in '"\\\r\n':
        return "a deleted value or the delimiter is not plain ASCII"
    return None


class Source:
    """A file's bytes from an offset: chunks for COPY and lines for the ordinary reader, alike."""

    def __init__(self, stream: IO[bytes], offset: int):
        self.stream, self.offset, self.buffer, self.at, self.ended = stream, offset, b"", 0, False

    def peek(self, size: int) -> memoryview:
        """The next ``size`` bytes (fewer at the end), not consumed."""
        while len(self.buffer) - self.at < size and not self.ended:
            more = self.stream.read(max(size - len(self.buffer) + self.at, BLOCK))
            self.ended = not more
            self.buffer, self.at = self.buffer[self.at:] + more, 0
        return memoryview(self.buffer)[self.at:self.at + size]

    def take(self, size: int) -> None:
        self.at += size
        self.offset += size

    def lines(self) -> Iterator[bytes]:
        """Lines as a binary file yields them, each consumed as it is yielded."""
        while True:
            end = self.buffer.find(b"\n", self.at)
            while end < 0 and not self.ended:
                self.peek(len(self.buffer) - self.at + BLOCK)
                end = self.buffer.find(b"\n", self.at)
            line = self.buffer[self.at:end + 1] if end >= 0 else self.buffer[self.at:]
            if not line:
                return
            self.take(len(line))
            yield line


class ServerSide:
    """Stages one CSV or TSV file through the server (module docstring); ``flush`` stages a
    page of the ordinary reader's items with its checkpoint as the harvester does."""

    def __init__(self, reader: FileReader, sink: StagingWriter, stats: HarvestStats, flush: Flush,
                 checkpoint: Callable[[int], int], holds: bool):
        self.reader, self.sink, self.stats, self.flush = reader, sink, stats, flush
        self.checkpoint, self.holds = checkpoint, holds
        self.read = 0

    def stage(self, storage: Storage, path: str, stamp: Any, start: int, digest: Any) -> Any:
        """Stage the file from ``start``; returns the counting stream under it (readers.Counting)."""
        self.path, self.stamp, self.seekable = path, stamp, seeks(path, self.reader.fmt)
        stream, counting = self.reader.open(storage, path, start, digest)
        source = Source(stream, counting.count)
        if self.seekable and start:
            header: list[str] | None = self.reader.csv_header(storage, path)
        else:
            first = next(csv.reader((line.decode("utf-8", "surrogateescape") for line in source.lines()),
                                    **self.reader.dialect()), None)
            header = clean_header(first) if first is not None else None
        if header is None:
            return counting
        self.number = 0 if self.seekable else start  # record numbers, where positions are not offsets
        if not self.seekable and start:  # a resumed gzip file: past the records staged, as the ordinary path
            for _ in islice(self.reader.csv_items(source.lines(), path, stamp, source.offset, header), start):
                pass
        statement = self._statement(header)
        if statement is None:
            self._detour(source, header, None)
            return counting
        with self.sink.conn.transaction():
            self.sink.conn.execute(sql.SQL("DROP TABLE IF EXISTS {0}; CREATE TEMP TABLE {0} ({1}) ON COMMIT DELETE ROWS")
                                   .format(sql.Identifier(TABLE), sql.SQL(", ").join(
                                       sql.SQL("{} text").format(sql.Identifier(f"c{i}")) for i in range(len(header)))))
        copy = sql.SQL("COPY {} FROM STDIN (FORMAT csv, DELIMITER {}, ENCODING 'UTF8', FORCE_NOT_NULL ({}))").format(
            sql.Identifier(TABLE), sql.Literal(self.reader.dialect()["delimiter"]),
            sql.SQL(", ").join(sql.Identifier(f"c{i}") for i in range(len(header))))
        rows = _grammar(self.reader.dialect()["delimiter"], len(header))
        while data := source.peek(CHUNK_BYTES):
            good = rows.match(data).end()  # type: ignore[union-attr]  # (?:...)*+ always matches
            if good and self._chunk(copy, statement, data[:good], source.offset + good):
                source.take(good)
            else:
                self._detour(source, header, source.offset + (good or DETOUR_BYTES))
        with self.sink.conn.transaction():
            self.sink.conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(TABLE)))
        return counting

    def _chunk(self, copy: sql.Composed, statement: Callable[..., sql.Composed], data: memoryview, end: int) -> bool:
        """Stage whole rows in one transaction; False (nothing staged) when the ordinary path must."""
        sink, stats = self.sink, self.stats
        try:
            with sink.page():
                with sink.conn.cursor() as cur, cur.copy(copy) as writer:
                    writer.write(data)
                row = sink.conn.execute(statement(seq=sql.Literal(sink.seq))).fetchone()
                records, tombstones, rejected, size, doubtful = row  # type: ignore[misc]
                if doubtful:
                    raise _Detour
                sink.count_run_bytes(size)
                count = records + tombstones + rejected
                stats.records, stats.tombstones, stats.rejected = (stats.records + records, stats.tombstones + tombstones,
                                                                   stats.rejected + rejected)
                stats.fetched += count
                stats.pages += 1
                sink.seq += count
                self.read += count
                self.number += count
                sink.note_progress(self.checkpoint(end if self.seekable else self.number))
        except (_Detour, psycopg.DataError) as exc:
            log.info("%s: %s: the rows from byte %d go the ordinary way (%s)", self.reader.partner_id, self.path,
                     end - len(data), "a row the rules judge" if isinstance(exc, _Detour) else str(exc).splitlines()[0])
            return False
        if stats.pages % PAGES_PER_LOG == 0:
            log.info("%s: %s: %.0f MB, %d items staged through the server", self.reader.partner_id, self.path,
                     end / 1e6, self.read)
        return True

    def _detour(self, source: Source, header: list[str], until: int | None) -> None:
        """The ordinary reader from the source's offset to the first row boundary at or after
        ``until`` (None: the end), staged page by page as the ordinary path stages them."""
        from partner_harvest.files.harvester import PAGE_BYTES, PAGE_ITEMS

        items: Positioned = self.reader.csv_items(source.lines(), self.path, self.stamp, source.offset, header)
        page: list[HarvestItem] = []
        size = 0
        for item, position in items:
            page.append(item)
            self.read += 1
            self.number += 1
            size += len(getattr(item, "metadata", "")) or 64
            done = until is not None and position >= until
            if done or len(page) >= PAGE_ITEMS or size >= PAGE_BYTES:
                self.flush(page, self.checkpoint(position if self.seekable else self.number))
                page, size = [], 0
            if done:
                return
        if page:
            self.flush(page, self.checkpoint(source.offset if self.seekable else self.number))

    def _statement(self, header: list[str]) -> Callable[..., sql.Composed] | None:
        """The INSERT ... SELECT building a chunk's staging rows (given its first seq), or None
        when the header itself needs the ordinary path (one column, a name not UTF-8)."""
        if len(header) < 2 or not all(_utf8(name) for name in header):
            return None
        id_at, deleted_at, title_at, _ = self.reader.csv_columns(header, self.path)
        column = [sql.Identifier(f"c{i}") for i in range(len(header))]
        last = dict(zip(header, range(len(header))))  # a repeated name: its last value at its first place
        parts: list[sql.Composable] = []
        for n, (name, index) in enumerate(last.items()):
            key = ("{" if n == 0 else ",") + msgspec.json.encode(name).decode() + ":"
            parts += [sql.Literal(key), sql.SQL("to_json({})::text").format(column[index])]
        metadata = sql.SQL(" || ").join([*parts, sql.Literal("}")])
        ws = sql.Literal(WHITESPACE)
        reject, warned = self.reader.no_title
        sink = self.sink
        pid, stamp = sql.Literal(sink.run.partner_id), sql.Literal(self.stamp)
        return partial(sql.SQL(_INSERT).format,
            identifier=sql.SQL("btrim({}, {})").format(column[id_at], ws),
            gone=sql.SQL("lower(btrim({}, {}) COLLATE \"C\") = ANY({})").format(
                column[deleted_at], ws, sql.Literal(sorted(self.reader.deleted_values)))
            if deleted_at is not None else sql.SQL("false"),
            doubt=sql.SQL("strpos({}, {}) > 0").format(column[deleted_at], sql.Literal(LOWERS_TO_ASCII))
            if deleted_at is not None else sql.SQL("false"),
            title=sql.SQL("btrim({}, {})").format(column[title_at], ws) if title_at is not None else sql.SQL("NULL"),
            metadata=metadata, table=sql.Identifier(TABLE), max_id=sql.Literal(MAX_IDENTIFIER_BYTES),
            max_record=sql.Literal(sink.max_record_bytes), reject=sql.Literal(reject),
            warnings=sql.Literal(msgspec.json.encode(warnings_json(warned)).decode() if warned else None),
            pid=pid, run=sql.Literal(sink.run.run_id), channel=sql.Literal(sink.run.channel), stamp=stamp,
            prefix=sql.Literal(self.reader.prefix),
            held=sql.SQL(_HELD).format(pid=pid, stamp=stamp) if self.holds else sql.SQL("NULL::timestamptz"))


# kind: R, T or Q as the ordinary path judges the row, '?' where only it can (the chunk then
# rolls back and takes that path). held: the stamp a restated record keeps (harvester._keep_stamps).
_INSERT = """
WITH parsed AS (
    SELECT row_number() OVER () AS n, {identifier} AS identifier, {gone} AS gone, {doubt} AS doubt,
           {title} AS title, {metadata} AS metadata
    FROM {table}),
judged AS (
    SELECT n, identifier, metadata, NULLIF(title, '') AS title, title = '' AS untitled,
           CASE WHEN identifier = '' OR octet_length(identifier) > {max_id} OR doubt THEN '?'
                WHEN gone THEN 'T'
                WHEN title = '' AND {reject}::text IS NOT NULL THEN 'Q'
                WHEN octet_length(metadata) > {max_record} THEN '?'
                ELSE 'R' END AS kind
    FROM parsed OFFSET 0),
hashed AS (
    SELECT *, CASE WHEN kind = 'R' THEN encode(sha256(convert_to(metadata, 'UTF8') || '\\x00'::bytea), 'hex') END AS hash
    FROM judged),
staged AS (
    INSERT INTO staging (partner_id, run_id, channel, seq, kind, identifier, datestamp, metadata_prefix, metadata,
                         set_specs, title, content_hash, reason, warnings)
    SELECT {pid}, {run}, {channel}, {seq} + n, kind::"char", identifier, COALESCE({held}, {stamp}),
           CASE WHEN kind <> 'T' THEN {prefix} END, CASE WHEN kind <> 'T' THEN metadata END,
           CASE WHEN kind = 'R' THEN '{{}}'::text[] END, CASE WHEN kind = 'R' THEN title END, hash,
           CASE WHEN kind = 'Q' THEN {reject} END, CASE WHEN kind = 'R' AND untitled THEN {warnings}::jsonb END
    FROM hashed h
    RETURNING kind, octet_length(metadata) AS size)
SELECT count(*) FILTER (WHERE kind = 'R'), count(*) FILTER (WHERE kind = 'T'), count(*) FILTER (WHERE kind = 'Q'),
       COALESCE(sum(size), 0), count(*) FILTER (WHERE kind = '?')
FROM staged
"""
_HELD = ("(SELECT r.datestamp FROM records r WHERE h.kind = 'R' AND r.partner_id = {pid} AND r.identifier = "
         "h.identifier AND r.datestamp < {stamp} AND r.content_hash = h.hash)")


class _Detour(Exception):
    """A chunk holds a row only the ordinary path can judge."""


def _grammar(delimiter: str, width: int) -> re.Pattern[bytes]:
    """Rows both parsers read alike, from a row boundary on: ``width`` fields, each unquoted
    without quotes or CR, or quoted with inner quotes doubled; not the end-of-data marker."""
    d = re.escape(delimiter.encode())
    field = rb'(?:"[^"]*+(?:""[^"]*+)*+"|[^"%s\r\n]*+)' % d
    return re.compile(rb"(?:(?!\\\.\r?\n)%s(?:%s%s){%d}\r?\n)*+" % (field, d, field, width - 1))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
