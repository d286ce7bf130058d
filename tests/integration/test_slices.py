"""Sliced runs without Airflow: plan, harvest piece by piece, apply whole.

The OAI-PMH and Sierra simulators over loopback, real PostgreSQL. The harness plays the
DAG: freeze_window, plan_slices, one harvest_changes per piece (in any order, any one of
them failing and retried on its own), apply_changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any
from unittest import mock

import psycopg
import pytest

from include.simulators.loopback import Response
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from include.simulators.sierra.server import Headers
from partner_harvest import pipeline
from partner_harvest.errors import HarvestError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.parse import format_datestamp
from partner_harvest.records import HarvestItem
from partner_harvest.registry import Partner
from partner_harvest.store import connect
from partner_harvest.store.apply import RunNotHarvested, apply_run
from partner_harvest.store.db import one
from partner_harvest.store.slices import slice_rows
from tests.support.db import held
from tests.support.harness import PieceRun as Run
from tests.support.partners import oai_partner as _oai_partner
from tests.support.partners import sierra_partner as _sierra_partner

SLICES = {"threshold_records": 300, "target_records": 150, "max_slices": 6}
KEY, SECRET = "slice-key", "slice-secret"


def oai_partner(**kw: Any) -> Partner:
    return _oai_partner(**{"slicing": SLICES, **kw})


def sierra_partner(**kw: Any) -> Partner:
    options = {"sierra": {"server_error_backoff": 0.01, "server_error_tries": 2, "suppressed": "keep"},
               "export": {"limit": 50, "rate_limit_wait": 0}}
    return _sierra_partner(**{"slicing": SLICES, "options": options, **kw})


def applied_exactly_once(conn: psycopg.Connection, run: Run, repo: SimulatedRepository) -> None:
    """The run applies the live set, every item fetched once, each slice proven by its own
    completeListSize (I12; a slice of one page has none: its list announces no size)."""
    result = run.apply()
    assert held(conn, run.partner.id) == repo.live_identifiers()
    assert result.fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())  # nothing twice
    rows = conn.execute("SELECT channel, check_kind, check_ok, pages FROM harvest_runs WHERE run_id = %s",
                        (run.run_id,)).fetchall()
    conn.commit()
    checks = {channel: (kind, ok, pages) for channel, kind, ok, pages in rows}
    for piece in run.pieces:
        kind, ok, pages = checks[piece["channel"]]
        assert (kind, ok) == ("oai-complete-list-size", True) or (kind is None and pages == 1), (piece, kind, ok)


@pytest.fixture
def oai() -> Iterator[tuple[OaiSimulator, SimulatedRepository]]:
    repo = SimulatedRepository(records=900, page_size=50, seed=9, deleted_fraction=0.05)
    with OaiSimulator(repo) as sim:
        yield sim, repo


@pytest.fixture
def sierra() -> Iterator[tuple[SierraSimulator, SimulatedCatalogue]]:
    catalogue = SimulatedCatalogue(bibs=700, deleted_fraction=0.03, seed=5)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        yield sim, catalogue


def list_pages(sim: OaiSimulator) -> int:
    return sum(1 for r in sim.requests if r.get("verb") == "ListRecords")


def test_oai_full_harvest_as_slices_equals_the_live_set(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = oai
    partner = oai_partner()
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    channels = [p["channel"] for p in run.pieces]
    assert 4 <= len(channels) <= SLICES["max_slices"] and channels[0] == "changes/001"
    rows = run.rows()
    assert rows["changes"]["status"] == "harvested" and rows["changes"]["fetched"] == 0  # the parent
    assert {rows[c]["status"] for c in channels} == {"planned"}
    # datestamp ranges covering the frozen window, the first open at the start, each starting
    # where the one before ends (the boundary second in both: tests/integration/test_slice_boundaries.py)
    bounds = [(rows[c]["window_from"], rows[c]["window_until"]) for c in channels]
    assert bounds[0][0] is None and bounds[-1][1] == run.window.until
    for (_, end), (start, _) in zip(bounds, bounds[1:]):
        assert start == end

    with pytest.raises(RunNotHarvested, match="changes/00"):  # I4: nothing applies before every slice harvested
        pipeline.apply_changes(conn, partner.id, run.run_id)
    assert held(conn, partner.id) == set()

    for channel in reversed(channels):  # order does not matter
        run.harvest(channel)
    fetched = {c: run.rows()[c]["fetched"] for c in channels}
    assert max(fetched.values()) <= 2 * min(fetched.values()) + 50, fetched  # similar sizes
    result = run.apply()
    assert held(conn, partner.id) == repo.live_identifiers()
    assert result.fetched == sum(fetched.values())
    assert {r["status"] for r in run.rows().values()} == {"applied"}
    checks = conn.execute("SELECT channel, check_kind, check_ok FROM harvest_runs WHERE run_id = %s"
                          " AND check_kind IS NOT NULL", (run.run_id,)).fetchall()
    conn.commit()
    assert {c for c, kind, ok in checks if kind == "oai-complete-list-size" and ok} == set(channels)  # I12, per slice
    assert pipeline.last_applied_until(conn, partner.id, "changes") == run.window.until  # coverage reads the parent


TYPE_SETS = ("type:painting", "type:print", "type:sculpture")  # every simulated record is of one type


def test_oai_full_harvest_sliced_by_the_registry_sets_equals_the_live_set(conn: psycopg.Connection,
                                                                          oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """slicing.sets: one slice per set, each listing its set over the whole window; the
    sets' counts were checked against the whole list's before the plan trusted them."""
    sim, repo = oai
    partner = oai_partner(slicing={**SLICES, "sets": TYPE_SETS, "threshold_records": 400,  # no set above the target
                                   "target_records": 400})  # (the registry wants target <= threshold)
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    assert [(p["channel"], p["set"]) for p in run.pieces] == [
        ("changes/001", "type:painting"), ("changes/002", "type:print"), ("changes/003", "type:sculpture")]
    rows = run.rows()
    for piece in run.pieces:
        row = rows[piece["channel"]]
        assert row["slice_set"] == piece["set"] and row["status"] == "planned"
        assert (row["window_from"], row["window_until"]) == (None, run.window.until)  # the whole window
    sim.requests.clear()
    run.harvest_all()
    listed = {r.get("set") for r in sim.requests if r.get("verb") == "ListRecords" and "metadataPrefix" in r}
    assert listed == set(TYPE_SETS)
    applied_exactly_once(conn, run, repo)


def test_sets_above_the_target_are_harvested_as_time_slices_of_each_set(conn: psycopg.Connection,
                                                                        oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    """A set bigger than target_records is cut in time with its own counts (a big set would
    otherwise be one slice, expensive to redo): every slice lists its set over its own range,
    each set's ranges cover the window, and together they hold the live set exactly once."""
    sim, repo = oai
    partner = oai_partner(slicing={**SLICES, "sets": TYPE_SETS})  # about 300 a set; target 150, at most 6
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    assert len(run.pieces) == SLICES["max_slices"] and {p["set"] for p in run.pieces} == set(TYPE_SETS)
    rows = run.rows()
    for spec in TYPE_SETS:
        ranges = [(rows[p["channel"]]["window_from"], rows[p["channel"]]["window_until"])
                  for p in run.pieces if p["set"] == spec]
        assert len(ranges) >= 2 and ranges[0][0] is None and ranges[-1][1] == run.window.until
        assert all(b[0] == a[1] for a, b in zip(ranges, ranges[1:]))  # no gap: the boundary second in both
    sim.requests.clear()
    run.harvest_all()
    first_requests = [r for r in sim.requests if r.get("verb") == "ListRecords" and "metadataPrefix" in r]
    assert len(first_requests) == len(run.pieces) and all(r.get("set") in TYPE_SETS for r in first_requests)
    applied_exactly_once(conn, run, repo)


@pytest.mark.parametrize("by", ["datestamp", "sets"])
@pytest.mark.parametrize("earliest", ["late", "absent", "epoch"])
def test_a_wrong_earliest_datestamp_neither_loses_records_nor_stops_the_cut(conn: psycopg.Connection, earliest: str,
                                                                            by: str) -> None:
    """Real repositories announce an earliestDatestamp later than records they hold, none at
    all, or the epoch (I13). The slices still cover every record (the first keeps the
    window's open start), and the cut still finds the records' span: bisecting from 1970
    when nothing usable is announced, empty halves not counted against max_slices."""
    repo = SimulatedRepository(records=900, page_size=50, seed=9, deleted_fraction=0.05, earliest_datestamp=earliest)
    with OaiSimulator(repo) as sim:
        partner = oai_partner(slicing={**SLICES, "sets": TYPE_SETS} if by == "sets" else SLICES)
        run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
        assert len(run.pieces) >= SLICES["max_slices"] - 1, run.pieces  # about 900 / 150 records a slice
        assert run.rows()[run.pieces[0]["channel"]]["window_from"] is None  # the open start, never earliest
        run.harvest_all()
    applied_exactly_once(conn, run, repo)


@pytest.mark.parametrize("sets", [(), TYPE_SETS], ids=["no sets", "sets"])
def test_a_repository_that_announces_no_list_size_is_cut_into_equal_time_ranges(conn: psycopg.Connection, caplog: pytest.LogCaptureFixture,
                                                                                sets: tuple[str, ...]) -> None:
    """completeListSize is optional (I13). Without it the plan cannot count: a full harvest is
    cut into ``without_count`` ranges (by the first page: oai/sampled_cut.py; equal time ranges
    before it), registry sets are not trusted (they cannot be
    checked against the whole list), and the slices still hold the live set, every item once."""
    repo = SimulatedRepository(records=900, page_size=50, seed=9, deleted_fraction=0.05)
    with OaiSimulator(repo, list_size="omitted") as sim:
        partner = oai_partner(slicing={**SLICES, "without_count": 4, "sets": sets})
        with caplog.at_level("WARNING", logger="partner_harvest.oai.slicing"):
            run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
        assert len(run.pieces) == 4 and all(p["set"] is None and p["estimate"] is None for p in run.pieces)
        assert ("cannot be checked" in caplog.text) == bool(sets)
        run.harvest_all()
    result = run.apply()
    assert held(conn, partner.id) == repo.live_identifiers()
    assert result.fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())  # nothing twice


@pytest.mark.parametrize("case", ["a set missing from the list", "deleted records outside their sets"])
def test_sets_that_do_not_partition_the_list_are_not_trusted(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository],
                                                             caplog: pytest.LogCaptureFixture, case: str) -> None:
    """The registry's sets are checked against the whole list: a set left out, or a
    repository that drops deleted records from their sets (I13; the simulator does so
    here), would lose records or tombstones. A full reharvest after deletions shows it:
    the plan falls back to datestamp slices, and the deleted records are purged."""
    sim, repo = oai
    first = Run(conn, oai_partner(slicing={"max_slices": 1}), lambda: build_adapter(
        oai_partner(), Endpoint(sim.base_url)))
    first.harvest_all()
    first.apply()
    repo.delete(40)
    repo.advance_clock(3600)
    sets = TYPE_SETS[:2] if case == "a set missing from the list" else TYPE_SETS
    repo.deleted_in_sets = case != "deleted records outside their sets"
    partner = oai_partner(slicing={**SLICES, "sets": sets})
    with caplog.at_level("WARNING", logger="partner_harvest.oai.slicing"):
        run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)), run_id="run-2", mode="full")
    run.harvest_all()
    result = run.apply()
    assert held(conn, partner.id) == repo.live_identifiers()
    assert result.purged == 40
    assert "do not partition the list" in caplog.text
    assert len(run.pieces) >= 2 and all(p["set"] is None for p in run.pieces)  # datestamp slices


def test_a_short_window_stays_whole(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = oai
    partner = oai_partner(slicing={"threshold_records": 10_000, "target_records": 150})
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    assert run.pieces == [{"channel": "changes"}]
    run.harvest_all()
    run.apply()
    assert set(run.rows()) == {"changes"} and held(conn, partner.id) == repo.live_identifiers()


def test_a_failed_oai_slice_is_harvested_again_alone(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = oai
    partner = oai_partner()
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    channels = [p["channel"] for p in run.pieces]
    for channel in channels[:2]:
        run.harvest(channel)
    sim.requests.clear()
    original = sim.handle_oai
    served = {"n": 0}

    def broken_mid_slice(pairs: list[tuple[str, str]]) -> Response:  # the third slice dies on its second page
        if any(k == "verb" and v == "ListRecords" for k, v in pairs):
            served["n"] += 1
            if served["n"] == 2:
                sim.fail_next(3, status=503)  # the try and its two HTTP retries
        return original(pairs)

    with mock.patch.object(sim, "handle_oai", broken_mid_slice):
        with pytest.raises(HarvestError):
            run.harvest(channels[2])
        assert run.rows()[channels[2]]["status"] == "failed"
        with pytest.raises(RunNotHarvested, match="changes/003 \\(failed\\)"):  # I4 while a slice failed
            pipeline.apply_changes(conn, partner.id, run.run_id)
        assert held(conn, partner.id) == set()
    for channel in channels[2:]:  # the retry of the failed slice, then the rest
        run.harvest(channel)
    run.apply()
    assert held(conn, partner.id) == repo.live_identifiers()
    rows = run.rows()
    slice_pages = rows[channels[2]]["pages"]
    # list requests since the first two slices harvested: the rest of the collection, plus the
    # failed slice's page before the failure and its failing page tried three times (HTTP retries)
    rest = sum(rows[c]["pages"] for c in channels[2:])
    assert list_pages(sim) == rest + 1 + 3 <= rest + slice_pages + 3, (list_pages(sim), rest, slice_pages)
    done_before = {format_datestamp(rows[c]["window_until"], "YYYY-MM-DDThh:mm:ssZ") for c in channels[:2]}
    assert not [r for r in sim.requests if r.get("until") in done_before]  # slices 1 and 2: never again


@pytest.mark.parametrize("by", ["datestamp", "set"])
def test_lost_staging_of_one_slice_is_harvested_again_alone(conn: psycopg.Connection, oai: tuple[OaiSimulator, SimulatedRepository],
                                                            by: str) -> None:
    """The apply harvests again exactly the slice whose staging was lost, from the bounds in
    its row: its datestamp range, or its set (read back from harvest_runs.slice_set)."""
    sim, repo = oai
    partner = oai_partner(slicing={**SLICES, "sets": TYPE_SETS} if by == "set" else SLICES)
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    run.harvest_all()
    lost = run.pieces[1]["channel"]
    assert (run.pieces[1]["set"] is not None) == (by == "set")
    sim.requests.clear()
    with conn.transaction():  # what a crash does to the UNLOGGED staging, for one channel
        conn.execute("DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s",
                     (partner.id, run.run_id, lost))
    reharvested: list[str] = []
    run.apply(reharvested)
    assert reharvested == [lost]
    assert held(conn, partner.id) == repo.live_identifiers()
    listed = {r.get("set") for r in sim.requests if r.get("verb") == "ListRecords" and "metadataPrefix" in r}
    assert listed == {run.pieces[1]["set"]}  # the lost slice's own list, nothing else
    assert run.rows()[lost]["attempts"] == 2 and {run.rows()[c]["attempts"] for c in run.rows() if c not in (lost, "changes")} == {1}


def test_progress_is_visible_from_another_connection_while_a_slice_harvests(conn: psycopg.Connection, db: str,
                                                                            oai: tuple[OaiSimulator, SimulatedRepository]) -> None:
    sim, repo = oai
    partner = oai_partner()
    run = Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url)))
    channel = run.pieces[0]["channel"]
    seen: list[tuple[Any, ...]] = []
    refusals: list[str] = []
    original = sim.handle_oai
    observer = connect(db)

    def watch(pairs: list[tuple[str, str]]) -> Response:  # before answering each page: what does an operator see?
        row = one(observer.execute(
            "SELECT status, pages, fetched, progress_at, expected FROM harvest_runs WHERE partner_id = %s AND run_id = %s"
            " AND channel = %s", (partner.id, run.run_id, channel)))
        observer.commit()
        seen.append(row)
        if len(seen) == 2:  # I4: an apply now (another task, another connection) refuses
            try:
                apply_run(observer, partner.id, run.run_id)
            except RunNotHarvested as exc:
                refusals.append(str(exc))
        return original(pairs)

    try:
        with mock.patch.object(sim, "handle_oai", watch):
            stats = run.harvest(channel)
    finally:
        observer.close()
    assert stats.pages >= 3
    assert [r[0] for r in seen] == ["harvesting"] * len(seen)
    fetched = [r[2] for r in seen]
    assert fetched == sorted(fetched) and fetched[0] == 0 and fetched[-1] > 0
    pages = [r[1] for r in seen]  # the chain fetches at most one page ahead of what it staged
    assert pages == sorted(pages) and all(i - 1 <= n <= i for i, n in enumerate(pages)) and pages[-1] >= 2
    assert seen[-1][3] is not None
    assert seen[0][4] == run.pieces[0]["estimate"] and seen[-1][4] == stats.complete_list_size  # for the time left
    assert len(refusals) == 1 and f"{channel} (harvesting)" in refusals[0]


def sierra_run(conn: psycopg.Connection, sim: SierraSimulator, partner: Partner, run_id: str = "run-1") -> Run:
    return Run(conn, partner, lambda: build_adapter(partner, Endpoint(sim.base_url, KEY, SECRET)), run_id)


def test_sierra_full_load_as_id_slices_equals_the_live_set(conn: psycopg.Connection,
                                                           sierra: tuple[SierraSimulator, SimulatedCatalogue]) -> None:
    sim, catalogue = sierra
    partner = sierra_partner()
    run = sierra_run(conn, sim, partner)
    channels = [p["channel"] for p in run.pieces]
    assert len(channels) == 5, run.pieces  # 700 ids / 150 a slice
    rows = run.rows()
    assert rows[channels[0]]["slice_lo"] == 0 and rows[channels[-1]]["slice_hi"] is None  # the last is open-ended
    for a, b in zip(channels, channels[1:]):
        assert rows[b]["slice_lo"] == rows[a]["slice_hi"] + 1
    run.harvest_all()
    run.apply()
    assert held(conn, partner.id) == catalogue.live_ids()
    checks = conn.execute("SELECT channel, check_kind, check_ok FROM harvest_runs WHERE run_id = %s AND check_kind IS NOT NULL",
                          (run.run_id,)).fetchall()
    conn.commit()
    assert {c for c, kind, ok in checks if kind == "sierra-id-enumeration" and ok} == set(channels)  # I12, per slice


def test_a_sierra_slice_failed_mid_way_resumes_from_its_checkpoint(conn: psycopg.Connection,
                                                                   sierra: tuple[SierraSimulator, SimulatedCatalogue]) -> None:
    sim, catalogue = sierra
    partner = sierra_partner()
    run = sierra_run(conn, sim, partner)
    channel = run.pieces[1]["channel"]
    original = sim.handle
    exports = {"n": 0}

    def fail_third_block(method: str, path: str, query: str, headers: Headers, body: bytes) -> Response | tuple[str, Any]:
        if method == "GET" and path.endswith("/bibs/marc"):
            exports["n"] += 1
            if exports["n"] == 3:
                sim.fail_next(2, status=500, path_prefix="/bibs/marc")  # both tries (server_error_tries)
        return original(method, path, query, headers, body)

    with mock.patch.object(sim, "handle", fail_third_block):
        with pytest.raises(HarvestError):
            run.harvest(channel)
    row = run.rows()[channel]
    assert row["status"] == "failed" and row["checkpoint"] == row["slice_lo"] + 100 and row["fetched"] > 0
    sim.requests.clear()
    run.harvest(channel)  # the retry
    resumed = [r for r in sim.requests if r["path"].endswith("/bibs/marc")]
    assert resumed[0]["query"]["id"].startswith(f"[{row['checkpoint']},")
    after = run.rows()[channel]
    assert after["resumed"] == 1 and after["status"] == "harvested"
    # from scratch: the same slice again costs more export requests than the resume did
    sim.requests.clear()
    fresh = sierra_run(conn, sim, partner, "run-2")
    sim.requests.clear()
    fresh.harvest(channel)
    scratch = [r for r in sim.requests if r["path"].endswith("/bibs/marc")]
    assert len(resumed) < len(scratch)
    run.harvest_all(but=channel)
    result = run.apply()  # the staged-count check holds across the resume
    assert held(conn, partner.id) == catalogue.live_ids()
    assert result.fetched == sum(r["fetched"] for r in run.rows().values())


def test_a_killed_sierra_slice_resumes_from_its_checkpoint(conn: psycopg.Connection, db: str,
                                                           sierra: tuple[SierraSimulator, SimulatedCatalogue],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-slice (no failure handler runs: the row stays 'harvesting', its
    connection dies with the page's transaction) resumes on the next try."""
    from partner_harvest.store import staging

    sim, catalogue = sierra
    partner = sierra_partner()
    run = sierra_run(conn, sim, partner)
    channel = run.pieces[2]["channel"]
    real_write, pages = staging.StagingWriter.write_page, {"n": 0}

    def killed_on_the_third_page(self: staging.StagingWriter, items: list[HarvestItem], checkpoint: int | None = None) -> None:
        pages["n"] += 1
        if pages["n"] == 3:
            raise KeyboardInterrupt("SIGKILL")
        return real_write(self, items, checkpoint=checkpoint)

    monkeypatch.setattr(staging.StagingWriter, "write_page", killed_on_the_third_page)
    # a killed process records nothing (a task timeout, also not an Exception, does record: test_superseded_try)
    monkeypatch.setattr("partner_harvest.pipeline.record_failed_try", lambda *args: None)
    with pytest.raises(KeyboardInterrupt):
        run.harvest(channel)
    monkeypatch.undo()
    conn.close()  # the dead worker's connection
    conn = connect(db)
    run.conn = conn
    row = run.rows()[channel]
    assert row["status"] == "harvesting" and row["pages"] == 2 and row["checkpoint"] == row["slice_lo"] + 100
    run.harvest(channel)
    assert run.rows()[channel]["resumed"] == 1
    run.harvest_all(but=channel)
    run.apply()
    assert held(conn, partner.id) == catalogue.live_ids()
    conn.close()


def test_a_sierra_slice_whose_staging_was_lost_starts_over(conn: psycopg.Connection,
                                                           sierra: tuple[SierraSimulator, SimulatedCatalogue]) -> None:
    sim, catalogue = sierra
    partner = sierra_partner()
    run = sierra_run(conn, sim, partner)
    channel = run.pieces[1]["channel"]
    original, exports = sim.handle, {"n": 0}

    def fail_second_block(method: str, path: str, query: str, headers: Headers, body: bytes) -> Response | tuple[str, Any]:
        if method == "GET" and path.endswith("/bibs/marc"):
            exports["n"] += 1
            if exports["n"] == 2:
                sim.fail_next(2, status=500, path_prefix="/bibs/marc")
        return original(method, path, query, headers, body)

    with mock.patch.object(sim, "handle", fail_second_block):
        with pytest.raises(HarvestError):
            run.harvest(channel)
    assert run.rows()[channel]["checkpoint"] is not None
    with conn.transaction():  # a crash empties the UNLOGGED staging under the failed slice
        conn.execute("DELETE FROM staging WHERE run_id = %s AND channel = %s", (run.run_id, channel))
    sim.requests.clear()
    run.harvest(channel)
    first = next(r for r in sim.requests if r["path"].endswith("/bibs/marc"))
    assert first["query"]["id"].startswith(f"[{run.rows()[channel]['slice_lo']},")  # from its own start
    assert run.rows()[channel]["resumed"] == 0
    run.harvest_all(but=channel)
    run.apply()
    assert held(conn, partner.id) == catalogue.live_ids()


def test_a_long_sierra_change_poll_is_sliced_by_updated_date(conn: psycopg.Connection,
                                                             sierra: tuple[SierraSimulator, SimulatedCatalogue]) -> None:
    sim, catalogue = sierra
    partner = sierra_partner(slicing={"threshold_records": 300, "target_records": 150, "max_slices": 4,
                                         "long_window": "2d"})
    adapter = lambda: build_adapter(partner, Endpoint(sim.base_url, KEY, SECRET))  # noqa: E731
    first = sierra_run(conn, sim, partner)
    first.harvest_all()
    first.apply()
    cursor = first.window.until
    catalogue.advance_clock(86400 * 5)
    edited = catalogue.edit(30)
    window = pipeline.freeze_window(adapter(), partner.lag, cursor, pipeline.RunRequest("incremental"))
    planned = pipeline.plan_slices(adapter(), conn, partner.id, "run-3", window, partner.slicing)
    assert len(planned) == 3  # five days and ten minutes in pieces of two days
    rows = {r["channel"]: r for r in slice_rows(conn, partner.id, "run-3")}
    assert rows["changes/001"]["window_from"] == window.from_ and rows["changes/003"]["window_until"] == window.until
    # each starts on the second the one before ends: a server keeping sub-second stamps loses none between
    assert rows["changes/002"]["window_from"] == rows["changes/001"]["window_until"]
    assert rows["changes/003"]["window_from"] == rows["changes/002"]["window_until"]
    for piece in planned:
        pipeline.harvest_piece(adapter(), conn, partner.id, "run-3", window, piece.channel)
    result = pipeline.apply_changes(conn, partner.id, "run-3")
    assert result.upserted == len(edited)
    assert held(conn, partner.id) == catalogue.live_ids()


def test_a_sierra_plans_probes_at_once_keep_their_connections(conn: psycopg.Connection,
                                                              sierra: tuple[SierraSimulator, SimulatedCatalogue],
                                                              caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's id probes go out pool_slots - 1 at once; a connection pool narrower than
    that discards a connection after each round (a new TLS handshake per probe on a real
    partner, and a warning per round in the task's log)."""
    sim, _ = sierra
    partner = sierra_partner(pool_slots=4)
    pool_log = logging.getLogger("urllib3.connectionpool")  # heard here whatever a logging setup did to it
    monkeypatch.setattr(pool_log, "disabled", False)
    monkeypatch.setattr(pool_log, "propagate", True)
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        run = sierra_run(conn, sim, partner)
    assert len(run.pieces) > 1
    assert [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"] == []
