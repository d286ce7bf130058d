"""Where an unfinished full load stopped, read from its own staging (no schema of its own).

A rate limit longer than a task may sleep reschedules the task; a killed worker leaves
the same picture. The export stages whole blocks in ascending id order, one block per
transaction, so what a try staged is a prefix of the export: the next try keeps it
(``begin_run(keep_staging=True)``) and resumes after its highest bib id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from partner_harvest.records import HarvestStats
from partner_harvest.store.runs import RunRef

if TYPE_CHECKING:
    from partner_harvest.adapters import StagingSink


@dataclass(frozen=True)
class Staged:
    """What a run channel's staging holds so far."""

    count: int
    records: int
    tombstones: int
    rejected: int
    max_seq: int
    max_id: int | None  # the highest numeric (Sierra) bib id staged


def staged_so_far(conn: psycopg.Connection, run: RunRef) -> Staged:
    row = conn.execute(
        """
        SELECT count(*), count(*) FILTER (WHERE kind = 'R'), count(*) FILTER (WHERE kind = 'T'),
               count(*) FILTER (WHERE kind = 'Q'), coalesce(max(seq), 0),
               max(CASE WHEN identifier ~ '^[0-9]{1,18}$' THEN identifier::bigint END)
        FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s
        """,
        run.key(),
    ).fetchone()
    conn.commit()
    assert row is not None
    return Staged(*row)


def resume_after(sink: StagingSink, stats: HarvestStats) -> Staged | None:
    """What an earlier try of this run channel staged, counted into ``stats`` and the sink's
    sequence so the resumed listing continues both; None: nothing (or no database sink)."""
    if sink.conn is None or sink.run is None:
        return None
    kept = staged_so_far(sink.conn, sink.run)
    if kept.count == 0:
        return None
    stats.fetched += kept.count
    stats.records += kept.records
    stats.tombstones += kept.tombstones
    stats.rejected += kept.rejected
    sink.seq = max(sink.seq, kept.max_seq)
    return kept
