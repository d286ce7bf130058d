"""SQL of a reconcile: the staged upstream id set against ``records``.

Vanished records are staged as tombstones dated at the stored version's own datestamp
(observed now), so the normal one-transaction apply purges exactly that version (reason
``reconcile``), never a newer one, and the remembered purge yields as soon as the partner
lists the record again, even with its old datestamp (a record restored upstream). A sweep can miss records the partner still
holds (offset paging shifted by a concurrent deletion, a record re-dated mid-list), so
vanished candidates are verified one by one first: the answers are added to
``reconcile_ids`` (live or deleted), and candidates beyond the verification budget are
added as live with no datestamp, i.e. kept until a later reconcile confirms them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from partner_harvest.records import Tombstone
from partner_harvest.store import attached, fences
from partner_harvest.store.db import one
from partner_harvest.store.runs import RunRef
from partner_harvest.store.staging import StagingWriter

_COPY_IDS = "COPY reconcile_ids (partner_id, run_id, identifier, datestamp, deleted, slice) FROM STDIN"


@dataclass(frozen=True)
class ReconcilePlan:
    """What a reconcile would do; ``removals`` is what the mass-purge guard weighs."""

    local: int
    upstream_live: int
    upstream_deleted: int
    vanished: int  # held locally, absent upstream
    deleted_upstream: int  # held locally, listed upstream as deleted
    missing: int  # live upstream, not held locally

    @property
    def removals(self) -> int:
        return self.vanished + self.deleted_upstream

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "removals": self.removals}


class IdSweepWriter:
    """Stages the upstream id set page by page (memory bounded by a page).

    ``slice``: one slice of a sliced sweep (store/reconcile_slices.py): its reset drops only
    its own rows, and each page's transaction also counts the page on the slice's row, so
    the row says what reconcile_ids holds of it.
    """

    def __init__(self, conn: psycopg.Connection, partner_id: str, run_id: str, slice: int = 0):
        self.conn, self.partner_id, self.run_id, self.slice = conn, partner_id, run_id, slice

    def reset(self) -> None:
        with self.conn.transaction():
            fences.check(self.conn, f"reconcile sweep of run {self.run_id}")
            if not self.slice:
                self.conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %s AND run_id = %s",
                                  (self.partner_id, self.run_id))
                return
            self.conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %s AND run_id = %s AND slice = %s",
                              (self.partner_id, self.run_id, self.slice))
            self.conn.execute("UPDATE reconcile_slices SET pages = 0, swept = 0, progress_at = now()"
                              " WHERE partner_id = %s AND run_id = %s AND slice = %s",
                              (self.partner_id, self.run_id, self.slice))

    def write_page(self, headers: list[tuple[str, datetime | None, bool]]) -> None:
        if not headers:
            return
        with self.conn.transaction(), self.conn.cursor() as cur:
            fences.check(self.conn, f"reconcile sweep of run {self.run_id}")
            with cur.copy(_COPY_IDS) as copy:
                for identifier, datestamp, deleted in headers:
                    copy.write_row((self.partner_id, self.run_id, identifier, datestamp, deleted, self.slice))
            if self.slice:
                cur.execute("UPDATE reconcile_slices SET pages = pages + 1, swept = swept + %s, progress_at = now()"
                            " WHERE partner_id = %s AND run_id = %s AND slice = %s",
                            (len(headers), self.partner_id, self.run_id, self.slice))


_PLAN = """
WITH up AS (
    SELECT DISTINCT ON (identifier) identifier, datestamp, deleted FROM reconcile_ids
    WHERE partner_id = %(pid)s AND run_id = %(run)s
    ORDER BY identifier, deleted ASC
), mine AS (
    SELECT identifier FROM {held} WHERE partner_id = %(pid)s
)
SELECT
    (SELECT count(*) FROM mine),
    (SELECT count(*) FROM up WHERE NOT deleted),
    (SELECT count(*) FROM up WHERE deleted),
    (SELECT count(*) FROM mine m WHERE NOT EXISTS (SELECT 1 FROM up u WHERE u.identifier = m.identifier)),
    (SELECT count(*) FROM mine m JOIN up u USING (identifier) WHERE u.deleted),
    (SELECT count(*) FROM up u WHERE NOT u.deleted
        AND NOT EXISTS (SELECT 1 FROM mine m WHERE m.identifier = u.identifier))
"""


def plan(conn: psycopg.Connection, partner_id: str, run_id: str, table: str = "records") -> ReconcilePlan:
    """``table``: what the sweep is compared with, ``records`` or an attached table (items,
    holdings: store/attached.py), whose sweep is kept under its own ``run_id``."""
    # The sweep just bulk-loaded the table: give the planner statistics before joining.
    conn.execute("ANALYZE reconcile_ids")
    row = one(conn.execute(sql.SQL(_PLAN).format(held=_held(table)), {"pid": partner_id, "run": run_id}))
    conn.commit()
    return ReconcilePlan(*row)


_VANISHED = """
SELECT r.identifier FROM records r
WHERE r.partner_id = %(pid)s
  AND NOT EXISTS (SELECT 1 FROM reconcile_ids u
                  WHERE u.partner_id = %(pid)s AND u.run_id = %(run)s AND u.identifier = r.identifier)
ORDER BY r.identifier
"""


def keep_unverified(conn: psycopg.Connection, partner_id: str, run_id: str, budget: int) -> int:
    """Mark vanished candidates beyond the first ``budget`` (by identifier) as kept."""
    with conn.transaction():
        cur = conn.execute(
            f"""
            INSERT INTO reconcile_ids (partner_id, run_id, identifier, datestamp, deleted)
            SELECT %(pid)s, %(run)s, identifier, NULL, false FROM ({_VANISHED} OFFSET %(budget)s) beyond
            """,
            {"pid": partner_id, "run": run_id, "budget": budget},
        )
        return cur.rowcount


def vanished_identifiers(conn: psycopg.Connection, partner_id: str, run_id: str, chunk: int) -> Iterator[list[str]]:
    """Held locally, absent from the sweep, in chunks by identifier (keyset: the caller
    may add answers to ``reconcile_ids`` between chunks)."""
    after = ""
    while True:
        rows = conn.execute(
            """
            SELECT r.identifier FROM records r
            WHERE r.partner_id = %(pid)s AND r.identifier > %(after)s
              AND NOT EXISTS (SELECT 1 FROM reconcile_ids u
                              WHERE u.partner_id = %(pid)s AND u.run_id = %(run)s AND u.identifier = r.identifier)
            ORDER BY r.identifier LIMIT %(chunk)s
            """,
            {"pid": partner_id, "run": run_id, "after": after, "chunk": chunk},
        ).fetchall()
        conn.commit()
        if not rows:
            return
        yield [r[0] for r in rows]
        after = rows[-1][0]


def missing_span(conn: psycopg.Connection, partner_id: str, run_id: str) -> tuple[int, datetime | None, bool]:
    """How many live upstream ids are missing, their oldest datestamp, and whether any
    has no datestamp (then only the whole list is sure to cover them)."""
    row = one(conn.execute(
        """
        SELECT count(DISTINCT u.identifier), min(u.datestamp), bool_or(u.datestamp IS NULL)
        FROM reconcile_ids u
        WHERE u.partner_id = %(pid)s AND u.run_id = %(run)s AND NOT u.deleted
          AND NOT EXISTS (SELECT 1 FROM records r WHERE r.partner_id = %(pid)s AND r.identifier = u.identifier)
          AND NOT EXISTS (SELECT 1 FROM reconcile_ids d WHERE d.partner_id = %(pid)s AND d.run_id = %(run)s
                          AND d.identifier = u.identifier AND d.deleted)
        """,
        {"pid": partner_id, "run": run_id},
    ))
    conn.commit()
    return int(row[0]), row[1], bool(row[2])


class MissingOnlySink:
    """Passes on only records (valid or rejected) the aggregation does not hold.

    A bulk ListRecords over the missing records' datestamp range also returns records we
    hold, and tombstones of records we never had; staging them would only cost COPY and
    apply time for ``unchanged`` rows (the apply would keep them unchanged anyway). Memory
    stays bounded by a page: each page asks the database which of its ids are held.
    """

    def __init__(self, conn: psycopg.Connection, writer: StagingWriter, partner_id: str):
        self.conn, self.writer, self.partner_id = conn, writer, partner_id
        self.run, self.attempt = writer.run, writer.attempt
        self.first_seq = writer.seq
        self.staged = 0

    @property
    def seq(self) -> int:
        return self.writer.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self.writer.seq = value

    def write_page(self, items: list[Any], checkpoint: int | None = None) -> None:
        if not items:
            return
        held = {
            r[0] for r in self.conn.execute(
                "SELECT identifier FROM records WHERE partner_id = %s AND identifier = ANY(%s)",
                (self.partner_id, [item.identifier for item in items]),
            )
        }
        self.conn.commit()
        wanted = [item for item in items if item.identifier not in held and not isinstance(item, Tombstone)]
        self.writer.write_page(wanted)
        self.staged += len(wanted)

    def reset(self) -> None:
        """An expired token restarts the listing: drop only what this sink staged."""
        run = self.writer.run
        with self.conn.transaction():
            self.conn.execute(
                "DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s AND seq > %s",
                (*run.key(), self.first_seq),
            )
        self.writer.seq = self.first_seq
        self.staged = 0


def missing_identifiers(conn: psycopg.Connection, partner_id: str, run_id: str, chunk: int,
                        table: str = "records", staged_as: RunRef | None = None) -> Iterator[list[str]]:
    """Live upstream ids the aggregation lacks and this run has not staged yet, in
    chunks, streamed from the server (``table``, ``staged_as``: an attached table's sweep,
    kept under its own ``run_id``, and the run channel that stages its fetches)."""
    staging = staged_as or RunRef(partner_id, run_id, "")
    with conn.transaction(), conn.cursor(name="reconcile_missing") as cur:
        cur.itersize = chunk
        cur.execute(
            sql.SQL("""
            SELECT DISTINCT u.identifier FROM reconcile_ids u
            WHERE u.partner_id = %(pid)s AND u.run_id = %(run)s AND NOT u.deleted
              AND NOT EXISTS (SELECT 1 FROM {held} r WHERE r.partner_id = %(pid)s AND r.identifier = u.identifier)
              AND NOT EXISTS (SELECT 1 FROM reconcile_ids d WHERE d.partner_id = %(pid)s AND d.run_id = %(run)s
                              AND d.identifier = u.identifier AND d.deleted)
              AND NOT EXISTS (SELECT 1 FROM staging s WHERE s.partner_id = %(pid)s AND s.run_id = %(staging)s
                              AND s.identifier = u.identifier AND s.entity IS NOT DISTINCT FROM %(entity)s)
            ORDER BY 1
            """).format(held=_held(table)),
            {"pid": partner_id, "run": run_id, "staging": staging.run_id, "entity": _entity(table)},
        )
        batch: list[str] = []
        for (identifier,) in cur:
            batch.append(identifier)
            if len(batch) >= chunk:
                yield batch
                batch = []
        if batch:
            yield batch


def stage_removals(conn: psycopg.Connection, run: RunRef, first_seq: int, table: str = "records",
                   sweep: str | None = None) -> int:
    """Stage tombstones for vanished and upstream-deleted records (of ``table``, swept under
    ``sweep``, default the run's id); returns how many."""
    with conn.transaction():
        fences.check(conn, f"reconcile removals of run {run.run_id}")
        cur = conn.execute(
            sql.SQL("""
            INSERT INTO staging (partner_id, run_id, channel, seq, kind, identifier, datestamp, entity)
            SELECT %(pid)s, %(run)s, %(channel)s, %(seq)s + row_number() OVER (ORDER BY r.identifier), 'T',
                   r.identifier, COALESCE(d.datestamp, r.datestamp), %(entity)s
            FROM {held} r
            LEFT JOIN LATERAL (
                SELECT max(u.datestamp) AS datestamp, bool_or(u.deleted) AS deleted, bool_or(NOT u.deleted) AS live
                FROM reconcile_ids u
                WHERE u.partner_id = %(pid)s AND u.run_id = %(sweep)s AND u.identifier = r.identifier
            ) d ON true
            WHERE r.partner_id = %(pid)s AND (d.live IS NULL OR (d.deleted AND NOT d.live))
            """).format(held=_held(table)),
            {"pid": run.partner_id, "run": run.run_id, "channel": run.channel, "seq": first_seq,
             "sweep": sweep or run.run_id, "entity": _entity(table)},
        )
        return cur.rowcount


def _held(table: str) -> sql.Identifier:
    return sql.Identifier("records") if table == "records" else attached.table(table)


def _entity(table: str) -> str | None:
    return None if table == "records" else table


def sweep_key(run_id: str, table: str) -> str:
    """Under which ``run_id`` reconcile_ids keeps an attached table's sweep (its ids may equal records')."""
    return f"{run_id}/{table}"


def clear(conn: psycopg.Connection, partner_id: str, run_id: str) -> None:
    keys = [run_id, *(sweep_key(run_id, table) for table in attached.ENTITIES)]
    with conn.transaction():
        conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %s AND run_id = ANY(%s)", (partner_id, keys))
        conn.execute("DELETE FROM reconcile_slices WHERE partner_id = %s AND run_id = %s", (partner_id, run_id))
