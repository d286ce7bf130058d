"""OAI-PMH harvests end to end without Airflow: the simulator over loopback, real PostgreSQL.

Each test runs the partner as the DAG does (partner_harvest.run: freeze, plan, harvest, apply)
and compares ``records`` with the simulator's live set, identifier for identifier.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.errors import (
    HarvestLoopError,
    PartnerAsksToWait,
    PartnerDataError,
    PartnerHttpError,
    PartnerProtocolError,
)
from partner_harvest.oai.harvester import TokenRestartsExhausted
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef
from tests.support.harness import OaiHarness as Harness
from tests.support.partners import fast_http, oai_partner


def partner(**kw: Any) -> Partner:
    """The module's museum: three quick HTTP retries."""
    return oai_partner(retries=3, **kw)


@pytest.fixture
def repo() -> SimulatedRepository:
    return SimulatedRepository(records=600, page_size=50, deleted_fraction=0.05, seed=7)


@pytest.fixture
def sim(repo: SimulatedRepository) -> Iterator[OaiSimulator]:
    with OaiSimulator(repo) as server:
        yield server


@pytest.fixture
def harness(sim: OaiSimulator, conn: psycopg.Connection) -> Harness:
    return Harness(sim, conn, partner())


def test_full_then_incremental_matches_live_set(harness: Harness, repo: SimulatedRepository, sim: OaiSimulator) -> None:
    window, stats, result = harness.run()
    assert window.is_full and window.advances_cursor
    assert harness.held() == repo.live_identifiers()
    assert stats.pages == 12 and stats.fetched == 600 and stats.complete_list_size == 600
    assert result.upserted == len(repo.live_identifiers()) and result.purged == 0
    assert result.unchanged == len(repo.deleted_identifiers())  # tombstones with nothing to purge
    audit = harness.audit("run-1")
    assert audit["status"] == "applied" and not audit["list_size_mismatch"]
    assert audit["fetched"] == audit["upserted"] + audit["unchanged"] + audit["purged"] + audit["quarantined"]

    edited, deleted, added = repo.edit(6), repo.delete(3), repo.add(3)
    sim.clear_requests()
    window, stats, result = harness.run()
    assert window.from_ is not None and window.from_ < window.until
    assert stats.fetched == len(edited) + len(deleted) + len(added)  # only the changed window
    assert (result.upserted, result.purged) == (9, 3)
    assert harness.held() == repo.live_identifiers()
    first = sim.requests[1]  # [0] is Identify
    assert first["verb"] == "ListRecords" and first["from"] and first["until"]
    deletions = harness.conn.execute("SELECT identifier FROM deletions WHERE run_id = 'run-2'").fetchall()
    assert {d[0] for d in deletions} == set(deleted)


def test_continuations_carry_verb_and_token_only(harness: Harness, sim: OaiSimulator) -> None:
    harness.run()
    lists = [r for r in sim.requests if r.get("verb") == "ListRecords"]
    assert len(lists) == 12
    assert set(lists[0]) == {"verb", "metadataPrefix", "until"}  # full harvest: no from
    for continuation in lists[1:]:
        assert set(continuation) == {"verb", "resumptionToken"}


def test_replaying_the_same_window_changes_nothing(harness: Harness) -> None:
    window, _, _ = harness.run()
    before = harness.conn.execute("SELECT identifier, content_hash, harvested_at FROM records ORDER BY 1").fetchall()
    _, _, replay = harness.run(window=replace(window, advances_cursor=False))
    after = harness.conn.execute("SELECT identifier, content_hash, harvested_at FROM records ORDER BY 1").fetchall()
    assert replay.upserted == 0 and replay.purged == 0 and replay.unchanged == replay.fetched
    assert before == after


@pytest.mark.parametrize("granularity,pattern", [("day", r"^\d{4}-\d{2}-\d{2}$"),
                                                 ("seconds", r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")])
def test_window_bounds_use_the_repository_granularity(conn: psycopg.Connection, granularity: str, pattern: str) -> None:
    import re

    repo = SimulatedRepository(records=200, page_size=50, granularity=granularity, seed=3)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        repo.advance_clock(3600)
        repo.edit(5)
        sim.clear_requests()
        harness.run()
        first = next(r for r in sim.requests if r.get("verb") == "ListRecords")
        assert re.match(pattern, first["from"]) and re.match(pattern, first["until"])
        assert harness.held() == repo.live_identifiers()


def test_repeated_token_is_a_loop_error_and_nothing_lands(harness: Harness, sim: OaiSimulator) -> None:
    sim.repeat_token(True)
    with pytest.raises(HarvestLoopError, match="museum.*second time"):
        harness.run()
    harness.conn.rollback()
    assert harness.held() == set()
    assert harness.audit("run-1")["status"] == "failed"


def test_pages_with_a_token_but_no_records_are_a_loop_error(harness: Harness, sim: OaiSimulator) -> None:
    sim.empty_pages_with_token(True)
    with pytest.raises(HarvestLoopError, match="no records"):
        harness.run()


def test_token_expiring_mid_window_restarts_from_frozen_bounds(harness: Harness, repo: SimulatedRepository, sim: OaiSimulator) -> None:
    sim.expire_tokens_after(3)
    window, stats, result = harness.run()
    assert stats.restarts == 1 and stats.fetched == 600  # the broken attempt is not double-counted
    assert harness.held() == repo.live_identifiers()
    firsts = [r for r in sim.requests if r.get("verb") == "ListRecords" and "resumptionToken" not in r]
    assert len(firsts) == 2 and firsts[0] == firsts[1]  # same frozen bounds both times
    assert harness.audit("run-1")["token_restarts"] == 1


def test_token_expiring_every_time_gives_up_with_a_clear_error(conn: psycopg.Connection, sim: OaiSimulator,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    harness = Harness(sim, conn, partner(max_token_restarts=1))
    make_adapter = harness.adapter

    def adapter_whose_tokens_always_expire() -> Any:
        adapter = make_adapter()
        fetch = adapter.client.fetch

        def fetch_expiring(params: dict[str, str]) -> Any:
            if "resumptionToken" in params:
                sim.expire_tokens()
            return fetch(params)

        monkeypatch.setattr(adapter.client, "fetch", fetch_expiring)
        return adapter

    monkeypatch.setattr(harness, "adapter", adapter_whose_tokens_always_expire)
    with pytest.raises(TokenRestartsExhausted, match="museum.*expired 2 times"):
        harness.run()
    harness.conn.rollback()
    assert harness.held() == set()


def test_503_with_retry_after_is_retried(harness: Harness, repo: SimulatedRepository, sim: OaiSimulator) -> None:
    past = format_datetime(datetime(2001, 1, 1, tzinfo=timezone.utc), usegmt=True)
    sim.fail_next(2, status=503, retry_after=past)
    harness.run()
    sim.fail_next(1, status=503, retry_after="1")
    repo.edit(2)
    harness.run()
    assert harness.held() == repo.live_identifiers()


def test_a_long_retry_after_frees_the_task_and_the_next_try_starts_the_window_again(conn: psycopg.Connection, sim: OaiSimulator,
                                                                                    repo: SimulatedRepository) -> None:
    """A 503 asking for more than the task may sleep (here 20 s > 2 s) is not slept in the
    worker slot: PartnerAsksToWait (a reschedule) at the asked time, the run 'waiting';
    the next try harvests the frozen window from its start and lands it exactly."""
    p = partner(options={"http": fast_http(3, max_wait_in_task=2)})
    harness = Harness(sim, conn, p)
    window = harness.freeze("full")
    run = RunRef(p.id, "run-waits")
    sim.fail_next(1, status=503, retry_after="20")
    before = datetime.now(timezone.utc)
    with pytest.raises(PartnerAsksToWait) as waited:
        pipeline.harvest_window(harness.adapter(), conn, run, window)
    after = datetime.now(timezone.utc)
    message = str(waited.value)
    assert "partner 'museum'" in message and "verb=ListRecords" in message and "Retry-After 20 s" in message
    assert before + timedelta(seconds=20) <= waited.value.resume_at <= after + timedelta(seconds=20)
    assert harness.audit("run-waits")["status"] == "waiting"
    stats = pipeline.harvest_window(harness.adapter(), conn, run, window)  # the rescheduled try
    pipeline.apply_changes(conn, p.id, "run-waits")
    assert stats.fetched == len(repo.live_identifiers()) + len(repo.deleted_identifiers())
    assert harness.held() == repo.live_identifiers()


def test_persistent_5xx_fails_naming_partner_and_request(harness: Harness, sim: OaiSimulator) -> None:
    sim.fail_next(10, status=500)
    with pytest.raises(PartnerHttpError) as err:
        harness.run()
    message = str(err.value)
    assert "partner 'museum'" in message and "verb=Identify" in message and "HTTP 500" in message


def test_invalid_records_are_quarantined_and_the_rest_lands(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=300, page_size=50, invalid_every=25, deleted_fraction=0.0, seed=5)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, partner())
        _, stats, result = harness.run()
        invalid = {f"oai:sim.example:rec-{n:07d}" for n in range(25, 301, 25)}
        assert result.quarantined == stats.rejected == len(invalid)
        assert harness.held() == repo.live_identifiers() - invalid
        rows = conn.execute("SELECT identifier, reason, raw_payload FROM quarantine").fetchall()
        assert {r[0] for r in rows} == invalid
        assert all("title" in r[1] and "<" in r[2] for r in rows)


@pytest.mark.parametrize("fault,error", [("broken", PartnerDataError), ("html", PartnerDataError),
                                         ("billion_laughs", PartnerDataError), ("xxe", PartnerDataError)])
def test_bad_input_mid_harvest_fails_clearly_and_keeps_stored_records(harness: Harness, repo: SimulatedRepository, sim: OaiSimulator,
                                                                      fault: str, error: type[Exception]) -> None:
    harness.run()
    held = harness.held()
    repo.edit(60)
    window = harness.freeze()
    sim.clear_requests()
    if fault == "broken":
        sim.broken_next()
    elif fault == "html":
        sim.html_next()
    else:
        sim.hostile_next(fault)
    with pytest.raises(error) as err:
        harness.run(window=window)
    message = str(err.value)
    assert "partner 'museum'" in message and "ListRecords" in message
    harness.conn.rollback()
    assert harness.held() == held
    assert harness.audit("run-2")["status"] == "failed"


def test_oai_error_is_reported_with_code(conn: psycopg.Connection, sim: OaiSimulator) -> None:
    harness = Harness(sim, conn, partner(metadata_prefix="marcxml"))
    with pytest.raises(PartnerProtocolError, match="cannotDisseminateFormat"):
        harness.run()


def test_empty_window_is_no_records_match(harness: Harness, repo: SimulatedRepository) -> None:
    harness.run()
    repo.advance_clock(7200)
    _, stats, result = harness.run()
    assert stats.fetched == 0 and result.fetched == 0


def test_auto_prefix_prefers_lido(conn: psycopg.Connection) -> None:
    for formats, expected in ((("oai_dc", "lido"), "lido"), (("oai_dc",), "oai_dc")):
        repo = SimulatedRepository(records=60, page_size=50, formats=formats, seed=2)
        with OaiSimulator(repo) as sim:
            harness = Harness(sim, conn, partner(id=f"p_{expected}", metadata_prefix="auto"))
            window, _, _ = harness.run()
            assert window.protocol.metadata_prefix == expected
            prefixes = {r[0] for r in conn.execute(
                "SELECT DISTINCT metadata_prefix FROM records WHERE partner_id = %s", (harness.partner.id,))}
            assert prefixes == {expected}
            assert harness.held() == repo.live_identifiers()


def test_set_restricts_the_harvest(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=300, page_size=50, seed=9)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, partner(set="type:print"))
        harness.run()
        expected = {r.identifier for r in repo.select(None, None, "type:print") if not r.deleted}
        assert expected and harness.held() == expected


def test_complete_list_size_mismatch_is_flagged(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records vanishing mid-list (deletedRecord=no) leave completeListSize too high."""
    repo = SimulatedRepository(records=300, page_size=50, deleted_record="no", deleted_fraction=0.0, seed=4)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, partner())
        make_adapter = harness.adapter

        def adapter_that_deletes_after_page_one() -> Any:
            adapter = make_adapter()
            fetch = adapter.client.fetch

            def fetch_then_delete(params: dict[str, str]) -> Any:
                content = fetch(params)
                if params.get("verb") == "ListRecords" and "resumptionToken" not in params:
                    repo.delete_ids([f"oai:sim.example:rec-{n:07d}" for n in range(290, 301)])
                return content

            monkeypatch.setattr(adapter.client, "fetch", fetch_then_delete)
            return adapter

        monkeypatch.setattr(harness, "adapter", adapter_that_deletes_after_page_one)
        _, stats, _ = harness.run()
        assert stats.complete_list_size == 300 and stats.fetched == 289
        audit = harness.audit("run-1")
        assert audit["list_size_mismatch"] and audit["complete_list_size"] == 300 and audit["fetched"] == 289


def test_a_high_water_ahead_of_the_clock_marks_the_run_and_names_a_future_dated_record(harness: Harness, repo: SimulatedRepository,
                                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A record stamped in the future keeps every run clock_regressed until the partner's clock
    passes it; the warning says so instead of only blaming the clock."""
    ahead = repo.clock + timedelta(days=365)
    with caplog.at_level("WARNING", logger="partner_harvest.pipeline"):
        window = pipeline.freeze_window(harness.adapter(), harness.partner.lag, None,
                                        pipeline.RunRequest("incremental"), None, ahead)
    assert window.protocol.clock_regressed is True
    (warning,) = [r.getMessage() for r in caplog.records if "ordered by when we observed them" in r.getMessage()]
    assert "museum" in warning and "record datestamp" in warning and "stamped in the future" in warning


def test_each_page_logs_progress_against_the_announced_size_and_the_time_left(conn: psycopg.Connection,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The task log an operator reads while a long chain runs: fetched of completeListSize,
    the rate, and the time left at that rate on every page but the last."""
    repo = SimulatedRepository(records=300, page_size=100, seed=5, deleted_fraction=0.0)
    with OaiSimulator(repo) as sim, caplog.at_level("INFO", logger="partner_harvest.oai.harvester"):
        Harness(sim, conn, partner()).run("full")
    lines = [r.getMessage() for r in caplog.records if ": page " in r.getMessage()]
    assert [line.split(": page ")[1].split(":")[0] for line in lines] == ["1", "2", "3"]
    assert all(re.search(r"\d+ fetched of 300 \(", line) for line in lines), lines
    assert all(re.search(r"/s, about \d+[dhms]( \d+[hms])? left$", line) for line in lines[:-1]), lines
    assert lines[-1].endswith("/s")  # the last page: nothing left to estimate
