"""Items staged by hand, for the store's own tests: a record, a run's staging, what is live."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from partner_harvest.records import HarvestItem, HarvestStats, Record
from partner_harvest.store import RunRef, StagingWriter, begin_run, finish_harvest
from partner_harvest.window import Window, WindowFacts

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def window(until: datetime, granularity: str = "seconds") -> Window:
    """An incremental window from the start up to ``until`` (oai_dc)."""
    return Window("incremental", None, until, granularity, True, WindowFacts(metadata_prefix="oai_dc"))


WINDOW = window(T0 + timedelta(days=10), "day")


def rec(ident: str, at: datetime, title: str = "t", sets: tuple[str, ...] = ()) -> Record:
    """An oai_dc record whose title is ``title`` (what ``live_titles`` reads back)."""
    return Record(ident, at, "oai_dc", f'<dc xmlns="urn:x"><title>{title}</title></dc>', sets, title)


def stage(conn: psycopg.Connection, partner: str, run_id: str, items: Sequence[HarvestItem], channel: str = "changes",
          window: Window = WINDOW, **writer_options: Any) -> HarvestStats:
    """``items`` as one harvested page of the run's channel, as the harvest would leave it
    (in the window's metadata prefix, oai_dc unless it names another)."""
    run = RunRef(partner, run_id, channel)
    begin_run(conn, run, window, window.protocol.metadata_prefix or "oai_dc")
    stats = HarvestStats(pages=1)
    for item in items:
        stats.add(item)
    StagingWriter(conn, run, **writer_options).write_page(list(items))
    finish_harvest(conn, run, stats)
    return stats


def live_titles(conn: psycopg.Connection, partner: str = "p") -> dict[str, str]:
    return dict(conn.execute("SELECT identifier, title FROM records WHERE partner_id = %s", (partner,)).fetchall())


def seed_sliced_run(conn: psycopg.Connection, partner_id: str, run_id: str) -> None:
    """A run cut into three slices, seen mid-way: one harvested, one 100 s into its try with
    2,000 of 10,000 records (its last page 3 s ago), one waiting for a pool slot."""
    rows = [  # channel, status, window_from, slice_set, pages, fetched, expected, since (s ago), last page (s ago)
        ("changes", "harvested", None, None, 0, 0, None, None, None),  # the parent of a sliced run
        ("changes/001", "harvested", None, "dept:prints", 20, 10_000, 10_000, 300, 200),
        ("changes/002", "harvesting", "2021-01-01T00:00:01Z", "dept:prints", 4, 2_000, 10_000, 100, 3),
        ("changes/003", "planned", None, "dept:paintings", 0, 0, 6_000, None, None),
    ]
    with conn.transaction():
        for channel, status, window_from, set_spec, pages, fetched, expected, since, last in rows:
            conn.execute(
                "INSERT INTO harvest_runs (partner_id, run_id, channel, mode, status, window_from, window_until,"
                " slice_set, pages, fetched, expected, attempts, started_at, harvesting_since, progress_at)"
                " VALUES (%s, %s, %s, 'full', %s, %s, '2026-01-01T00:00:00Z', %s, %s, %s, %s, 1, now() - interval '1 hour',"
                " now() - make_interval(secs => %s), now() - make_interval(secs => %s))",
                (partner_id, run_id, channel, status, window_from, set_spec, pages, fetched, expected, since, last),
            )


def as_record(item: object) -> Record:
    """`item`, which the test expects to be a record (not a tombstone, a reject or a header)."""
    assert isinstance(item, Record), item
    return item
