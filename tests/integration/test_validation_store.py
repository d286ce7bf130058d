"""Warnings travel with their records: staged, stored on ``records``, counted per check on
``harvest_runs``, against real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from partner_harvest.formats.checks import Finding
from partner_harvest.records import Record, Rejected
from partner_harvest.store import apply_run
from partner_harvest.store.db import scalar
from partner_harvest.store.health import warnings_today
from partner_harvest.window import Window, WindowFacts
from tests.support.records import stage as support_stage

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
WINDOW = Window("incremental", None, T0 + timedelta(days=10), "seconds", True, WindowFacts(metadata_prefix="marc21"))
NO_001 = Finding("marc.no_001", "MARC: no control number (001)")
REBUILT = Finding("marc.leader_rebuilt", "MARC: leader empty (24 characters expected): rebuilt as '00000nam a2200000uu 4500'")


def rec(ident: str, at: datetime, *warnings: Finding) -> Record:
    return Record(ident, at, "marc21", f'<record xmlns="urn:x"><t>{ident}</t></record>', (), f"t {ident}", warnings)


def stage(conn: psycopg.Connection, run_id: str, items: list) -> None:
    support_stage(conn, "p", run_id, items, window=WINDOW)


def test_warnings_are_stored_with_the_record_and_counted_per_check(conn: psycopg.Connection) -> None:
    stage(conn, "r1", [rec("a", T0, NO_001), rec("b", T0, NO_001, REBUILT), rec("c", T0),
                       Rejected("d", "MARC: no title (245 $a)", "<record/>", T0, "marc21")])
    result = apply_run(conn, "p", "r1")
    assert (result.upserted, result.quarantined) == (3, 1)
    stored: dict[str, Any] = dict(conn.execute("SELECT identifier, warnings FROM records WHERE partner_id = 'p'").fetchall())
    assert stored == {"a": {"marc.no_001": NO_001.message},
                      "b": {"marc.no_001": NO_001.message, "marc.leader_rebuilt": REBUILT.message}, "c": None}
    counted = scalar(conn.execute("SELECT warnings FROM harvest_runs WHERE run_id = 'r1'"))
    assert counted == {"marc.no_001": 2, "marc.leader_rebuilt": 1}
    assert warnings_today(conn, "p", datetime.now(timezone.utc)) == [("marc.no_001", 2), ("marc.leader_rebuilt", 1)]

    # A newer version without the oddity clears its warning; an unchanged one keeps it.
    stage(conn, "r2", [rec("a", T0 + timedelta(hours=1)), rec("b", T0, NO_001, REBUILT)])
    apply_run(conn, "p", "r2")
    stored = dict(conn.execute("SELECT identifier, warnings FROM records WHERE partner_id = 'p'").fetchall())
    assert stored["a"] is None and set(stored["b"]) == {"marc.no_001", "marc.leader_rebuilt"}
    assert scalar(conn.execute("SELECT warnings FROM harvest_runs WHERE run_id = 'r2'")) == {
        "marc.no_001": 1, "marc.leader_rebuilt": 1}


def test_a_run_without_warnings_counts_none(conn: psycopg.Connection) -> None:
    stage(conn, "r1", [rec("a", T0)])
    apply_run(conn, "p", "r1")
    assert scalar(conn.execute("SELECT warnings FROM harvest_runs WHERE run_id = 'r1'")) == {}


def test_run_figures_carry_the_warnings_and_those_of_the_previous_run(conn: psycopg.Connection) -> None:
    from partner_harvest.store.quality import run_figures

    stage(conn, "r1", [rec("a", T0, NO_001)])
    apply_run(conn, "p", "r1")
    first = run_figures(conn, "p", "r1")
    assert first.warnings == {"marc.no_001": 1} and first.previous_warnings is None
    stage(conn, "r2", [rec("b", T0, REBUILT)])
    apply_run(conn, "p", "r2")
    second = run_figures(conn, "p", "r2")
    assert second.warnings == {"marc.leader_rebuilt": 1} and second.previous_warnings == frozenset({"marc.no_001"})
