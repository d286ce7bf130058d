"""Attached records (a library's items and holdings) in the run's one apply transaction.

A staged item whose ``entity`` is set (records.Record.entity) lands in that table instead of
``records``: keyed by partner and identifier, with the records it belongs to (``bib_ids``)
and its JSON. The order of versions is the records' (``harvest_version_newer``: datestamp,
then observation), purges are remembered in ``attached_tombstones`` (I10) and logged in
``attached_deletions``; an unchanged version is a no-op (I2).

Every record whose attached rows changed (one landed, changed, moved to or from it, or was
purged) gets one row in ``attachment_events`` at a new ``change_seq``: the change feed's
event for it, once per record however many of its items changed (docs/consumers.md).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from partner_harvest.errors import HarvestError
from partner_harvest.store.db import scalar

if TYPE_CHECKING:
    from partner_harvest.store.runs import RunRef

ENTITIES = ("items", "holdings")  # the tables migration 0044 made; an entity names one

_BATCH = """
CREATE TEMP TABLE attached_batch ON COMMIT DROP AS
SELECT DISTINCT ON (s.entity, s.identifier) s.entity, s.kind, s.identifier, s.datestamp, s.observed_at,
       s.metadata, s.parents, s.content_hash, s.channel, s.warnings, s.reason,
       (%(regressed)s::jsonb ->> s.channel)::timestamptz AS regressed_clock
FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind IN ('R', 'T') AND s.entity IS NOT NULL
ORDER BY s.entity, s.identifier, s.datestamp DESC, s.observed_at DESC, s.seq DESC
"""

_UPSERT = """
WITH candidates AS (
    SELECT b.* FROM attached_batch b
    WHERE b.entity = %(entity)s AND b.kind = 'R' AND NOT EXISTS (
        SELECT 1 FROM attached_tombstones t
        WHERE t.partner_id = %(pid)s AND t.entity = %(entity)s AND t.identifier = b.identifier
          AND NOT harvest_version_newer(b.datestamp, b.observed_at, b.regressed_clock,
                                        t.datestamp, t.observed_at, t.regressed_clock))
), held AS (  -- the statement's snapshot: what each landing row belonged to before
    SELECT x.identifier, x.bib_ids FROM {table} x JOIN candidates c USING (identifier)
    WHERE x.partner_id = %(pid)s
), landed AS (
    INSERT INTO {table} AS x (partner_id, identifier, bib_ids, datestamp, content, content_hash, warnings,
                              run_id, observed_at, regressed_clock, change_seq)
    SELECT %(pid)s, c.identifier, COALESCE(c.parents, '{{}}'), c.datestamp, c.metadata::jsonb, c.content_hash,
           c.warnings, %(run)s, c.observed_at, c.regressed_clock, nextval('change_seq')
    FROM candidates c
    ON CONFLICT (partner_id, identifier) DO UPDATE SET
        bib_ids = EXCLUDED.bib_ids, datestamp = EXCLUDED.datestamp, content = EXCLUDED.content,
        content_hash = EXCLUDED.content_hash, warnings = EXCLUDED.warnings, run_id = EXCLUDED.run_id,
        observed_at = EXCLUDED.observed_at, regressed_clock = EXCLUDED.regressed_clock,
        change_seq = EXCLUDED.change_seq, harvested_at = now()
    WHERE harvest_version_newer(EXCLUDED.datestamp, EXCLUDED.observed_at, EXCLUDED.regressed_clock,
                                x.datestamp, x.observed_at, x.regressed_clock)
      AND (x.datestamp <> EXCLUDED.datestamp OR x.content_hash <> EXCLUDED.content_hash)
    RETURNING x.identifier, x.bib_ids
), superseded AS (
    DELETE FROM attached_tombstones t USING landed l
    WHERE t.partner_id = %(pid)s AND t.entity = %(entity)s AND t.identifier = l.identifier
), touched AS (
    INSERT INTO attached_touched
    SELECT unnest(l.bib_ids) FROM landed l
    UNION SELECT unnest(h.bib_ids) FROM held h JOIN landed l USING (identifier)
)
SELECT c.channel, count(*) FROM landed l JOIN candidates c USING (identifier) GROUP BY c.channel
"""

_PURGE = """
WITH gone AS (
    DELETE FROM {table} x USING attached_batch b
    WHERE b.entity = %(entity)s AND b.kind = 'T' AND x.partner_id = %(pid)s AND x.identifier = b.identifier
      AND NOT harvest_version_newer(x.datestamp, x.observed_at, x.regressed_clock,
                                    b.datestamp, b.observed_at, b.regressed_clock)
    RETURNING x.identifier, x.bib_ids, b.datestamp, b.channel, b.reason
), logged AS (
    INSERT INTO attached_deletions (partner_id, entity, identifier, bib_ids, upstream_datestamp, reason, run_id,
                                    change_seq)
    SELECT %(pid)s, %(entity)s, identifier, bib_ids, datestamp,
           COALESCE(reason, CASE WHEN starts_with(channel, 'reconcile') THEN 'reconcile' ELSE 'tombstone' END), %(run)s,
           nextval('change_seq')
    FROM gone
), remembered AS (
    INSERT INTO attached_tombstones AS t (partner_id, entity, identifier, datestamp, observed_at, run_id,
                                          regressed_clock)
    SELECT %(pid)s, %(entity)s, b.identifier, b.datestamp, b.observed_at, %(run)s, b.regressed_clock
    FROM attached_batch b
    WHERE b.entity = %(entity)s AND b.kind = 'T' AND NOT EXISTS (
        SELECT 1 FROM {table} x WHERE x.partner_id = %(pid)s AND x.identifier = b.identifier
          AND harvest_version_newer(x.datestamp, x.observed_at, x.regressed_clock,
                                    b.datestamp, b.observed_at, b.regressed_clock))
    ON CONFLICT (partner_id, entity, identifier) DO UPDATE SET
        datestamp = EXCLUDED.datestamp, observed_at = EXCLUDED.observed_at, run_id = EXCLUDED.run_id,
        regressed_clock = EXCLUDED.regressed_clock
    WHERE harvest_version_newer(EXCLUDED.datestamp, EXCLUDED.observed_at, EXCLUDED.regressed_clock,
                                t.datestamp, t.observed_at, t.regressed_clock)
), touched AS (
    INSERT INTO attached_touched SELECT unnest(bib_ids) FROM gone
)
SELECT channel, count(*) FROM gone GROUP BY channel
"""

# One event per record whose attached rows changed, at its newest change.
_EVENTS = """
INSERT INTO attachment_events (partner_id, identifier, change_seq, run_id)
SELECT %(pid)s, identifier, nextval('change_seq'), %(run)s FROM (SELECT DISTINCT identifier FROM attached_touched) d
ON CONFLICT (partner_id, identifier) DO UPDATE SET
    change_seq = EXCLUDED.change_seq, run_id = EXCLUDED.run_id, changed_at = now()
"""

_MAX_DATESTAMP = """
UPDATE harvest_runs h SET max_datestamp = GREATEST(h.max_datestamp, m.latest)
FROM (SELECT channel, max(datestamp) AS latest FROM attached_batch WHERE kind = 'R' GROUP BY channel) m
WHERE h.partner_id = %(pid)s AND h.run_id = %(run)s AND h.channel = m.channel
"""


def table(entity: str) -> sql.Identifier:
    """The table of ``entity``; an entity no migration made is an error, never a new table."""
    if entity not in ENTITIES:
        raise HarvestError("-", "apply", f"attached records of kind {entity!r}: the tables are {', '.join(ENTITIES)}")
    return sql.Identifier(entity)


def apply_attached(conn: psycopg.Connection, partner_id: str, run_id: str,
                   regressed: dict[str, str | None]) -> tuple[Counter[str], Counter[str]]:
    """Inside the apply's transaction, under its lock: the run's staged attached records
    into their tables, and their records' events. Returns (upserted, purged) per channel."""
    params = {"pid": partner_id, "run": run_id, "regressed": Jsonb(regressed)}
    conn.execute(_BATCH, params)
    entities = [row[0] for row in conn.execute("SELECT DISTINCT entity FROM attached_batch").fetchall()]
    upserted: Counter[str] = Counter()
    purged: Counter[str] = Counter()
    if not entities:
        conn.execute("DROP TABLE attached_batch")
        return upserted, purged
    conn.execute("CREATE INDEX ON attached_batch (identifier)")
    conn.execute("ANALYZE attached_batch (entity, kind, identifier)")
    conn.execute("CREATE TEMP TABLE attached_touched (identifier text) ON COMMIT DROP")
    for entity in entities:
        where = {**params, "entity": entity}
        upserted.update(dict(conn.execute(sql.SQL(_UPSERT).format(table=table(entity)), where).fetchall()))
        purged.update(dict(conn.execute(sql.SQL(_PURGE).format(table=table(entity)), where).fetchall()))
    conn.execute(_EVENTS, params)
    conn.execute(_MAX_DATESTAMP, params)
    conn.execute("DROP TABLE attached_touched")
    conn.execute("DROP TABLE attached_batch")
    return upserted, purged


def unlisted(conn: psycopg.Connection, run: RunRef, entity: str) -> tuple[int, list[tuple[str, datetime]]]:
    """How many ``entity`` rows the partner holds, and those the run channel ``run`` did not
    stage (a complete listing no longer returns them), with their held stamps."""
    with conn.transaction():
        held = scalar(conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE partner_id = %s").format(table(entity)),
                                   (run.partner_id,)))
        rows = conn.execute(sql.SQL(
            "SELECT x.identifier, x.datestamp FROM {} x WHERE x.partner_id = %s AND NOT EXISTS ("
            " SELECT 1 FROM staging s WHERE s.partner_id = %s AND s.run_id = %s AND s.channel = %s"
            " AND s.identifier = x.identifier) ORDER BY x.identifier").format(table(entity)),
            (run.partner_id, *run.key())).fetchall()
    return int(held), [(row[0], row[1]) for row in rows]


def high_water_sql() -> str:
    """The newest change_seq of the partner's attached rows and events (feed.mark_applied)."""
    parts = [f"(SELECT max(change_seq) FROM {name} WHERE partner_id = %(pid)s)" for name in ENTITIES]
    parts += ["(SELECT max(change_seq) FROM attached_deletions WHERE partner_id = %(pid)s)",
              "(SELECT max(change_seq) FROM attachment_events WHERE partner_id = %(pid)s)"]
    return ", ".join(parts)
