"""Lanes and the run's batch: a sliced run cut finer than its lanes, each lane taking
slice after slice (store/slices.claim), each slice merged into the run's batch as it ends
(store/run_batch.py); the apply reads the batch, or builds it again from staging when a slice
was harvested again after its merge or the database lost it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from include.simulators.loopback import Response
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest import run as recipe
from partner_harvest.errors import PartnerHttpError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.records import HarvestItem, Record, Tombstone
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, connect, run_batch
from partner_harvest.store.db import scalar
from partner_harvest.store.slices import claim, slice_rows
from partner_harvest.store.staging import StagingWriter
from partner_harvest.window import Window
from tests.support.db import held
from tests.support.partners import oai_partner

SLICES = {"threshold_records": 300, "target_records": 150, "max_slices": 3}


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "MIN_PIECE_RECORDS", 10)  # cut finer than the lanes, even at 900 records


@pytest.fixture
def oai() -> Iterator[tuple[OaiSimulator, SimulatedRepository]]:
    repo = SimulatedRepository(records=900, page_size=50, seed=9, deleted_fraction=0.05)
    with OaiSimulator(repo) as sim:
        yield sim, repo


def planned(conn: psycopg.Connection, sim: OaiSimulator,
            run_id: str = "run-1") -> tuple[Partner, Window, list[dict[str, Any]]]:
    partner = oai_partner(slicing=SLICES, pool_slots=3, retries=0)
    adapter = build_adapter(partner, Endpoint(sim.base_url))
    window = recipe.freeze(partner, adapter, conn, request=pipeline.RunRequest("full"))
    lanes = recipe.plan(partner, adapter, conn, run_id, window)
    return partner, window, lanes


def rows(conn: psycopg.Connection, partner_id: str, run_id: str = "run-1") -> dict[str, dict[str, Any]]:
    return {r["channel"]: r for r in slice_rows(conn, partner_id, run_id) if r["channel"] != "changes"}


def test_lanes_take_the_slices_between_them_and_the_merged_batch_applies_exactly(db: str, conn: psycopg.Connection,
                                                                               oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = oai
    partner, window, lanes = planned(conn, sim)
    assert [piece["lane"] for piece in lanes] == [1, 2, 3]
    slices = rows(conn, partner.id)
    assert len(slices) > len(lanes)  # cut finer than the lanes: the last slices taken are small
    errors: list[BaseException] = []

    def lane(number: int) -> None:  # each lane a task of its own: its own connection and adapter
        try:
            with connect(db) as own:
                recipe.stage_lane(build_adapter(partner, Endpoint(sim.base_url)), own, "run-1", window, number,
                                  merging=lambda: connect(db))  # as the task merges: beside the next slice
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(n,)) for n in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    slices = rows(conn, partner.id)
    assert all(r["attempts"] == 1 and r["lane"] in (1, 2, 3) for r in slices.values()), slices  # each slice once
    assert all(r["merged_attempt"] == 1 for r in slices.values())
    applied = recipe.apply(conn, partner.id, "run-1", window, recipe.Kept(), None)
    assert held(conn, partner.id) == repo.live_identifiers()
    assert applied.fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())
    assert applied.upserted == len(repo.live_identifiers())  # a first load: every live record lands once
    assert scalar(conn.execute("SELECT count(*) FROM run_batch")) == 0  # dropped once applied
    conn.commit()


def test_a_lane_retried_takes_its_failed_slice_again_then_the_rest(conn: psycopg.Connection,
                                                                   oai: tuple[OaiSimulator, SimulatedRepository],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sim, repo = oai
    partner, window, _ = planned(conn, sim)
    adapter = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    original, lists = sim.handle_oai, {"n": 0}

    def fail_once(pairs: list[tuple[str, str]]) -> Response:  # the third list page answers 503 once, inside lane 1's first slice
        if any(k == "verb" and v == "ListRecords" for k, v in pairs):
            lists["n"] += 1
            if lists["n"] == 3:
                sim.fail_next(1, status=503)
        return original(pairs)

    monkeypatch.setattr(sim, "handle_oai", fail_once)
    with pytest.raises(PartnerHttpError):
        recipe.stage_lane(adapter(), conn, "run-1", window, 1)
    monkeypatch.setattr(sim, "handle_oai", original)
    failed = [c for c, r in rows(conn, partner.id).items() if r["status"] == "failed"]
    assert len(failed) == 1 and rows(conn, partner.id)[failed[0]]["lane"] == 1
    recipe.stage_lane(adapter(), conn, "run-1", window, 2)  # another lane takes the rest, never the failed slice
    assert rows(conn, partner.id)[failed[0]]["status"] == "failed"
    seen: list[str] = []
    recipe.stage_lane(adapter(), conn, "run-1", window, 1, on_slice=lambda channel, _: seen.append(channel))
    assert seen == failed  # the retry takes its own slice again
    assert rows(conn, partner.id)[failed[0]]["attempts"] == 2
    recipe.apply(conn, partner.id, "run-1", window, recipe.Kept(), None)
    assert held(conn, partner.id) == repo.live_identifiers()


@pytest.mark.parametrize("how", ["harvested again", "lost"])
def test_a_stale_or_lost_batch_is_built_again_from_staging(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository],
                                                           how: str) -> None:
    sim, repo = oai
    partner, window, _ = planned(conn, sim)
    adapter = lambda: build_adapter(partner, Endpoint(sim.base_url))  # noqa: E731
    recipe.stage_lane(adapter(), conn, "run-1", window, 1)  # one lane takes every slice
    if how == "harvested again":  # a slice cleared after its merge: the batch holds its earlier try
        gone = [i for (i,) in conn.execute("SELECT identifier FROM staging WHERE channel = 'changes/002'"
                                           " AND kind = 'R' ORDER BY identifier LIMIT 3")]
        conn.commit()
        repo.delete_ids(gone)  # deleted since: restamped past the window, so the second try never sees them
        recipe.stage_channel(adapter(), conn, "run-1", window, "changes/002")
        assert rows(conn, partner.id)["changes/002"]["merged_attempt"] == 1
    else:  # a crash empties the UNLOGGED batch (staging survives in this test)
        conn.execute("TRUNCATE run_batch")
        conn.commit()
    applied = recipe.apply(conn, partner.id, "run-1", window, recipe.Kept(), None)
    assert held(conn, partner.id) == repo.live_identifiers()
    assert applied.fetched == sum(r["fetched"] for r in rows(conn, partner.id).values())


def test_the_batch_merged_slice_by_slice_is_the_apply_s_own_choice_of_versions(conn: psycopg.Connection) -> None:
    """Merged channel by channel, in any order, the batch holds per identifier the version the
    apply's sort of the whole staging picks: newest datestamp, then the later observation."""
    day = datetime(2025, 6, 1, tzinfo=timezone.utc)
    versions: dict[str, list[HarvestItem]] = {
        "changes/001": [Record("a", day, "oai_dc", "<a v1/>"), Record("b", day + timedelta(days=2), "oai_dc", "<b v3/>"),
                        Tombstone("c", day)],
        "changes/002": [Record("a", day + timedelta(days=1), "oai_dc", "<a v2/>"), Record("b", day, "oai_dc", "<b v1/>"),
                        Record("c", day, "oai_dc", "<c v1/>")],  # same stamp as c's tombstone: observed later
        "changes/003": [Record("b", day + timedelta(days=1), "oai_dc", "<b v2/>"), Record("d", day, "oai_dc", "<d/>")],
    }
    conn.execute("INSERT INTO harvest_runs (partner_id, run_id, channel, mode, window_until, granularity, status,"
                 " attempts, harvested_at) SELECT 'p', 'r', c, 'full', now(), 'day', 'harvested', 1, now()"
                 " FROM unnest(%s::text[]) AS c", (["changes", *versions],))
    conn.commit()
    for channel, items in versions.items():
        writer = StagingWriter(conn, RunRef("p", "r", channel))
        writer.write_page(items)
    for channel in ("changes/003", "changes/001", "changes/002"):
        run_batch.merge(conn, RunRef("p", "r", channel))
    merged: dict[str, str] = dict(conn.execute("SELECT identifier, channel FROM run_batch").fetchall())
    picked: dict[str, str] = dict(conn.execute(
        "SELECT DISTINCT ON (identifier) identifier, channel FROM staging WHERE kind IN ('R', 'T')"
        " ORDER BY identifier, datestamp DESC, observed_at DESC, seq DESC").fetchall())
    conn.commit()
    assert merged == picked == {"a": "changes/002", "b": "changes/001", "c": "changes/002", "d": "changes/003"}


def test_a_slice_taken_but_not_begun_stays_its_lanes(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """Between a lane's claim and its slice's first write the slice is still planned: another
    lane takes the next one, and the first lane's retry takes its own again."""
    sim, _ = oai
    partner, _, _ = planned(conn, sim)
    first = claim(conn, partner.id, "run-1", 1)
    second = claim(conn, partner.id, "run-1", 2)
    assert first and second and first != second
    assert claim(conn, partner.id, "run-1", 1) == first  # a retry of lane 1 before its slice began


def _batch_analyzed(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")  # this session's counts of the merges, read below
    conn.commit()
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return scalar(conn.execute("SELECT pg_stat_get_analyze_count('run_batch'::regclass)"))


def test_the_last_lane_and_a_first_load_leave_the_batch_s_statistics_alone(
        conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """Statistics serve the apply's joins against held rows: the lane that ends last (no slice of
    the run still harvesting) leaves them to the apply, and a first load's apply, which joins
    against nothing held, does not refresh them (0.1-0.2 s each of a 200,000-record run)."""
    sim, repo = oai
    partner, window, _ = planned(conn, sim)
    conn.execute("ALTER TABLE run_batch SET (autovacuum_enabled = false)")  # only the lanes and the apply analyze
    conn.commit()
    analyzed = _batch_analyzed(conn)
    recipe.stage_lane(build_adapter(partner, Endpoint(sim.base_url)), conn, "run-1", window, 1)  # the only lane
    assert _batch_analyzed(conn) == analyzed
    recipe.apply(conn, partner.id, "run-1", window, recipe.Kept(), None)
    assert held(conn, partner.id) == repo.live_identifiers()
    assert _batch_analyzed(conn) == analyzed
