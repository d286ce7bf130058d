"""Merging a run's staging into the live tables in ONE transaction (I2, I3, I4, I6, I10, I12).

The order of versions: every version of a record (a live record or a tombstone) carries
its upstream ``datestamp`` and the time we ``observed`` it (staged it). Versions are
ordered by ``(datestamp, observed_at)``: a newer datestamp always wins; at equal
datestamps (a day-granular repository edited twice in a day) the later observation
wins. Against a stored record of the same key a tombstone wins (a deletion is never
older than what it deletes).

Each identifier's state is the greatest version ever applied, so the outcome does not
depend on the order in which runs apply (I10): purges are remembered in ``tombstones``
with their key, and a late apply of an older run can neither resurrect a purged record
nor replace newer content. A re-seen version with the same datestamp and content is a
no-op (I2).

Before it merges anything the apply checks that what is staged for every channel equals
what the harvest recorded (I12): ``staging`` is UNLOGGED, so a database crash or a
failover empties it, and an apply over an empty staging would silently skip the window.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from partner_harvest.errors import HarvestError
from partner_harvest.store import content, feed, fences, moves, run_batch
from partner_harvest.store.attached import apply_attached
from partner_harvest.store.db import one, scalar
from partner_harvest.store.partner_stats import update_partner_stats

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


class StagingIncomplete(HarvestError):
    """Staging no longer holds what the harvest recorded (a crash emptied it): harvest again.

    ``channels`` names the channels to harvest again; nothing was applied.
    """

    def __init__(self, partner_id: str, run_id: str, channels: dict[str, tuple[int, int]]):
        self.channels = channels
        detail = ", ".join(f"{c}: {staged} staged, {fetched} harvested" for c, (staged, fetched) in sorted(channels.items()))
        super().__init__(
            partner_id, f"apply of run {run_id}",
            f"staging does not hold what the harvest recorded ({detail}); "
            "the database lost it (crash, immediate shutdown or failover) — the window must be harvested again",
        )


class RunNotHarvested(HarvestError):
    """A channel of the run is still harvesting or failed: applying now would lose it."""


# ``regressed`` maps each channel whose partner clock went back to that clock (a few
# channels at most, read first): joining harvest_runs here instead was planned as a scan of
# it per staged row whenever staging's statistics were stale (1.2 s per 200,000 rows).
_BATCH = """
CREATE TEMP TABLE apply_batch ON COMMIT DROP AS
SELECT DISTINCT ON (s.identifier) s.kind, s.identifier, s.datestamp, s.observed_at, s.metadata_prefix,
       s.metadata, s.set_specs, s.title, s.content_hash, s.channel, s.warnings, s.reason,
       (%(regressed)s::jsonb ->> s.channel)::timestamptz AS regressed_clock
FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind IN ('R', 'T') AND s.entity IS NULL
ORDER BY s.identifier, s.datestamp DESC, s.observed_at DESC, s.seq DESC
"""

# The batch's DISTINCT ON sorts the run's whole staging (about 1 KB a row) by identifier. At
# the server's default work_mem (4 MB) a 200,000-item first load spilled about 170 MB to
# disk and read it back; this budget (per sorting process: parallel workers sort a share
# each) keeps such a sort in memory. A bigger run still spills, as before.
_SORT_MEMORY = "96MB"

_REGRESSED_CLOCKS = """
SELECT channel, partner_clock FROM harvest_runs
WHERE partner_id = %(pid)s AND run_id = %(run)s AND clock_regressed
"""

# A record lands when it is newer than the stored record and than any remembered tombstone.
# Stored records are updated, new ones inserted: two statements instead of one
# INSERT .. ON CONFLICT, whose speculative insertion probes the key twice per row (a first
# load of 190,000 records: 4.0 s of backend CPU instead of 5.3 s). The partner's apply lock
# keeps other applies from inserting between the two; anything else that did would fail the
# insert on the key (and the apply would be retried), never merge silently.
# A data-modifying CTE runs exactly once whether or not the outer query reads it.
_NOT_BEATEN_BY_A_TOMBSTONE = """NOT EXISTS (
    SELECT 1 FROM tombstones t
    WHERE t.partner_id = %(pid)s AND t.identifier = b.identifier
      AND NOT harvest_version_newer(b.datestamp, b.observed_at, b.regressed_clock,
                                    t.datestamp, t.observed_at, t.regressed_clock))"""

# Both writes end alike: tombstones a landed record supersedes go, and what landed is
# counted per channel ({tally}).
_LANDED_TAIL = """), superseded AS (
    DELETE FROM tombstones t USING landed l
    WHERE t.partner_id = %(pid)s AND t.identifier = l.identifier
)
{tally}
"""

# The version a change ends goes to record_history (kept for the partner's history_retention,
# store/history.py): what an update replaced, with the change that replaced it. The UPDATE
# reads the replaced row through a second reference ``o``, which sees the statement's snapshot.
HISTORY_COLUMNS = """partner_id, identifier, datestamp, metadata_prefix, metadata, set_specs, title, content_hash,
    warnings, first_harvested_at, harvested_at, run_id, observed_at, regressed_clock, change_seq,
    superseded_seq, superseded_by, ended_by"""
_OLD_VERSION = """o.datestamp, o.metadata_prefix, o.metadata, o.set_specs, o.title, o.content_hash, o.warnings,
    o.first_harvested_at, o.harvested_at, o.run_id, o.observed_at, o.regressed_clock, o.change_seq"""
_VERSION = """datestamp, metadata_prefix, metadata, set_specs, title, content_hash, warnings,
    first_harvested_at, harvested_at, run_id, observed_at, regressed_clock, change_seq"""

_UPDATE = """
WITH landed AS (
UPDATE records r SET
    datestamp = b.datestamp, metadata_prefix = b.metadata_prefix, metadata = b.metadata,
    set_specs = b.set_specs, title = b.title, content_hash = b.content_hash, warnings = b.warnings, harvested_at = now(),
    run_id = %(run)s, observed_at = b.observed_at, change_seq = nextval('change_seq'),
    regressed_clock = b.regressed_clock
FROM apply_batch b, records o
WHERE b.kind = 'R' AND r.partner_id = %(pid)s AND r.identifier = b.identifier
  AND o.partner_id = r.partner_id AND o.identifier = r.identifier
  AND harvest_version_newer(b.datestamp, b.observed_at, b.regressed_clock,
                            r.datestamp, r.observed_at, r.regressed_clock)
  AND (r.datestamp <> b.datestamp OR r.content_hash <> b.content_hash)
  AND """ + _NOT_BEATEN_BY_A_TOMBSTONE + """
RETURNING r.identifier, r.change_seq AS superseded_seq, """ + _OLD_VERSION + """
), kept AS (
INSERT INTO record_history (""" + HISTORY_COLUMNS + """)
SELECT %(pid)s, identifier, """ + _VERSION + """, superseded_seq, %(run)s, 'updated' FROM landed
""" + _LANDED_TAIL

# The batch's records as new rows of the partner (both inserts below).
_INSERT_BATCH_RECORDS = """
WITH landed AS (
INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata,
                     set_specs, title, content_hash, warnings, run_id, observed_at, change_seq, regressed_clock)
SELECT %(pid)s, b.identifier, b.datestamp, b.metadata_prefix, b.metadata, b.set_specs, b.title,
       b.content_hash, b.warnings, %(run)s, b.observed_at, nextval('change_seq'), b.regressed_clock
FROM apply_batch b
WHERE b.kind = 'R'"""

_INSERT = _INSERT_BATCH_RECORDS + """
  AND NOT EXISTS (SELECT 1 FROM records r WHERE r.partner_id = %(pid)s AND r.identifier = b.identifier)
  AND """ + _NOT_BEATEN_BY_A_TOMBSTONE + """
RETURNING identifier
""" + _LANDED_TAIL
# Per channel, what landed. A run of one channel (most runs) needs no join back to the batch.
_TALLY_ONE_CHANNEL = "SELECT %(channel)s, count(*) FROM landed"
_TALLY_BY_CHANNEL = "SELECT b.channel, count(*) FROM landed JOIN apply_batch b USING (identifier) GROUP BY b.channel"

# What the partner holds before the apply: any record, any remembered tombstone, and the
# records counted by the applies (partner_stats), which the statistics check reads instead of
# counting the partner's rows. Which path the apply takes rests on the rows themselves, not
# on that counter: a wrong path would land what a stored version should have beaten.
_HOLDS = """
SELECT EXISTS (SELECT 1 FROM records WHERE partner_id = %(pid)s),
       EXISTS (SELECT 1 FROM tombstones WHERE partner_id = %(pid)s),
       COALESCE((SELECT records_held FROM partner_stats WHERE partner_id = %(pid)s), 0)
"""

# A partner that holds nothing (a first load, or a load after the partner was forgotten) can
# have no stored record to update and no tombstone to lose to, and the batch holds one row per
# identifier: every record lands. So it is a plain INSERT in the batch's identifier order,
# without the anti-joins (a 200,000-item first load: about a second less), counted per
# channel from the batch itself ({tally}).
_INSERT_ALL = _INSERT_BATCH_RECORDS + """
RETURNING 1
)
{tally}
"""
_TALLY_BATCH_BY_CHANNEL = "SELECT channel, count(*) FROM apply_batch WHERE kind = 'R' GROUP BY channel"

# Tombstones are remembered unless a stored record beats them ({unbeaten}).
_REMEMBER = """remembered AS (
    INSERT INTO tombstones AS t (partner_id, identifier, datestamp, observed_at, run_id, regressed_clock)
    SELECT %(pid)s, b.identifier, b.datestamp, b.observed_at, %(run)s, b.regressed_clock
    FROM apply_batch b
    WHERE b.kind = 'T'{unbeaten}
    ON CONFLICT (partner_id, identifier) DO UPDATE SET
        datestamp = EXCLUDED.datestamp, observed_at = EXCLUDED.observed_at, run_id = EXCLUDED.run_id,
        regressed_clock = EXCLUDED.regressed_clock
    WHERE harvest_version_newer(EXCLUDED.datestamp, EXCLUDED.observed_at, EXCLUDED.regressed_clock,
                                t.datestamp, t.observed_at, t.regressed_clock)
)"""

_NOT_BEATEN_BY_A_RECORD = """ AND NOT EXISTS (
        SELECT 1 FROM records r
        WHERE r.partner_id = %(pid)s AND r.identifier = b.identifier
          AND harvest_version_newer(r.datestamp, r.observed_at, r.regressed_clock,
                                    b.datestamp, b.observed_at, b.regressed_clock))"""

# A partner that held no record before the apply has nothing to purge, and no record of it
# can beat a tombstone: its only records are what this apply inserted, the batch's 'R' rows,
# and the batch holds one row per identifier. So it only remembers, without probing records
# (a hash anti-join over the whole records table: 0.5 s of a 200,000-item first load).
_REMEMBER_ONLY = "WITH " + _REMEMBER.format(unbeaten="") + " SELECT 1"

# All CTEs see the snapshot taken before the statement: ``remembered`` skips exactly the
# tombstones that lose to a stored record, i.e. those ``gone`` did not delete.
_PURGE = """
WITH gone AS (
    DELETE FROM records r
    USING apply_batch b
    WHERE b.kind = 'T' AND r.partner_id = %(pid)s AND r.identifier = b.identifier
      AND NOT harvest_version_newer(r.datestamp, r.observed_at, r.regressed_clock,
                                    b.datestamp, b.observed_at, b.regressed_clock)
    RETURNING r.identifier, b.datestamp AS deleted_stamp, b.channel, b.reason, nextval('change_seq') AS seq,
              """ + _OLD_VERSION.replace("o.", "r.") + """
), logged AS (
    INSERT INTO deletions (partner_id, identifier, upstream_datestamp, run_id, reason, change_seq)
    SELECT %(pid)s, identifier, deleted_stamp, %(run)s,
           COALESCE(reason, CASE WHEN channel = 'reconcile' THEN 'reconcile' ELSE 'tombstone' END), seq
    FROM gone
), kept AS (
    INSERT INTO record_history (""" + HISTORY_COLUMNS + """)
    SELECT %(pid)s, identifier, """ + _VERSION + """, seq, %(run)s, 'purged' FROM gone
), """ + _REMEMBER.format(unbeaten=_NOT_BEATEN_BY_A_RECORD) + """
SELECT channel, count(*) FROM gone GROUP BY channel
"""

_QUARANTINE = """
WITH held AS (
INSERT INTO quarantine (partner_id, identifier, datestamp, metadata_prefix, reason,
                        raw_payload, run_id, observed_at)
SELECT %(pid)s, identifier, datestamp, metadata_prefix, reason, metadata, %(run)s, observed_at
FROM staging
WHERE partner_id = %(pid)s AND run_id = %(run)s AND kind = 'Q'
ORDER BY seq
RETURNING run_id
)
SELECT s.channel, count(*) FROM staging s
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind = 'Q'
GROUP BY s.channel
"""

# The latest stamp each channel applied (store/runs.clock_high_water): records only, since
# tombstone stamps may be synthetic (Sierra's end of the deletion day, a reconcile's copy).
_MAX_DATESTAMP = """
UPDATE harvest_runs h SET max_datestamp = m.latest
FROM (SELECT channel, max(datestamp) AS latest FROM apply_batch WHERE kind = 'R' GROUP BY channel) m
WHERE h.partner_id = %(pid)s AND h.run_id = %(run)s AND h.channel = m.channel
"""

_COUNT_STAGED = """
SELECT channel, count(*), count(*) FILTER (WHERE kind = 'T' AND entity IS NULL), count(*) FILTER (WHERE kind = 'Q'),
       count(*) FILTER (WHERE warnings IS NOT NULL), count(*) FILTER (WHERE entity IS NOT NULL) FROM staging
WHERE partner_id = %(pid)s AND run_id = %(run)s GROUP BY channel
"""

# Per channel and check, the fetched records that carried its warning (harvest_runs.warnings),
# as _QUARANTINE counts the rejects: what was fetched, whether or not it changed a stored record.
_WARNINGS = """
SELECT s.channel, w.check_name, count(*) FROM staging s, jsonb_object_keys(s.warnings) AS w(check_name)
WHERE s.partner_id = %(pid)s AND s.run_id = %(run)s AND s.kind = 'R' AND s.warnings IS NOT NULL
GROUP BY s.channel, w.check_name
"""

_HARVESTED = """
SELECT channel, fetched, harvested_at IS NOT NULL, status FROM harvest_runs
WHERE partner_id = %(pid)s AND run_id = %(run)s
"""


def lock_partner_writes(conn: psycopg.Connection, partner_id: str) -> None:
    """The partner's apply lock, until the transaction ends: whatever writes its records
    and change feed (an apply, ``admin.forget_partner``) does so one at a time."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('apply:' || %s))", (partner_id,))


def apply_run(conn: psycopg.Connection, partner_id: str, run_id: str) -> ApplyResult:
    """Apply every staged channel of the run atomically and record it in the audit."""
    params = {"pid": partner_id, "run": run_id}
    with conn.transaction():
        # One apply per partner at a time: a backfill and the nightly run may overlap. A
        # bounded wait turns a stuck apply elsewhere into an error (and a retry) here.
        conn.execute("SET LOCAL lock_timeout = '30min'")
        lock_partner_writes(conn, partner_id)
        # Under the lock, before anything is read or written: the run still holds its lease
        # and no operator command changed the partner since it was planned (store/fences.py).
        fences.check(conn, f"apply of run {run_id}")
        staged = _check_staged(conn, partner_id, run_id)
        fetched = staged.per_channel
        regressed = {channel: clock.isoformat() if clock else None
                     for channel, clock in conn.execute(_REGRESSED_CLOCKS, params).fetchall()}
        holds_records, holds_tombstones, records_held = one(conn.execute(_HOLDS, params))
        # A sliced run merged its slices as they ended (store/run_batch.py): its batch is ready.
        prepared = run_batch.prepare(conn, partner_id, run_id, fetched,
                                     joins=holds_records or holds_tombstones or staged.attached > 0)
        if not prepared:
            with _work_mem(conn, _SORT_MEMORY):
                conn.execute(_BATCH, {**params, "regressed": Jsonb(regressed)})
            # A fresh temp table has no statistics; without them the planner may nest-loop the
            # purge over the whole batch for every stored record (minutes instead of seconds).
            conn.execute("CREATE INDEX ON apply_batch (identifier)")
            conn.execute("ANALYZE apply_batch (kind, identifier)")  # the joins' columns, not the payloads
        one_channel = len(fetched) == 1
        tally_params = {**params, "channel": next(iter(fetched), None)}
        updated: dict[str, int] = {}
        moved: dict[str, int] = {}
        if holds_records and moves.move_chosen(conn, partner_id, run_id):  # a person answered Move
            moved = moves.apply_moves(conn, partner_id, run_id, _OLD_VERSION, HISTORY_COLUMNS, _VERSION)
            log.info("%s: run %s moved %d records to new identifiers", partner_id, run_id, sum(moved.values()))
        if holds_records or holds_tombstones:
            tally = _TALLY_ONE_CHANNEL if one_channel else _TALLY_BY_CHANNEL
            if holds_tombstones:
                _know_partner_rows(conn, "tombstones", partner_id)
            if holds_records:
                _know_partner_rows(conn, "records", partner_id, records_held)
                updated = dict(conn.execute(_UPDATE.format(tally=tally), tally_params).fetchall())
            inserted: dict[str, int] = dict(conn.execute(_INSERT.format(tally=tally), tally_params).fetchall())
        else:
            tally = _TALLY_ONE_CHANNEL if one_channel else _TALLY_BATCH_BY_CHANNEL
            inserted = dict(conn.execute(_INSERT_ALL.format(tally=tally), tally_params).fetchall())
        upserted = Counter(updated) + Counter(inserted) + Counter(moved)
        purged: dict[str, int] = {}
        if staged.tombstones:
            if holds_records:
                # This apply's own inserts count too: a big incremental may have doubled the partner.
                _know_partner_rows(conn, "records", partner_id, records_held + sum(inserted.values()))
                purged = dict(conn.execute(_PURGE, params).fetchall())
            else:
                conn.execute(_REMEMBER_ONLY, params)
        record_purges = sum(purged.values())
        if staged.attached:  # items and holdings: their own tables, the same transaction
            landed, gone = apply_attached(conn, partner_id, run_id, regressed)
            upserted += landed
            purged = dict(Counter(purged) + gone)
        quarantined: dict[str, int] = dict(conn.execute(_QUARANTINE, params).fetchall()) if staged.rejects else {}
        warnings: dict[str, dict[str, int]] = {}
        if staged.warned:
            for channel, check_name, n in conn.execute(_WARNINGS, params).fetchall():
                warnings.setdefault(channel, {})[check_name] = n
        update_partner_stats(conn, partner_id, run_id, sum(inserted.values()) - record_purges)
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
        _audit(conn, partner_id, run_id, per_channel, warnings, moved)
        conn.execute(_MAX_DATESTAMP, params)
        conn.execute(content.REFRESHED, params)  # a content refresh that applies settles what asked for it
        # Under the lock, in this transaction: the change feed's high water (store/feed.py).
        feed.mark_applied(conn, partner_id, run_id)
        conn.execute("DELETE FROM staging WHERE partner_id = %(pid)s AND run_id = %(run)s", params)
        conn.execute("DROP VIEW apply_batch" if prepared else "DROP TABLE apply_batch")
    if prepared:
        run_batch.discard(conn, partner_id, run_id)
    total = ApplyResult(*(sum(getattr(r, f) for r in per_channel.values()) for f in ApplyResult.__dataclass_fields__))
    log.info("%s: applied run %s: %s", partner_id, run_id, total.as_dict())
    if warnings:
        landed_with: Counter[str] = Counter()
        for per_check in warnings.values():
            landed_with.update(per_check)
        log.info("%s: run %s: records with warnings, per check: %s", partner_id, run_id, dict(sorted(landed_with.items())))
    return total


@contextmanager
def _work_mem(conn: psycopg.Connection, size: str) -> Iterator[None]:
    """``work_mem`` at ``size`` for the statements inside, back to what it was after: no other
    statement of the apply is planned under the bigger budget. Not restored when a statement
    fails: the setting is local to the transaction, which is then rolled back anyway (and a
    statement on the aborted transaction would hide the real error)."""
    prior = scalar(conn.execute("SELECT current_setting('work_mem')"))
    conn.execute("SELECT set_config('work_mem', %s, true)", (size,))
    yield
    conn.execute("SELECT set_config('work_mem', %s, true)", (prior,))


def _know_partner_rows(conn: psycopg.Connection, table: str, partner_id: str, held: int | None = None) -> None:
    """ANALYZE ``table`` when the planner believes the partner holds far fewer rows than it does.

    The anti-joins of the upsert and the purge are planned on that belief. A new partner is
    in no statistics and a mass deletion leaves pages but no rows; believing "one row", the
    planner ran the anti-join as a nested loop over all of the partner's rows for every
    batch row: a 50,000-item first load applied in 29-35 s instead of 4 s, a 100,000-item
    one in 135 s (benchmarks/apply_statistics.py). ``held``: the rows the partner holds when
    known without counting (records: partner_stats); else at most ten times the belief
    (plus 1,000) rows are counted, so a nightly apply never pays for an ANALYZE it does not
    need. ANALYZE counts this transaction's own new rows.

    A first load does not analyze: it has nothing to anti-join against (``_INSERT_ALL``), and
    the partner's next apply checks here before its own anti-joins (autovacuum has often
    analyzed by then; a 200,000-item first load spent 1.0-1.3 s on it).
    """
    table_name = sql.Identifier(table)
    plan = scalar(conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE partner_id = %s").format(table_name),
                        (partner_id,)))
    believed = int(plan[0]["Plan"]["Plan Rows"])
    limit = 10 * believed + 1000
    counted = held is None  # counted up to the limit: the partner holds at least that many
    if held is None:
        held = scalar(conn.execute(sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE partner_id = %s LIMIT %s) held")
                            .format(table_name), (partner_id, limit)))
    if held < limit:
        return
    log.info("%s: the statistics of %s believe the partner holds %d rows, it holds %s%d: analyzing",
             partner_id, table, believed, "at least " if counted else "", held)
    conn.execute(sql.SQL("ANALYZE {} (partner_id)").format(table_name))  # the belief; payloads cost time


@dataclass(frozen=True)
class _Staged:
    """What the run staged: items per channel, and whether any are tombstones or rejects
    (a purge or a quarantine statement over none still scans the run's staging)."""

    per_channel: dict[str, int]
    tombstones: int
    rejects: int
    warned: int = 0  # staged records carrying warnings
    attached: int = 0  # staged items and holdings (store/attached.py)


def _check_staged(conn: psycopg.Connection, partner_id: str, run_id: str) -> _Staged:
    """Per channel, what is staged must equal what the harvest recorded (I12); returns it."""
    params = {"pid": partner_id, "run": run_id}
    counted = conn.execute(_COUNT_STAGED, params).fetchall()
    staged = {channel: n for channel, n, *_ in counted}
    harvested = conn.execute(_HARVESTED, params).fetchall()
    unfinished = [f"{channel} ({status})" for channel, _, done, status in harvested if not done]
    if unfinished:
        raise RunNotHarvested(partner_id, f"apply of run {run_id}",
                              f"channel(s) {', '.join(sorted(unfinished))} did not finish harvesting; nothing was applied")
    recorded = {channel: fetched for channel, fetched, _, _ in harvested}
    lost = {
        channel: (staged.get(channel, 0), recorded.get(channel, 0))
        for channel in set(staged) | set(recorded)
        if staged.get(channel, 0) != recorded.get(channel, 0)
    }
    if lost:
        raise StagingIncomplete(partner_id, run_id, lost)
    return _Staged({channel: recorded[channel] for channel in recorded},
                   sum(row[2] for row in counted), sum(row[3] for row in counted), sum(row[4] for row in counted),
                   sum(row[5] for row in counted))


def _audit(conn: psycopg.Connection, partner_id: str, run_id: str, per_channel: dict[str, ApplyResult],
           warnings: dict[str, dict[str, int]] | None = None, moved: dict[str, int] | None = None) -> None:
    """Close every harvested channel of the run with its own outcome counts (and warnings per check)."""
    for channel, result in per_channel.items():
        conn.execute(
            """
            UPDATE harvest_runs SET upserted = %s, unchanged = %s, purged = %s, quarantined = %s,
                warnings = %s, moved = %s, status = 'applied', applied_at = now(), error = NULL
            WHERE partner_id = %s AND run_id = %s AND channel = %s
            """,
            (result.upserted, result.unchanged, result.purged, result.quarantined,
             Jsonb((warnings or {}).get(channel, {})), (moved or {}).get(channel, 0), partner_id, run_id, channel),
        )
