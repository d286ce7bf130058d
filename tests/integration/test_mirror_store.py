"""The mirror cannot silently diverge, at the store (I10).

Every test here failed on the store before it remembered tombstones, ordered versions by
(datestamp, observation), checked staged counts inside the apply and made every item
storable.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from partner_harvest.pipeline import apply_changes
from partner_harvest.records import HarvestItem, HarvestStats, Record, Rejected, Tombstone
from partner_harvest.store import RunRef, apply_run, begin_run, finish_harvest
from partner_harvest.store.apply import RunNotHarvested, StagingIncomplete
from partner_harvest.store.db import one, scalar
from partner_harvest.store.runs import abandon_stale_runs, fail_apply
from partner_harvest.window import Window, WindowFacts
from tests.support.records import T0, WINDOW, rec
from tests.support.records import live_titles as live
from tests.support.records import stage as stage_for


def stage(conn: psycopg.Connection, run_id: str, items: Sequence[HarvestItem], channel: str = "changes",
          partner: str = "p", window: Window = WINDOW, **writer_options: Any) -> HarvestStats:
    return stage_for(conn, partner, run_id, items, channel, window, **writer_options)


def status(conn: psycopg.Connection, run_id: str) -> tuple:
    return one(conn.execute("SELECT status, error FROM harvest_runs WHERE partner_id = 'p' AND run_id = %s"
                        " AND channel = 'changes'", (run_id,)))


# -- I10: the outcome does not depend on the order in which runs apply --------------

def test_a_late_apply_of_an_older_run_never_resurrects_a_purged_record(conn: psycopg.Connection) -> None:
    stage(conn, "old", [rec("x", T0, "v1")])           # harvested first, applied late
    stage(conn, "new", [Tombstone("x", T0 + timedelta(days=1))])
    apply_run(conn, "p", "new")
    late = apply_run(conn, "p", "old")
    assert live(conn) == {}
    assert late.upserted == 0 and late.unchanged == 1
    assert scalar(conn.execute("SELECT count(*) FROM deletions")) == 0  # nothing held when it was purged


def test_an_older_same_day_version_never_replaces_newer_content(conn: psycopg.Connection) -> None:
    """Day granularity: two versions stamped the same day; the later observation wins."""
    stage(conn, "morning", [rec("x", T0, "morning")])
    stage(conn, "evening", [rec("x", T0, "evening")])
    apply_run(conn, "p", "evening")
    apply_run(conn, "p", "morning")  # a cleared apply of the older run, days later
    assert live(conn) == {"x": "evening"}


def test_a_record_recreated_the_same_day_as_its_deletion_is_kept(conn: psycopg.Connection) -> None:
    """Deleted and re-created on day D (day granularity): the later observation is live."""
    stage(conn, "n1", [rec("x", T0, "v1")])
    apply_run(conn, "p", "n1")
    stage(conn, "n2", [Tombstone("x", T0)])
    stage(conn, "n3", [rec("x", T0, "v2")])
    apply_run(conn, "p", "n3")
    apply_run(conn, "p", "n2")
    assert live(conn) == {"x": "v2"}


def test_a_remembered_purge_yields_to_a_newer_version(conn: psycopg.Connection) -> None:
    stage(conn, "n1", [rec("x", T0, "v1")])
    apply_run(conn, "p", "n1")
    stage(conn, "n2", [Tombstone("x", T0 + timedelta(days=1))])
    apply_run(conn, "p", "n2")
    stage(conn, "n3", [rec("x", T0 + timedelta(days=2), "reborn")])
    assert apply_run(conn, "p", "n3").upserted == 1
    assert live(conn) == {"x": "reborn"}
    assert scalar(conn.execute("SELECT count(*) FROM tombstones")) == 0  # superseded memory is dropped


@pytest.mark.slow  # every apply order of several runs
def test_any_apply_order_gives_the_same_mirror(db: str) -> None:
    """I10 as a property: random versions staged in runs, applied in every order, agree."""
    from partner_harvest.store import connect, ensure_schema

    rng = random.Random(7)
    days = [T0 + timedelta(days=d) for d in range(3)]
    runs: list[list] = []
    for _ in range(4):
        items = []
        for ident in ("a", "b", "c", "d"):
            if rng.random() < 0.8:
                day = rng.choice(days)
                items.append(Tombstone(ident, day) if rng.random() < 0.35 else rec(ident, day, f"v{rng.randrange(100)}"))
        runs.append(items)
    outcomes = set()
    with connect(db) as conn:
        ensure_schema(conn)
        for order in itertools.permutations(range(len(runs))):
            conn.execute("TRUNCATE records, tombstones, deletions, harvest_runs, staging, quarantine")
            conn.commit()
            for index, items in enumerate(runs):  # observed in this order, whatever the apply order
                stage(conn, f"r{index}", items)
            for index in order:
                apply_run(conn, "p", f"r{index}")
            outcomes.add(tuple(sorted(live(conn).items())))
    assert len(outcomes) == 1, outcomes


def test_after_a_clock_jump_the_later_observation_wins_in_any_apply_order(db: str) -> None:
    """Versions stamped by a partner clock set back a day.

    Run ``before`` saw x edited and y live at the old clock; run ``after`` (its partner clock
    behind the highest one seen: ``clock_regressed``) saw x edited again and y deleted, both
    stamped a day EARLIER. Ordered by datestamp alone ``before`` won; now the later
    observation wins, whichever run applies first: z too (a failover to a server a day
    behind shows z's older version: that is what the partner holds now).
    """
    from partner_harvest.store import connect, ensure_schema

    jumped = Window("incremental", None, T0 + timedelta(days=2), "day", True,
                    WindowFacts(metadata_prefix="oai_dc", partner_clock="2026-03-03T00:00:00Z", clock_regressed=True))
    outcomes = []
    with connect(db) as conn:
        ensure_schema(conn)
        for order in (("before", "after"), ("after", "before")):
            conn.execute("TRUNCATE records, tombstones, deletions, harvest_runs, staging, quarantine")
            conn.commit()
            stage(conn, "before", [rec("x", T0 + timedelta(days=3), "old clock"), rec("y", T0 + timedelta(days=3)),
                                   rec("z", T0 + timedelta(days=3), "z new")])
            stage(conn, "after", [rec("x", T0 + timedelta(days=2), "new clock"), Tombstone("y", T0 + timedelta(days=2)),
                                  rec("z", T0 + timedelta(days=1), "z old")], window=jumped)
            for run_id in order:
                apply_run(conn, "p", run_id)
            outcomes.append(live(conn))
    assert outcomes == [{"x": "new clock", "z": "z old"}] * 2


# -- equal datestamps -------------------------------------------------------------------

def test_at_equal_datestamps_a_tombstone_beats_the_stored_version_it_follows(conn: psycopg.Connection) -> None:
    stage(conn, "n1", [rec("x", T0, "v1")])
    apply_run(conn, "p", "n1")
    stage(conn, "n2", [Tombstone("x", T0)])
    assert apply_run(conn, "p", "n2").purged == 1
    assert live(conn) == {}


# -- staging lost between harvest and apply -------------------------------------------------

def test_apply_refuses_when_staging_lost_what_the_harvest_recorded(conn: psycopg.Connection) -> None:
    stage(conn, "n1", [rec("x", T0), rec("y", T0)])
    conn.execute("TRUNCATE staging")  # what crash recovery does to an UNLOGGED table
    conn.commit()
    with pytest.raises(StagingIncomplete) as caught:
        apply_run(conn, "p", "n1")
    conn.rollback()
    assert caught.value.channels == {"changes": (0, 2)}
    assert "harvested again" in str(caught.value)
    assert status(conn, "n1")[0] == "harvested"  # never marked applied with 0 rows
    assert live(conn) == {}


def test_apply_harvests_lost_channels_again_then_applies(conn: psycopg.Connection) -> None:
    stage(conn, "n1", [rec("x", T0), rec("y", T0)])
    conn.execute("TRUNCATE staging")
    conn.commit()
    again: list[list[str]] = []

    def reharvest(channels: list[str]) -> None:
        again.append(channels)
        stage(conn, "n1", [rec("x", T0), rec("y", T0), rec("z", T0)])

    result = apply_changes(conn, "p", "n1", reharvest)
    assert again == [["changes"]]
    assert result.upserted == 3 and set(live(conn)) == {"x", "y", "z"}


def test_apply_refuses_a_run_whose_channel_is_still_harvesting(conn: psycopg.Connection) -> None:
    begin_run(conn, RunRef("p", "n1", "changes"), WINDOW, "oai_dc")
    with pytest.raises(RunNotHarvested):
        apply_run(conn, "p", "n1")


# -- what cannot be stored is quarantined, never blocks ------------

@pytest.mark.parametrize("bad, why", [
    (Record("nul\x00id", T0, "oai_dc", "<x/>"), "NUL"),
    (Record("x", T0, "oai_dc", "<x>a\x00b</x>"), "NUL"),
    (Record("x", T0, "oai_dc", "<x>\ud800</x>"), "surrogate"),
    (Record("x", T0, "oai_dc", "<x/>", (), "title \udfff"), "surrogate"),
    (Record("i" * 3000, T0, "oai_dc", "<x/>"), "longer than"),
    (Rejected("y\x00", "bad \x00 reason", "raw \ud800"), "NUL"),
])
def test_what_postgresql_cannot_store_is_quarantined_and_the_page_lands(conn: psycopg.Connection, bad: Record, why: str) -> None:
    stage(conn, "n1", [rec("good1", T0), bad, rec("good2", T0)])
    result = apply_run(conn, "p", "n1")
    assert set(live(conn)) == {"good1", "good2"}
    assert result.quarantined == 1 and result.fetched == 3
    reason, identifier = one(conn.execute("SELECT reason, identifier FROM quarantine"))
    assert why in reason
    assert "\x00" not in identifier and len(identifier.encode()) <= 1000


@pytest.mark.parametrize("item, why", [
    (Record("x", T0, "oai_dc", "<x>ü</x>", ("ü", 'q"uote', "back\\slash"), "ü"), None),
    (Record("x", T0, "oai_dc", "<x/>", ("a\x00",), "t"), "NUL"),
    (Record("x", T0, "oai_dc", "<x/>", ("\ud800",), "t"), "surrogate"),
    (Record("x", T0, "oai_dc", "<x>ü</x>", (), "t\x00"), "NUL"),
    (Record("é" * 500, T0, "oai_dc", "<x/>"), None),  # 1,000 bytes: the limit itself
    (Record("é" * 501, T0, "oai_dc", "<x/>"), "longer than"),
    (Record("x", T0, "oai_dc", "<x>" + "é" * 496 + "</x>"), None),  # 999 bytes, under 1,000
    (Record("x", T0, "oai_dc", "<x>" + "é" * 497 + "</x>"), "exceeds"),  # 1,001 bytes
])
def test_storable_decides_on_bytes_whatever_the_shortcut(item: Record, why: str | None) -> None:
    """A record that is plainly storable skips the detailed checks; at the limits and with
    non-ASCII text the decision must be the same as theirs (sizes count UTF-8 bytes)."""
    from partner_harvest.store.staging import storable

    kept = storable(item, max_record_bytes=1000)
    if why is None:
        assert kept is item
    else:
        assert isinstance(kept, Rejected) and why in kept.reason


def test_an_oversized_payload_is_quarantined_with_the_limit(conn: psycopg.Connection) -> None:
    big = Record("big", T0, "oai_dc", "<x>" + "a" * 5000 + "</x>")
    stage(conn, "n1", [rec("small", T0), big], max_record_bytes=1000)
    assert apply_run(conn, "p", "n1").quarantined == 1
    reason, raw = one(conn.execute("SELECT reason, raw_payload FROM quarantine"))
    assert "5007 bytes exceeds" in reason and "1000" in reason and "max_record_bytes" in reason
    assert set(live(conn)) == {"small"}


# -- a retried apply ----------------------------------------------------------------------

def test_a_retried_apply_clears_the_failure(conn: psycopg.Connection) -> None:
    stage(conn, "n1", [rec("x", T0)])
    fail_apply(conn, "p", "n1", "lock timeout")
    apply_run(conn, "p", "n1")
    assert status(conn, "n1") == ("applied", None)


def test_quarantine_current_forgets_a_reject_superseded_in_the_same_run(conn: psycopg.Connection) -> None:
    stage(conn, "n1", [Rejected("x", "no title", "<bad/>", T0), rec("x", T0 + timedelta(hours=1), "fixed")])
    apply_run(conn, "p", "n1")
    assert scalar(conn.execute("SELECT count(*) FROM quarantine_current")) == 0
    stage(conn, "n2", [Rejected("x", "no title", "<bad/>", T0 + timedelta(hours=2))])
    apply_run(conn, "p", "n2")
    assert conn.execute("SELECT identifier FROM quarantine_current").fetchall() == [("x",)]


def test_staging_of_abandoned_runs_is_dropped(conn: psycopg.Connection) -> None:
    stage(conn, "old", [rec("x", T0)])
    stage(conn, "fresh", [rec("y", T0)])
    conn.execute("UPDATE harvest_runs SET started_at = now() - interval '8 days' WHERE run_id = 'old'")
    conn.commit()
    assert abandon_stale_runs(conn, "p", timedelta(days=7)) == 1
    left: dict[str, int] = dict(conn.execute("SELECT run_id, count(*) FROM staging GROUP BY run_id").fetchall())
    assert left == {"fresh": 1}
    assert status(conn, "old")[0] == "abandoned"


def test_a_record_purged_by_a_reconcile_comes_back_when_the_partner_lists_it_again(conn: psycopg.Connection) -> None:
    """The vanished tombstone carries the stored version's datestamp, not the reconcile clock:
    a record restored upstream with its old datestamp is not blocked by the remembered purge."""
    from partner_harvest.store import reconcile as sweep_sql

    stage(conn, "n1", [rec("x", T0, "v1"), rec("y", T0, "v1")])
    apply_run(conn, "p", "n1")
    run = RunRef("p", "rec1", "reconcile")
    begin_run(conn, run, WINDOW, "oai_dc")
    sweep_sql.IdSweepWriter(conn, "p", "rec1").write_page([("y", T0, False)])  # x vanished upstream
    staged = sweep_sql.stage_removals(conn, run, first_seq=0)
    finish_harvest(conn, run, HarvestStats(pages=1, fetched=staged))
    assert apply_run(conn, "p", "rec1").purged == 1 and set(live(conn)) == {"y"}
    stage(conn, "n2", [rec("x", T0, "v1")])  # restored upstream, same datestamp and content
    apply_run(conn, "p", "n2")
    assert set(live(conn)) == {"x", "y"}


def test_run_figures_hold_what_the_run_left_even_after_a_later_run_applied(conn: psycopg.Connection) -> None:
    """The purge fraction of a run is weighed against what that run left (held + purged),
    not against whatever a later apply left by the time the check runs."""
    from partner_harvest.store.quality import run_figures

    stage(conn, "n1", [rec("a", T0), rec("b", T0), rec("c", T0)])
    apply_run(conn, "p", "n1")
    stage(conn, "n2", [rec("d", T0), rec("e", T0)])
    apply_run(conn, "p", "n2")
    assert (run_figures(conn, "p", "n1").held, run_figures(conn, "p", "n2").held) == (3, 5)
    with conn.transaction():  # a run applied before harvest_runs carried the figure: counted
        conn.execute("UPDATE harvest_runs SET records_held = NULL WHERE run_id = 'n1'")
    assert run_figures(conn, "p", "n1").held == 5


def test_run_figures_carry_the_failed_completeness_checks(conn: psycopg.Connection) -> None:
    from partner_harvest.store import record_check
    from partner_harvest.store.quality import run_figures

    stage(conn, "n1", [rec("x", T0)])
    record_check(conn, RunRef("p", "n1", "changes"), "oai-list-identifiers", 5, 1, False, "4 identifiers never came")
    apply_run(conn, "p", "n1")
    [line] = run_figures(conn, "p", "n1").failed_checks
    assert "oai-list-identifiers" in line and "says 5" in line and "4 identifiers never came" in line




def _believed(conn: psycopg.Connection, table: str, partner: str) -> int:
    plan = scalar(conn.execute(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE partner_id = %s", (partner,)))
    return plan[0]["Plan"]["Plan Rows"]


def _analyzed(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return scalar(conn.execute("SELECT pg_stat_get_analyze_count('records'::regclass)"))


def test_a_new_partners_next_apply_teaches_the_planner_its_size_before_its_anti_joins(conn: psycopg.Connection) -> None:
    """The planner knew none of a new partner's rows and ran the purge's anti-join as a nested
    loop over them all per tombstone (a 100,000-item first load applied in 135 s instead of
    6 s; benchmarks/apply_statistics.py). The first load itself anti-joins nothing, so it
    leaves the ANALYZE (1.0-1.3 s of a 200,000-item first load) to the partner's next apply,
    which checks the belief against partner_stats before its upsert."""
    conn.execute("ALTER TABLE records SET (autovacuum_enabled = false)")  # only the apply may analyze
    stage(conn, "other", [rec(f"o{i}", T0) for i in range(500)], partner="other")
    apply_run(conn, "other", "other")
    conn.execute("ANALYZE records")
    conn.commit()
    assert _believed(conn, "records", "p") <= 5
    analyzed = _analyzed(conn)
    stage(conn, "first", [rec(f"r{i}", T0) for i in range(3000)] + [Tombstone(f"d{i}", T0) for i in range(60)])
    result = apply_run(conn, "p", "first")
    assert (result.upserted, result.unchanged, len(live(conn))) == (3000, 60, 3000)
    conn.commit()
    assert (_analyzed(conn), _believed(conn, "records", "p") <= 5) == (analyzed, True)
    stage(conn, "night", [rec("r1", T0 + timedelta(days=1), "edited"), rec("new", T0)])  # no purge to check before
    result = apply_run(conn, "p", "night")
    assert (result.upserted, len(live(conn))) == (2, 3001)
    conn.commit()
    assert _analyzed(conn) == analyzed + 1
    assert _believed(conn, "records", "p") >= 1500


def test_a_nightly_apply_leaves_the_statistics_to_autovacuum(conn: psycopg.Connection) -> None:
    conn.execute("ALTER TABLE records SET (autovacuum_enabled = false)")
    stage(conn, "big", [rec(f"r{i}", T0) for i in range(3000)] + [Tombstone(f"d{i}", T0) for i in range(30)])
    apply_run(conn, "p", "big")
    stage(conn, "second", [rec("r0", T0 + timedelta(days=1), "edited")])
    apply_run(conn, "p", "second")
    conn.commit()
    analyzed = _analyzed(conn)
    assert _believed(conn, "records", "p") >= 1500  # the second apply taught the planner
    for night in range(2):
        stage(conn, f"night{night}", [rec("r1", T0 + timedelta(days=2 + night), f"edited {night}"),
                                      rec(f"new{night}", T0), Tombstone(f"r{2 + night}", T0 + timedelta(days=2))])
        apply_run(conn, "p", f"night{night}")
        conn.commit()
    assert _analyzed(conn) == analyzed
