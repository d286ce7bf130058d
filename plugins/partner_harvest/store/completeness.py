"""SQL of a completeness check: an independent id enumeration against what a run staged (I12).

A Sierra full load stages what the MARC export delivered. A second witness, the JSON
API's list of live ids, is staged with COPY into the unlogged ``reconcile_ids`` table
under a run key of its own, and compared in SQL, so a million ids never sit in memory.
The ids the export missed are written to that table under a second key and read back
in keyset batches for the fix-up fetch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from partner_harvest.store.db import one, scalar
from partner_harvest.store.reconcile import IdSweepWriter
from partner_harvest.store.runs import RunRef


@dataclass(frozen=True)
class Gap:
    """The enumeration against the staging: ``found`` of ``expected`` live ids were staged."""

    expected: int  # distinct live ids the witness listed
    found: int  # of those, staged by the run (records and rejects)
    missing: int  # listed but not staged
    extra: int  # staged records the witness did not list (deleted since, or never live)


def _keys(run: RunRef) -> tuple[str, str]:
    base = f"{run.run_id}/{run.channel}/completeness"
    return f"{base}:listed", f"{base}:missing"


def listed_ids_writer(conn: psycopg.Connection, run: RunRef) -> IdSweepWriter:
    """Where the enumeration goes, page by page (COPY); cleared first."""
    writer = IdSweepWriter(conn, run.partner_id, _keys(run)[0])
    writer.reset()
    return writer


def measure_gap(conn: psycopg.Connection, run: RunRef) -> Gap:
    """Compare the enumeration with the staging; remember the missing ids for the fix-up."""
    listed_key, missing_key = _keys(run)
    params = {"pid": run.partner_id, "run": run.run_id, "channel": run.channel,
              "listed": listed_key, "missing": missing_key}
    conn.commit()  # a transaction of its own: the planner setting inside ends with it
    with conn.transaction():
        conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %(pid)s AND run_id = %(missing)s", params)
        # Freshly bulk-loaded tables: give the planner statistics before the anti-joins.
        conn.execute("ANALYZE reconcile_ids")
        conn.execute("ANALYZE staging")
        _no_nested_loops(conn)
        conn.execute(
            """
            INSERT INTO reconcile_ids (partner_id, run_id, identifier, deleted)
            SELECT DISTINCT %(pid)s, %(missing)s, l.identifier, false FROM reconcile_ids l
            WHERE l.partner_id = %(pid)s AND l.run_id = %(listed)s
              AND NOT EXISTS (SELECT 1 FROM staging s
                              WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.channel = %(channel)s
                                AND s.kind IN ('R', 'Q') AND s.identifier = l.identifier)
            """,
            params,
        )
        expected, missing, extra = one(conn.execute(
            """
            SELECT
                (SELECT count(DISTINCT identifier) FROM reconcile_ids
                 WHERE partner_id = %(pid)s AND run_id = %(listed)s),
                (SELECT count(*) FROM reconcile_ids WHERE partner_id = %(pid)s AND run_id = %(missing)s),
                (SELECT count(DISTINCT s.identifier) FROM staging s
                 WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.channel = %(channel)s AND s.kind = 'R'
                   AND NOT EXISTS (SELECT 1 FROM reconcile_ids l WHERE l.partner_id = %(pid)s
                                   AND l.run_id = %(listed)s AND l.identifier = s.identifier))
            """,
            params,
        ))
    return Gap(expected=expected, found=expected - missing, missing=missing, extra=extra)


def missing_batches(conn: psycopg.Connection, run: RunRef, size: int) -> Iterator[list[str]]:
    """The ids the enumeration listed and the run had not staged, in keyset batches."""
    missing_key = _keys(run)[1]
    after = ""
    while True:
        rows = conn.execute(
            "SELECT identifier FROM reconcile_ids WHERE partner_id = %s AND run_id = %s AND identifier > %s"
            " ORDER BY identifier LIMIT %s",
            (run.partner_id, missing_key, after, size),
        ).fetchall()
        conn.commit()
        if not rows:
            return
        batch = [identifier for (identifier,) in rows]
        yield batch
        after = batch[-1]


def still_missing(conn: psycopg.Connection, run: RunRef, sample: int = 20) -> tuple[int, list[str]]:
    """How many listed ids the run still has not staged after the fix-up, and the first few.

    A listed id staged as a deletion (deleted between the listing and the fetch) is
    accounted for.
    """
    listed_key = _keys(run)[0]
    conn.commit()  # a transaction of its own: the setting below ends with it
    with conn.transaction():
        _no_nested_loops(conn)
        rows = conn.execute(STILL_MISSING, {"pid": run.partner_id, "run": run.run_id, "channel": run.channel,
                                            "listed": listed_key, "sample": sample}).fetchall()
    return (rows[0][1] if rows else 0), [identifier for identifier, _ in rows]


def _no_nested_loops(conn: psycopg.Connection) -> None:
    """These statements compare whole id sets: a hash or merge join is always linear, a
    nested loop over staging (no index on identifier) is quadratic. On statistics taken
    while a sibling slice was still staging, the planner chose one: a check with nothing
    missing took 70 s per slice instead of a fraction of a second
    (benchmarks/sierra_sliced_load.py)."""
    conn.execute("SET LOCAL enable_nestloop = off")


STILL_MISSING = """
        SELECT l.identifier, count(*) OVER () FROM (
            SELECT DISTINCT identifier FROM reconcile_ids WHERE partner_id = %(pid)s AND run_id = %(listed)s
        ) l
        WHERE NOT EXISTS (SELECT 1 FROM staging s
                          WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.channel = %(channel)s
                            AND s.kind IN ('R', 'Q', 'T') AND s.identifier = l.identifier)
        ORDER BY l.identifier LIMIT %(sample)s
"""


_HELD_NOT_LISTED = """
    FROM records r
    WHERE r.partner_id = %(pid)s AND r.identifier > %(after)s
      AND (NOT %(sliced)s OR (CASE WHEN r.identifier ~ '^[0-9]{1,18}$' THEN r.identifier::bigint END)
                             BETWEEN %(lo)s AND %(hi)s)
      AND NOT EXISTS (SELECT 1 FROM reconcile_ids l
                      WHERE l.partner_id = %(pid)s AND l.run_id = %(listed)s AND l.identifier = r.identifier)
      AND NOT EXISTS (SELECT 1 FROM staging s
                      WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.channel = %(channel)s
                        AND s.identifier = r.identifier)
"""


def _held_params(run: RunRef, lo: int | None, hi: int | None, sliced: bool) -> dict:
    return {"pid": run.partner_id, "run": run.run_id, "channel": run.channel, "listed": _keys(run)[0],
            "sliced": sliced, "lo": -1 if lo is None else lo, "hi": 2**63 - 1 if hi is None else hi, "after": ""}


def held_not_listed(conn: psycopg.Connection, run: RunRef, *, lo: int | None = None, hi: int | None = None,
                    sliced: bool = False) -> tuple[int, int]:
    """Records the mirror holds (within a slice's id range) that the enumeration did not
    list live and the run did not stage: deleted upstream since the mirror got them.
    Returns (how many, how many records the mirror holds in that range)."""
    params = _held_params(run, lo, hi, sliced)
    conn.commit()
    with conn.transaction():
        _no_nested_loops(conn)
        gone = scalar(conn.execute("SELECT count(*) " + _HELD_NOT_LISTED, params))
        held = scalar(conn.execute(
            """SELECT count(*) FROM records r WHERE r.partner_id = %(pid)s
               AND (NOT %(sliced)s OR (CASE WHEN r.identifier ~ '^[0-9]{1,18}$' THEN r.identifier::bigint END)
                                      BETWEEN %(lo)s AND %(hi)s)""", params))
    return gone, held


def held_not_listed_batches(conn: psycopg.Connection, run: RunRef, size: int, *, lo: int | None = None,
                            hi: int | None = None, sliced: bool = False) -> Iterator[list[tuple[str, Any]]]:
    """Those records' (identifier, stored datestamp), in keyset batches; the caller stages
    tombstones for them between batches (so they then count as staged)."""
    params = _held_params(run, lo, hi, sliced)
    while True:
        rows = conn.execute("SELECT r.identifier, r.datestamp " + _HELD_NOT_LISTED
                            + " ORDER BY r.identifier LIMIT %(size)s", {**params, "size": size}).fetchall()
        conn.commit()
        if not rows:
            return
        yield [(identifier, datestamp) for identifier, datestamp in rows]
        params["after"] = rows[-1][0]


def clear(conn: psycopg.Connection, run: RunRef) -> None:
    """Drop the check's ids (the audit row keeps the result)."""
    with conn.transaction():
        conn.execute("DELETE FROM reconcile_ids WHERE partner_id = %s AND run_id = ANY(%s)",
                     (run.partner_id, list(_keys(run))))
