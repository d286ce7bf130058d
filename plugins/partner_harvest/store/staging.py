"""Streaming a window into the staging table with COPY, one page per transaction.

Whatever PostgreSQL cannot store (a NUL character, a lone surrogate, an identifier too
long for a btree entry) or the partner's limit forbids (an oversized payload) is turned
into a quarantined reject here, escaped, with its reason: it never fails the COPY, so it
never blocks its page, its window or the cursor (I8, I11).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import overload

import psycopg

from partner_harvest.errors import PartnerCapExceeded
from partner_harvest.formats.checks import warnings_json
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.store import fences
from partner_harvest.store.db import scalar
from partner_harvest.store.runs import RunRef, check_attempt, record_progress

# Binary: the server reads the datestamp as eight bytes and the set specs as an array of
# lengths instead of parsing their text and unescaping every payload (a 500-record page cost
# the backend 5.8 ms instead of 8.1 ms; the client's CPU was the same).
COLUMNS = ("partner_id", "run_id", "channel", "seq", "kind", "identifier", "datestamp", "metadata_prefix", "metadata",
           "set_specs", "title", "content_hash", "reason", "warnings", "entity", "parents")  # what a staged row holds
_COPY = f"COPY staging ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)"
# The columns' types, so COPY looks up no dumper per value. ``kind`` is a "char": psycopg
# knows no dumper for it, and its binary form (one byte) is that of a one-letter ASCII text.
_COPY_TYPES = ["text", "text", "text", "int8", "text", "text", "timestamptz", "text", "text", "text[]",
               "text", "text", "text", "jsonb", "text", "text[]"]

MAX_IDENTIFIER_BYTES = 1000  # well inside a btree entry (about 2,700 bytes) with partner_id
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_RUN_BYTES = 64 * 1024 ** 3  # registry options.limits.max_run_bytes
QUARANTINED_HEAD_BYTES = 64 * 1024  # what is kept of a payload refused for its size


class StagingWriter:
    """Writes harvest items for one run channel; memory is bounded by one page (I5)."""

    def __init__(self, conn: psycopg.Connection, run: RunRef, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 progress: HarvestStats | None = None, seq: int = 0, attempt: int | None = None,
                 max_run_bytes: int = DEFAULT_MAX_RUN_BYTES):
        self.conn = conn
        self.run = run
        self.seq = seq
        self.max_record_bytes = max_record_bytes
        # What the whole run (every channel and slice) may stage: each page adds its payload
        # bytes to its channel's harvest_runs row and checks the run's sum, in its transaction.
        self.max_run_bytes = max_run_bytes
        # With the channel's running totals, every page also writes them (and a checkpoint)
        # to its harvest_runs row in the page's own transaction: progress while it runs.
        self.progress = progress
        # The try this writer belongs to: every page checks it is still the channel's current
        # one (a worker lost mid-page may leave its task process running beside the retry).
        self.attempt = attempt

    def reset(self) -> None:
        """Drop what this channel staged so far: the window restarts from its bounds."""
        with self.conn.transaction():
            check_attempt(self.conn, self.run, self.attempt)
            fences.check(self.conn, f"staging reset of {self.run.channel} of run {self.run.run_id}")
            self.conn.execute(
                "DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s",
                self.run.key(),
            )
            self.conn.execute("UPDATE harvest_runs SET staged_bytes = 0"
                              " WHERE partner_id = %s AND run_id = %s AND channel = %s", self.run.key())
            if self.progress is not None:
                self.conn.execute(
                    "UPDATE harvest_runs SET pages = 0, fetched = 0, checkpoint = NULL, progress_at = now()"
                    " WHERE partner_id = %s AND run_id = %s AND channel = %s", self.run.key(),
                )
        self.seq = 0

    def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None:
        """COPY one page; ``checkpoint``: where a resumed slice would start after this page."""
        if not items and self.progress is None and self.attempt is None:
            return
        pid, run_id, channel = self.run.key()
        with self.conn.transaction():
            check_attempt(self.conn, self.run, self.attempt)
            fences.check(self.conn, f"staging of {channel} of run {run_id}")
            if items:
                size, seq, limit = 0, self.seq, self.max_record_bytes
                with self.conn.cursor() as cur, cur.copy(_COPY) as copy:
                    copy.set_types(_COPY_TYPES)
                    write = copy.write_row
                    for item in items:
                        seq += 1
                        if type(item) is Record and (plain := _plain_size(item, limit)) is not None:
                            size += plain  # the hot path: a record every check passes, checked once
                            write(_record_row(pid, run_id, channel, seq, item))
                        else:
                            stored = storable(item, limit)
                            size += _payload_bytes(stored)
                            write(_row(pid, run_id, channel, seq, stored))
                    self.seq = seq
                self._count_run_bytes(size)
            if self.progress is not None:
                announced = self.progress.complete_list_size
                record_progress(self.conn, self.run, self.progress.pages, self.progress.fetched, checkpoint,
                                announced if announced is not None else self.progress.expected)

    def _count_run_bytes(self, size: int) -> None:
        """Add the page's payload bytes to the channel's row; raise (the page's transaction
        then rolls back: nothing of it lands) when the run's sum passes the cap."""
        pid, run_id, channel = self.run.key()
        total = scalar(self.conn.execute(
            """
            WITH added AS (
                UPDATE harvest_runs SET staged_bytes = staged_bytes + %(size)s
                WHERE partner_id = %(pid)s AND run_id = %(run)s AND channel = %(channel)s RETURNING staged_bytes
            )
            SELECT COALESCE((SELECT sum(staged_bytes) FROM harvest_runs
                             WHERE partner_id = %(pid)s AND run_id = %(run)s AND channel <> %(channel)s), 0)
                   + COALESCE((SELECT staged_bytes FROM added), 0)
            """, {"size": size, "pid": pid, "run": run_id, "channel": channel},
        ))
        if total > self.max_run_bytes:
            raise PartnerCapExceeded(
                pid, f"staging of {channel} of run {run_id}",
                f"the run would have staged {total} bytes of payloads, over the cap options.limits.max_run_bytes = "
                f"{self.max_run_bytes}; this page was not staged and the run stops",
            )


NOT_LISTED = "not_listed"  # the reason (deletions.reason) of what a whole list did not name


def stage_not_listed(conn: psycopg.Connection, run: RunRef, at: datetime, attempt: int | None = None) -> int:
    """Stage a tombstone in ``run``'s channel for each held record stamped no later than
    ``at`` that no channel of the run staged (a quarantined row counts as listed), dated at
    the stored version's own stamp as the reconcile's removals are: the apply purges exactly
    that version, reason ``not_listed``. Returns how many."""
    pid, run_id, channel = run.key()
    with conn.transaction():
        check_attempt(conn, run, attempt)
        fences.check(conn, f"staging of {channel} of run {run_id}")
        conn.execute("DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s", run.key())
        return conn.execute(
            """
            INSERT INTO staging (partner_id, run_id, channel, seq, kind, identifier, datestamp, reason)
            SELECT %(pid)s, %(run)s, %(channel)s, row_number() OVER (ORDER BY r.identifier), 'T', r.identifier,
                   r.datestamp, %(reason)s
            FROM records r
            WHERE r.partner_id = %(pid)s AND r.datestamp <= %(at)s
              AND NOT EXISTS (SELECT 1 FROM staging s WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s
                              AND s.identifier = r.identifier)
            """, {"pid": pid, "run": run_id, "channel": channel, "at": at, "reason": NOT_LISTED},
        ).rowcount


def held_stamps(conn: psycopg.Connection | None, partner_id: str, identifiers: list[str]) -> dict[str, datetime]:
    """The stamps the aggregation holds for ``identifiers``, read on a staging sink's ``conn``
    (adapters.StagingSink; a sink that is no database, None, holds nothing)."""
    if not identifiers or conn is None:
        return {}
    with conn.transaction():
        rows = conn.execute("SELECT identifier, datestamp FROM records WHERE partner_id = %s "
                            "AND identifier = ANY(%s)", (partner_id, identifiers)).fetchall()
    return {row[0]: row[1] for row in rows}


def held_versions(conn: psycopg.Connection | None, partner_id: str,
                  identifiers: list[str]) -> dict[str, tuple[datetime, str]]:
    """The stamp and content hash the aggregation holds for each of ``identifiers`` (read as
    :func:`held_stamps` reads)."""
    if not identifiers or conn is None:
        return {}
    with conn.transaction():
        rows = conn.execute("SELECT identifier, datestamp, content_hash FROM records WHERE partner_id = %s "
                            "AND identifier = ANY(%s)", (partner_id, identifiers)).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def holds_any(conn: psycopg.Connection | None, partner_id: str) -> bool:
    """Whether the aggregation holds any record of the partner."""
    if conn is None:
        return False
    with conn.transaction():
        return bool(scalar(conn.execute("SELECT EXISTS (SELECT 1 FROM records WHERE partner_id = %s)", (partner_id,))))


def _payload_bytes(item: HarvestItem) -> int:
    text = item.metadata if isinstance(item, Record) else item.raw if isinstance(item, Rejected) else None
    if not text:
        return 0
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def storable(item: HarvestItem, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> HarvestItem:
    """The item itself when PostgreSQL can store it within the limit, else a Rejected saying why."""
    if type(item) is Record and _plain_size(item, max_record_bytes) is not None:
        return item
    problem = _identifier_problem(item.identifier)
    if problem is None and isinstance(item, Record):
        problem = _text_problem(item.metadata_prefix, item.metadata, item.title, *item.set_specs)
        if problem is None:
            metadata = item.metadata
            size = len(metadata) if metadata.isascii() else len(metadata.encode("utf-8"))
            if size > max_record_bytes:
                return Rejected(
                    item.identifier,
                    f"payload of {size} bytes exceeds the partner's limit of {max_record_bytes} bytes "
                    f"(registry: options.limits.max_record_bytes); first {QUARANTINED_HEAD_BYTES} bytes kept",
                    item.metadata.encode("utf-8")[:QUARANTINED_HEAD_BYTES].decode("utf-8", "ignore"),
                    item.datestamp, item.metadata_prefix,
                )
    elif problem is None and isinstance(item, Rejected):
        if _text_problem(item.reason, item.raw, item.metadata_prefix) is None:
            return item
        return Rejected(item.identifier, escape(item.reason), escape(item.raw), item.datestamp, escape(item.metadata_prefix))
    if problem is None:
        return item
    raw = item.metadata if isinstance(item, Record) else item.raw if isinstance(item, Rejected) else ""
    reason = f"cannot be stored: {problem}"
    if isinstance(item, Rejected):
        reason += f"; rejected before that: {item.reason}"
    return Rejected(
        _storable_identifier(item.identifier), escape(reason), escape(raw[: 4 * QUARANTINED_HEAD_BYTES]),
        item.datestamp, escape(getattr(item, "metadata_prefix", None)),
    )


def _plain_size(record: Record, max_record_bytes: int) -> int | None:
    """The payload's bytes when a record certainly passes every check below: no NUL, no lone
    surrogate, sizes within the limits even at four bytes a character. The texts' checks run
    once over their join instead of once per text (the harvest's hot path); None only means
    "check in detail"."""
    identifier, metadata = record.identifier, record.metadata
    if len(identifier) * 4 > MAX_IDENTIFIER_BYTES or len(metadata) * 4 > max_record_bytes:
        return None
    joined = "".join((identifier, metadata, record.title or "", record.metadata_prefix or "", *record.set_specs))
    return None if _text_problem(joined) is not None else _payload_bytes(record)


@overload
def escape(text: str) -> str: ...
@overload
def escape(text: None) -> None: ...
def escape(text: str | None) -> str | None:
    """Text with NUL and lone surrogates written as backslash escapes (always storable)."""
    if text is None:
        return None
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _identifier_problem(identifier: str) -> str | None:
    problem = _text_problem(identifier)
    if problem:
        return f"identifier {problem}"
    size = len(identifier.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        return f"identifier of {size} bytes is longer than {MAX_IDENTIFIER_BYTES}"
    return None


def _text_problem(*texts: str | None) -> str | None:
    for text in texts:
        if text is None:
            continue
        if "\x00" in text:
            return "contains a NUL character"
        if text.isascii():  # no surrogate either; skips encoding large payloads
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"contains a lone surrogate at position {exc.start}"
    return None


def _storable_identifier(identifier: str) -> str:
    """An escaped identifier, cut to fit the quarantine index with a digest of the whole."""
    text = escape(identifier) or ""
    if len(text.encode("utf-8")) <= MAX_IDENTIFIER_BYTES:
        return text
    digest = hashlib.sha256(identifier.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    head = text.encode("utf-8")[: MAX_IDENTIFIER_BYTES - 40].decode("utf-8", "ignore")
    return f"{head}…[sha256:{digest}]"


def _record_row(pid: str, run_id: str, channel: str, seq: int, item: Record) -> tuple:
    return (
        pid, run_id, channel, seq, "R", item.identifier, item.datestamp, item.metadata_prefix,
        item.metadata, list(item.set_specs), item.title, item.content_hash, None,
        warnings_json(item.warnings), item.entity,
        list(item.parents) if item.entity else None,
    )


def _row(pid: str, run_id: str, channel: str, seq: int, item: HarvestItem) -> tuple:
    if isinstance(item, Record):
        return _record_row(pid, run_id, channel, seq, item)
    if isinstance(item, Tombstone):
        return (pid, run_id, channel, seq, "T", item.identifier, item.datestamp,
                None, None, None, None, None, item.reason, None, item.entity, None)
    if isinstance(item, Rejected):
        return (
            pid, run_id, channel, seq, "Q", item.identifier, item.datestamp, item.metadata_prefix,
            item.raw, None, None, None, item.reason, None, None, None,
        )
    raise TypeError(f"not a harvest item: {type(item).__name__}")
