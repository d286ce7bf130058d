"""The completeness check's id-set comparisons never plan a nested loop over staging.

staging has no index on identifier; on statistics taken while a sibling slice was still
staging, the planner ran the comparison as a nested loop: a check with nothing missing
took 70 s per slice of 47,500 bibs instead of 0.2 s (benchmarks/sierra_sliced_load.py).
"""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg

from partner_harvest.records import Record
from partner_harvest.store import RunRef, StagingWriter, begin_run, completeness
from partner_harvest.store.db import scalar
from partner_harvest.window import Window, WindowFacts

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def test_still_missing_compares_by_hashing_on_stale_statistics(conn: psycopg.Connection) -> None:
    run = RunRef("lib", "r1", "changes/001")
    begin_run(conn, run, Window("full", None, T0, "seconds", True, WindowFacts()), "marc21")
    conn.execute("ANALYZE staging")  # the statistics see no row of this channel yet
    conn.commit()
    ids = [str(1_000_000 + i) for i in range(3000)]
    StagingWriter(conn, run).write_page([Record(i, T0, "marc21", "<record/>", (), None) for i in ids])
    listed = completeness.listed_ids_writer(conn, run)
    listed.write_page([(i, None, False) for i in ids + ["999"]])
    conn.commit()
    params = {"pid": "lib", "run": "r1", "channel": "changes/001", "listed": "r1/changes/001/completeness:listed",
              "sample": 20}
    with conn.transaction():
        unguarded = "\n".join(r[0] for r in conn.execute("EXPLAIN " + completeness.STILL_MISSING, params).fetchall())
    assert "Nested Loop" in unguarded  # the trap is real on these statistics
    with conn.transaction():
        completeness._no_nested_loops(conn)
        guarded = "\n".join(r[0] for r in conn.execute("EXPLAIN " + completeness.STILL_MISSING, params).fetchall())
    assert "Nested Loop" not in guarded, guarded
    assert completeness.still_missing(conn, run) == (1, ["999"])
    assert scalar(conn.execute("SHOW enable_nestloop")) == "on"  # the setting ended with its transaction
