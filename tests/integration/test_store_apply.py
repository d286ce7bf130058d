"""The store against real PostgreSQL: staging, one-transaction apply, I2/I3/I4/I6/I8."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.types.json import Jsonb

from partner_harvest.records import Record, Rejected, Tombstone
from partner_harvest.store import apply_run
from partner_harvest.store.db import one, scalar
from partner_harvest.window import Window, WindowFacts
from tests.support.records import rec as support_rec
from tests.support.records import stage as stage_for

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
WINDOW = Window("incremental", None, T0 + timedelta(days=10), "seconds", True, WindowFacts(metadata_prefix="oai_dc"))


def rec(ident: str, at: datetime, title: str = "t") -> Record:
    return support_rec(ident, at, title, ("s",))


def stage(conn: psycopg.Connection, partner: str, run_id: str, items: list, channel: str = "changes") -> None:
    stage_for(conn, partner, run_id, items, channel, WINDOW)


def live(conn: psycopg.Connection, partner: str) -> dict[str, tuple[datetime, str]]:
    rows = conn.execute(
        "SELECT identifier, datestamp, title FROM records WHERE partner_id = %s", (partner,)
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def audit(conn: psycopg.Connection, partner: str, run_id: str) -> dict:
    cur = conn.execute(
        "SELECT status, fetched, upserted, unchanged, purged, quarantined FROM harvest_runs"
        " WHERE partner_id = %s AND run_id = %s AND channel = 'changes'",
        (partner, run_id),
    )
    names = [d.name for d in cur.description or ()]
    return dict(zip(names, one(cur)))


def test_apply_upserts_purges_and_counts_add_up(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0), rec("c", T0)])
    first = apply_run(conn, "p", "r1")
    assert (first.upserted, first.unchanged, first.purged) == (3, 0, 0)

    items = [
        rec("a", T0 + timedelta(hours=1), "edited"),  # newer: lands
        Tombstone("b", T0 + timedelta(hours=1)),  # purges b
        Tombstone("zz", T0),  # never stored: nothing to purge
        Rejected("d", "empty title", "<record/>", T0, "oai_dc"),  # quarantined
        rec("c", T0),  # same version again: unchanged
    ]
    stage(conn, "p", "r2", items)
    second = apply_run(conn, "p", "r2")
    assert (second.upserted, second.purged, second.quarantined, second.unchanged) == (1, 1, 1, 2)
    assert second.fetched == 5 == second.upserted + second.unchanged + second.purged + second.quarantined
    assert live(conn, "p") == {"a": (T0 + timedelta(hours=1), "edited"), "c": (T0, "t")}
    assert audit(conn, "p", "r2") == {
        "status": "applied", "fetched": 5, "upserted": 1, "unchanged": 2, "purged": 1, "quarantined": 1,
    }
    deleted = conn.execute("SELECT identifier, upstream_datestamp, run_id, reason FROM deletions").fetchall()
    assert deleted == [("b", T0 + timedelta(hours=1), "r2", "tombstone")]
    held = conn.execute("SELECT identifier, reason, raw_payload, run_id FROM quarantine").fetchall()
    assert held == [("d", "empty title", "<record/>", "r2")]
    assert conn.execute("SELECT count(*) FROM staging").fetchone() == (0,)


def test_replaying_a_window_changes_nothing(conn: psycopg.Connection) -> None:
    items = [rec("a", T0), rec("b", T0 + timedelta(seconds=5)), Tombstone("c", T0)]
    stage(conn, "p", "r1", items)
    apply_run(conn, "p", "r1")
    before = conn.execute("SELECT identifier, datestamp, content_hash, harvested_at, run_id FROM records ORDER BY 1").fetchall()
    stage(conn, "p", "r2", items)
    replay = apply_run(conn, "p", "r2")
    after = conn.execute("SELECT identifier, datestamp, content_hash, harvested_at, run_id FROM records ORDER BY 1").fetchall()
    assert replay.upserted == 0 and replay.purged == 0 and replay.unchanged == 3
    assert before == after


def test_older_version_never_overwrites_newer(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0 + timedelta(days=1), "new")])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [rec("a", T0, "old")])
    result = apply_run(conn, "p", "r2")
    assert result.upserted == 0 and result.unchanged == 1
    assert live(conn, "p")["a"] == (T0 + timedelta(days=1), "new")


def test_same_datestamp_new_content_lands(conn: psycopg.Connection) -> None:
    """Day-granular repositories stamp two edits of one day alike: take the later harvest."""
    stage(conn, "p", "r1", [rec("a", T0, "morning")])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [rec("a", T0, "evening")])
    assert apply_run(conn, "p", "r2").upserted == 1
    assert live(conn, "p")["a"][1] == "evening"


def test_tombstone_older_than_stored_version_does_not_purge(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0 + timedelta(hours=2))])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [Tombstone("a", T0 + timedelta(hours=1))])
    result = apply_run(conn, "p", "r2")
    assert result.purged == 0 and result.unchanged == 1
    assert "a" in live(conn, "p")
    stage(conn, "p", "r3", [Tombstone("a", T0 + timedelta(hours=2))])  # same instant: deletion wins
    assert apply_run(conn, "p", "r3").purged == 1
    assert live(conn, "p") == {}


def test_duplicates_across_pages_keep_the_newest(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0 + timedelta(hours=1), "newer"), rec("a", T0, "older"), rec("a", T0, "older")])
    result = apply_run(conn, "p", "r1")
    assert result.fetched == 3 and result.upserted == 1 and result.unchanged == 2
    assert live(conn, "p")["a"][1] == "newer"


def test_partners_are_isolated(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("shared-id", T0, "mine")])
    apply_run(conn, "p", "r1")
    stage(conn, "q", "r1", [Tombstone("shared-id", T0 + timedelta(days=1)), rec("other", T0)])
    apply_run(conn, "q", "r1")
    assert live(conn, "p") == {"shared-id": (T0, "mine")}
    assert set(live(conn, "q")) == {"other"}


def test_failed_apply_leaves_nothing_half_applied(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0)])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [rec("a", T0 + timedelta(hours=1), "edited"), Tombstone("b", T0 + timedelta(hours=1))])
    # A trigger that fails on the purge's audit insert, after the upsert already ran.
    conn.execute(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'disk full (simulated)'; END $$"
    )
    conn.execute("CREATE TRIGGER boom BEFORE INSERT ON deletions FOR EACH ROW EXECUTE FUNCTION boom()")
    conn.commit()
    with pytest.raises(psycopg.errors.RaiseException):
        apply_run(conn, "p", "r2")
    conn.rollback()
    assert live(conn, "p") == {"a": (T0, "t"), "b": (T0, "t")}
    assert conn.execute("SELECT count(*) FROM staging WHERE run_id = 'r2'").fetchone() == (2,)
    conn.execute("DROP TRIGGER boom ON deletions")
    conn.commit()
    rerun = apply_run(conn, "p", "r2")
    assert (rerun.upserted, rerun.purged) == (1, 1)
    assert live(conn, "p") == {"a": (T0 + timedelta(hours=1), "edited")}


def test_schema_migrations_are_idempotent(db: str) -> None:
    """Every migration applies once, in number order, and a second run applies none. Up to 0019
    the list is written out (0015 and 0016 were never used); later ones are the files there."""
    from pathlib import Path

    import partner_harvest.store
    from partner_harvest.store import connect, ensure_schema

    folder = Path(partner_harvest.store.__file__).parent / "migrations"
    newer_migrations = sorted(p.name for p in folder.glob("*.sql") if int(p.name[:4]) > 19)
    assert "0024_host_pacing.sql" in newer_migrations
    with connect(db) as first:
        assert ensure_schema(first) == ["0001_initial.sql", "0002_reconcile_and_leases.sql", "0003_quarantine_current.sql",
                                      "0004_mirror.sql", "0005_quarantine_observed.sql", "0006_partner_stats.sql",
                                      "0007_change_feed.sql", "0008_partner_clock.sql", "0009_slices.sql",
                                      "0010_clock_regression.sql", "0011_drop_records_harvested_at_index.sql",
                                      "0012_slice_set.sql", "0013_record_warnings.sql", "0014_fences.sql",
                                      "0017_run_events.sql", "0018_comments.sql",
                                      "0019_version_order_after_a_clock_jump.sql",
                                      *newer_migrations]
        assert ensure_schema(first) == []
        tables = {r[0] for r in first.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"records", "deletions", "quarantine", "harvest_runs", "staging", "schema_migrations",
            "partner_leases", "reconcile_ids", "reconcile_slices"} <= tables


def test_quarantine_current_shows_what_is_still_broken(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [Rejected("a", "no title", "<a/>", T0, "oai_dc"), Rejected("b", "no title", "<b/>", T0, "oai_dc")])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [Rejected("a", "still no title", "<a2/>", T0, "oai_dc"), rec("b", T0 + timedelta(hours=1))])
    apply_run(conn, "p", "r2")
    current = conn.execute("SELECT identifier, reason, run_id FROM quarantine_current WHERE partner_id = 'p'").fetchall()
    assert current == [("a", "still no title", "r2")]  # b was fixed by a later valid version
    assert conn.execute("SELECT count(*) FROM quarantine").fetchone() == (3,)  # the log keeps all


@pytest.mark.parametrize("specs", [
    (), ("s",), ("a,b", "{braces}", 'say "hi"', "back\\slash", "tab\there", "new\nline", "NULL", "", "ünï ☃"),
])
def test_set_specs_land_exactly_as_the_partner_wrote_them(conn: psycopg.Connection, specs: tuple) -> None:
    """The staging COPY sends set specs as a binary text[] (once a text[] literal of its own);
    whatever a partner puts in a setSpec must come back unchanged."""
    record = Record("x", T0, "oai_dc", '<dc xmlns="urn:x"><title>t</title></dc>', specs, "t")
    stage(conn, "p", "r1", [record])
    apply_run(conn, "p", "r1")
    assert scalar(conn.execute("SELECT set_specs FROM records WHERE partner_id = 'p'")) == list(specs)


def test_the_batch_never_scans_harvest_runs_per_staged_row(conn: psycopg.Connection) -> None:
    """On stale staging statistics the planner ran the batch's join to harvest_runs as a
    scan of harvest_runs for every staged row (1.2 s per 200,000 rows); the regressed
    clocks are now read first and handed to the batch as a parameter."""
    from partner_harvest.store import apply

    for n in range(20):  # other runs' audit rows, as in any real database
        conn.execute("INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_until, status) "
                     "VALUES ('other', %s, 'changes', 'incremental', now(), 'applied')", (f"o{n}",))
    conn.execute("ANALYZE staging")
    conn.execute("ANALYZE harvest_runs")
    params = {"pid": "museum", "run": "r1", "regressed": Jsonb({})}
    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + apply._BATCH, params).fetchall())
    assert "harvest_runs" not in plan and "Nested Loop" not in plan, plan


def tombstones(conn: psycopg.Connection, partner: str) -> dict[str, datetime]:
    rows = conn.execute("SELECT identifier, datestamp FROM tombstones WHERE partner_id = %s", (partner,)).fetchall()
    return dict(rows)


def test_a_first_load_remembers_its_tombstones_and_a_reload_updates_and_purges(conn: psycopg.Connection) -> None:
    """A partner holding no records skips the update and the purge (nothing to match); its
    tombstones are still remembered, and the next apply updates and purges as always."""
    stage(conn, "q", "r1", [rec("c", T0, "another partner's")])  # same identifier elsewhere
    apply_run(conn, "q", "r1")
    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0), Tombstone("c", T0 + timedelta(hours=2))])
    first = apply_run(conn, "p", "r1")
    assert (first.upserted, first.unchanged, first.purged) == (2, 1, 0)
    assert live(conn, "p") == {"a": (T0, "t"), "b": (T0, "t")}
    assert tombstones(conn, "p") == {"c": T0 + timedelta(hours=2)}
    assert live(conn, "q") == {"c": (T0, "another partner's")}

    stage(conn, "p", "r2", [rec("a", T0 + timedelta(hours=1), "edited"), Tombstone("b", T0 + timedelta(hours=1)),
                            rec("c", T0 + timedelta(hours=1), "older than its tombstone")])
    second = apply_run(conn, "p", "r2")
    assert (second.upserted, second.purged, second.unchanged) == (1, 1, 1)
    assert live(conn, "p") == {"a": (T0 + timedelta(hours=1), "edited")}
    assert tombstones(conn, "p") == {"b": T0 + timedelta(hours=1), "c": T0 + timedelta(hours=2)}


def test_a_partner_whose_records_were_all_purged_keeps_its_tombstones_in_force(conn: psycopg.Connection) -> None:
    """Holding no records but remembered tombstones: an older record stays out, a newer
    tombstone replaces the remembered one, an older one does not."""
    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0)])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [Tombstone("a", T0 + timedelta(hours=2)), Tombstone("b", T0 + timedelta(hours=2))])
    assert apply_run(conn, "p", "r2").purged == 2
    assert live(conn, "p") == {}
    stage(conn, "p", "r3", [rec("a", T0 + timedelta(hours=1), "older"), Tombstone("b", T0 + timedelta(hours=3)),
                            Tombstone("a", T0 + timedelta(hours=1)), rec("n", T0, "new")])
    third = apply_run(conn, "p", "r3")
    assert (third.upserted, third.purged, third.unchanged) == (1, 0, 3)
    assert live(conn, "p") == {"n": (T0, "new")}
    assert tombstones(conn, "p") == {"a": T0 + timedelta(hours=2), "b": T0 + timedelta(hours=3)}


def test_the_apply_leaves_work_mem_as_it_found_it(conn: psycopg.Connection) -> None:
    """The batch's sort gets a bigger work_mem; no later statement (nor the caller) is
    planned under it."""
    stage(conn, "p", "r1", [rec("a", T0), Tombstone("b", T0)])
    conn.execute("SET work_mem = '3MB'")
    with conn.transaction():
        apply_run(conn, "p", "r1")
        assert scalar(conn.execute("SHOW work_mem")) == "3MB"
    assert scalar(conn.execute("SHOW work_mem")) == "3MB"


def test_a_statement_failing_under_the_sort_budget_raises_its_own_error(conn: psycopg.Connection) -> None:
    """Restoring work_mem on an aborted transaction would fail too and hide the cause."""
    from partner_harvest.store.apply import _work_mem

    with pytest.raises(psycopg.errors.DivisionByZero):
        with conn.transaction(), _work_mem(conn, "96MB"):
            conn.execute("SELECT 1 / 0")
    assert scalar(conn.execute("SHOW work_mem")) != "96MB"


def test_an_up_to_date_schema_is_checked_without_the_migration_lock(db: str) -> None:
    """Every task calls ensure_schema: on an up-to-date database it only reads, so it neither
    waits for the advisory lock a migrating session holds nor runs DDL."""
    from partner_harvest.store import connect, ensure_schema
    from partner_harvest.store.schema import _LOCK_KEY

    with connect(db) as setup:
        ensure_schema(setup)
        setup.commit()
    with connect(db, autocommit=True) as migrating, connect(db) as task:
        migrating.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        task.execute("SET lock_timeout = '1s'")
        assert ensure_schema(task) == []
        migrating.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
