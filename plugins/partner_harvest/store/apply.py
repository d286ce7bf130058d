"""Merging a run's staging into the live tables in ONE transaction (I2, I3, I4, I6).

Order of truth inside a run: for each identifier the newest datestamp wins, and at equal
datestamps the later-fetched item wins. Against the live table an upsert lands only if
it is newer than what is stored (or the same datestamp with different content: a
day-granular repository edited twice in a day); a tombstone purges only a stored version
that is not newer than the tombstone.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import psycopg

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApplyResult:
    """What one apply did; the four outcomes add up to ``fetched`` (I6)."""

    fetched: int
    upserted: int
    unchanged: int
    purged: int
    quarantined: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


_BATCH = """
CREATE TEMP TABLE apply_batch ON COMMIT DROP AS
SELECT DISTINCT ON (identifier) kind, identifier, datestamp, metadata_prefix, metadata,
       set_specs, title, content_hash, channel
FROM staging
WHERE partner_id = %(pid)s AND run_id = %(run)s AND kind IN ('R', 'T')
ORDER BY identifier, datestamp DESC, seq DESC
"""

_UPSERT = """
WITH landed AS (
INSERT INTO records AS r (partner_id, identifier, datestamp, metadata_prefix, metadata,
                          set_specs, title, content_hash, run_id)
SELECT %(pid)s, identifier, datestamp, metadata_prefix, metadata, set_specs, title,
       content_hash, %(run)s
FROM apply_batch WHERE kind = 'R'
ON CONFLICT (partner_id, identifier) DO UPDATE SET
    datestamp = EXCLUDED.datestamp, metadata_prefix = EXCLUDED.metadata_prefix,
    metadata = EXCLUDED.metadata, set_specs = EXCLUDED.set_specs, title = EXCLUDED.title,
    content_hash = EXCLUDED.content_hash, harvested_at = now(), run_id = EXCLUDED.run_id
WHERE r.datestamp < EXCLUDED.datestamp
   OR (r.datestamp = EXCLUDED.datestamp AND r.content_hash <> EXCLUDED.content_hash)
RETURNING r.identifier
)
SELECT b.channel, count(*) FROM landed JOIN apply_batch b USING (identifier) GROUP BY b.channel
"""

_PURGE = """
WITH gone AS (
    DELETE FROM records r
    USING apply_batch b
    WHERE b.kind = 'T' AND r.partner_id = %(pid)s AND r.identifier = b.identifier
      AND r.datestamp <= b.datestamp
    RETURNING r.identifier, b.datestamp, b.channel
), logged AS (
    INSERT INTO deletions (partner_id, identifier, upstream_datestamp, run_id, reason)
    SELECT %(pid)s, identifier, datestamp, %(run)s,
           CASE WHEN channel = 'reconcile' THEN 'reconcile' ELSE 'tombstone' END
    FROM gone
)
SELECT channel, count(*) FROM gone GROUP BY channel
"""

# A data-modifying CTE runs exactly once whether or not the outer query reads it.
_QUARANTINE = """
WITH held AS (
INSERT INTO quarantine (partner_id, identifier, datestamp, metadata_prefix, reason,
                        raw_payload, run_id)
SELECT %(pid)s, identifier, datestamp, metadata_prefix, reason, metadata, %(run)s
FROM staging
WHERE partner_id = %(pid)s AND run_id = %(run)s AND kind = 'Q'
ORDER BY seq
RETURNING run_id
)
SELECT s.channel, count(*) FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind = 'Q'
GROUP BY s.channel
"""

_COUNT_STAGED = """
SELECT channel, count(*) FROM staging
WHERE partner_id = %(pid)s AND run_id = %(run)s GROUP BY channel
"""


def apply_run(conn: psycopg.Connection, partner_id: str, run_id: str) -> ApplyResult:
    """Apply every staged channel of the run atomically and record it in the audit."""
    params = {"pid": partner_id, "run": run_id}
    with conn.transaction():
        # One apply per partner at a time: a backfill and the nightly run may overlap. A
        # bounded wait turns a stuck apply elsewhere into an error (and a retry) here.
        conn.execute("SET LOCAL lock_timeout = '30min'")
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('apply:' || %s))", (partner_id,))
        fetched = dict(conn.execute(_COUNT_STAGED, params).fetchall())
        conn.execute(_BATCH, params)
        # A fresh temp table has no statistics; without them the planner may nest-loop the
        # purge over the whole batch for every stored record (minutes instead of seconds).
        conn.execute("CREATE INDEX ON apply_batch (identifier)")
        conn.execute("ANALYZE apply_batch")
        upserted = dict(conn.execute(_UPSERT, params).fetchall())
        purged = dict(conn.execute(_PURGE, params).fetchall())
        quarantined = dict(conn.execute(_QUARANTINE, params).fetchall())
        per_channel = {
            channel: ApplyResult(
                fetched=n,
                upserted=upserted.get(channel, 0),
                unchanged=n - upserted.get(channel, 0) - purged.get(channel, 0) - quarantined.get(channel, 0),
                purged=purged.get(channel, 0),
                quarantined=quarantined.get(channel, 0),
            )
            for channel, n in fetched.items()
        }
        _audit(conn, partner_id, run_id, per_channel)
        conn.execute("DELETE FROM staging WHERE partner_id = %(pid)s AND run_id = %(run)s", params)
        conn.execute("DROP TABLE apply_batch")
    total = ApplyResult(*(sum(getattr(r, f) for r in per_channel.values()) for f in ApplyResult.__dataclass_fields__))
    log.info("%s: applied run %s: %s", partner_id, run_id, total.as_dict())
    return total


def _audit(conn: psycopg.Connection, partner_id: str, run_id: str, per_channel: dict[str, ApplyResult]) -> None:
    """Close every harvested channel of the run with its own outcome counts."""
    for channel, result in per_channel.items():
        conn.execute(
            """
            UPDATE harvest_runs SET upserted = %s, unchanged = %s, purged = %s, quarantined = %s
            WHERE partner_id = %s AND run_id = %s AND channel = %s
            """,
            (result.upserted, result.unchanged, result.purged, result.quarantined,
             partner_id, run_id, channel),
        )
    conn.execute(
        "UPDATE harvest_runs SET status = 'applied', applied_at = now()"
        " WHERE partner_id = %s AND run_id = %s AND status = 'harvested'",
        (partner_id, run_id),
    )
