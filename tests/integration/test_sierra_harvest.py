"""Sierra harvests end to end without Airflow: the Sierra simulator over loopback, real PostgreSQL.

The harness plays the DAG: freeze (server Date, deletion day window), change poll or
export, deletion poll, one apply, then both cursors move.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest import pipeline
from partner_harvest.errors import ConfigurationError, PartnerAsksToWait, PartnerHttpError
from partner_harvest.records import Tombstone
from partner_harvest.registry import RegistryError
from partner_harvest.run import stage_channel
from partner_harvest.store import RunRef
from partner_harvest.store.db import one, scalar
from partner_harvest.window import Window
from tests.support.harness import SIERRA_KEY as KEY
from tests.support.harness import SIERRA_SECRET as SECRET
from tests.support.harness import SierraHarness as Harness
from tests.support.partners import sierra_partner as partner
from tests.support.records import as_record


@pytest.fixture
def catalogue() -> SimulatedCatalogue:
    return SimulatedCatalogue(bibs=500, deleted_fraction=0.04, seed=3)


@pytest.fixture
def sim(catalogue: SimulatedCatalogue) -> Iterator[SierraSimulator]:
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as server:
        yield server


@pytest.fixture
def harness(sim: SierraSimulator, conn: psycopg.Connection) -> Harness:
    return Harness(sim, conn, partner())


def requests_to(sim: SierraSimulator, suffix: str) -> list[dict[str, Any]]:
    return [r for r in sim.requests if r["path"].endswith(suffix)]


def test_full_load_through_the_export_then_incremental(harness: Harness, catalogue: SimulatedCatalogue, sim: SierraSimulator) -> None:
    window, changes, deletions, result = harness.run()
    assert window.is_full and deletions.fetched == 0  # a full load from scratch needs no deletion poll
    assert harness.held() == catalogue.live_ids()
    assert result.upserted == len(catalogue.live_ids()) and result.quarantined == 0
    assert not sim.open_export_files  # every export file deleted
    exports = [r for r in sim.requests if r["path"].endswith("/bibs/marc")]
    starts = [int(r["query"]["id"].strip("[]").split(",")[0]) for r in exports]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)  # keyset, no re-export
    row = one(harness.conn.execute(
        "SELECT metadata_prefix, metadata, title FROM records WHERE partner_id = 'library' LIMIT 1"))
    assert row[0] == "marc21" and "<record" in row[1] and "http://www.loc.gov/MARC21/slim" in row[1] and row[2]

    catalogue.advance_clock(3600)
    edited, deleted, added = catalogue.edit(10), catalogue.delete(5), catalogue.add(5)
    sim.clear_requests()
    window, changes, deletions, result = harness.run()
    assert changes.fetched == len(set(edited) - set(deleted)) + len(added)  # deleted=false hides deletions
    assert deletions.tombstones >= len(deleted)  # plus re-seen deletions inside the overlap
    assert harness.held() == catalogue.live_ids()
    assert result.purged == len(deleted)
    assert result.upserted == len(set(edited) - set(deleted)) + len(added)
    poll = [r["query"] for r in requests_to(sim, "/bibs") if r["query"].get("deleted") == "false"]
    assert poll and all(q["updatedDate"].endswith("Z]") and q["fields"] == "id,updatedDate,createdDate,deleted,suppressed,marc"
                        for q in poll)
    deletion_polls = [r["query"] for r in requests_to(sim, "/bibs") if r["query"].get("deleted") == "true"]
    assert deletion_polls and all(q["fields"] == "id,deletedDate" for q in deletion_polls)
    held_title = scalar(harness.conn.execute(
        "SELECT title FROM records WHERE partner_id = 'library' AND identifier = %s", (sorted(set(edited) - set(deleted))[0],)
    ))
    assert "revision" in held_title


def test_change_poll_pages_by_keyset_and_stops_on_a_short_page(harness: Harness, catalogue: SimulatedCatalogue,
                                                               sim: SierraSimulator) -> None:
    harness.run()
    catalogue.advance_clock(60)
    edited = catalogue.edit(120)  # 50 per page: pages of 50, 50, 20
    sim.clear_requests()
    _, changes, _, _ = harness.run()
    assert changes.fetched == 120
    polls = [r["query"] for r in requests_to(sim, "/bibs") if r["query"].get("deleted") == "false"]
    assert len(polls) == 3  # the 20-entry page ends it; `total` (= page size) is never trusted
    lows = [int(q["id"].strip("[]").rstrip(",")) for q in polls]
    assert lows[0] == 0 and lows[1] == int(sorted(edited)[49]) + 1 and lows[2] == int(sorted(edited)[99]) + 1
    assert all(q["limit"] == "50" for q in polls)


def test_empty_windows_are_zero_results_not_errors(harness: Harness, sim: SierraSimulator) -> None:
    harness.run()
    sim.clear_requests()
    # Nothing changed: the change poll gets 404/107, the deletion poll 200 with no entries.
    _, changes, deletions, result = harness.run()
    assert changes.fetched == 0 and result.fetched == deletions.fetched
    statuses = {(r["query"].get("deleted"), r["status"]) for r in requests_to(sim, "/bibs")}
    assert ("false", 404) in statuses


def test_token_expiring_mid_run_is_refreshed_once(harness: Harness, catalogue: SimulatedCatalogue, sim: SierraSimulator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    harness.run()
    catalogue.advance_clock(60)
    catalogue.edit(120)
    tokens_before = sim.tokens_issued
    adapter_factory = harness.adapter

    def adapter_whose_token_expires_after_the_first_page() -> Any:
        adapter = adapter_factory()
        pages = adapter.client.bib_pages

        def expiring(params: dict[str, str], limit: int, start_id: int = 0) -> Iterator[Any]:
            for index, page in enumerate(pages(params, limit, start_id)):
                yield page
                if index == 0:
                    sim.expire_tokens()

        monkeypatch.setattr(adapter.client, "bib_pages", expiring)
        return adapter

    monkeypatch.setattr(harness, "adapter", adapter_whose_token_expires_after_the_first_page)
    harness.run()
    assert harness.held() == catalogue.live_ids()
    assert any(r["status"] == 401 for r in sim.requests)
    assert sim.tokens_issued >= tokens_before + 2  # freeze's adapter + the refresh after the 401


def test_bad_credentials_fail_at_once_without_leaking_the_secret(conn: psycopg.Connection, sim: SierraSimulator) -> None:
    harness = Harness(sim, conn, partner(), secret="wrong-" + SECRET)
    with pytest.raises(ConfigurationError) as err:
        harness.run()
    assert not err.value.retryable
    assert "client credentials" in str(err.value) and SECRET not in str(err.value)
    assert "library" in str(err.value)


def test_deletion_poll_500_fails_with_query_and_body_and_nothing_lands(harness: Harness, catalogue: SimulatedCatalogue,
                                                                       sim: SierraSimulator) -> None:
    harness.run()
    held = harness.held()
    catalogue.advance_clock(60)
    catalogue.delete(3)
    sim.fail_next(10, status=500, body='{"code":111,"name":"database is on fire"}', path_prefix="deleted=true")
    cursor, deletions_cursor = harness.cursor, harness.deletions_cursor
    with pytest.raises(PartnerHttpError) as err:
        harness.run()
    message = str(err.value)
    assert "deleted=true" in message and "deletedDate" in message and "database is on fire" in message
    harness.conn.rollback()
    assert harness.held() == held
    assert (harness.cursor, harness.deletions_cursor) == (cursor, deletions_cursor)
    tries = [r for r in sim.requests if r["query"].get("deleted") == "true"]
    assert len(tries) == 3  # a small number of tries, then fail: never "an empty day"


def test_export_truncation_is_refetched_whole(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.0, oversized_every=50, seed=8)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        oversized = {bib_id for bib_id in catalogue.live_ids() if catalogue.is_oversized(int(bib_id) - 1000000)}
        assert oversized and harness.held() == catalogue.live_ids()
        refetched = {r["path"].split("/")[-2] for r in sim.requests if r["path"].endswith("/marc") and "/bibs/1" in r["path"]}
        assert oversized <= refetched
        quarantined = scalar(conn.execute("SELECT count(*) FROM quarantine"))
        assert quarantined == 0


def test_export_rate_limit_waits_and_resumes_without_re_exporting(conn: psycopg.Connection) -> None:
    """Waits up to options.export.max_sleep_seconds sleep in the task (the wait the server names)."""
    catalogue = SimulatedCatalogue(bibs=500, deleted_fraction=0.0, seed=9)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, export_quota=2) as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": 100, "max_sleep_seconds": 7200}}))
        harness.on_sleep = sim.reset_export_quota
        harness.run()
        assert harness.held() == catalogue.live_ids()
        assert harness.sleeps == [3600, 3600]  # 5 blocks of 100 with a quota of 2 per hour: "try again in 60 minutes"
        ok_exports = [r for r in sim.requests if r["path"].endswith("/bibs/marc") and r["status"] == 200]
        starts = [r["query"]["id"] for r in ok_exports]
        assert len(starts) == len(set(starts)) == 5


def test_invalid_marc_is_quarantined(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=200, deleted_fraction=0.0, invalid_every=40, seed=4)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        _, changes, _, result = harness.run()
        invalid = {b for b in catalogue.live_ids() if catalogue.is_invalid(int(b) - 1000000)}
        assert invalid and result.quarantined == len(invalid)
        assert harness.held() == catalogue.live_ids() - invalid
        reasons = {r[0] for r in conn.execute("SELECT reason FROM quarantine")}
        assert reasons == {"MARC: no title (245 $a)"}


def test_a_deletion_beats_an_edit_made_earlier_the_same_day(harness: Harness, catalogue: SimulatedCatalogue, sim: SierraSimulator) -> None:
    harness.run()
    catalogue.advance_clock(60)
    victim = catalogue.edit(1)[0]

    def delete_between_the_two_polls() -> None:
        catalogue.delete_ids([victim])  # same simulated day as the edit, after the change poll saw it

    _, changes, deletions, result = harness.run(between=delete_between_the_two_polls)
    assert changes.records == 1 and deletions.tombstones >= 1
    assert victim not in harness.held() and harness.held() == catalogue.live_ids()


def test_a_version_stamped_after_the_deletion_day_wins(harness: Harness, catalogue: SimulatedCatalogue, conn: psycopg.Connection) -> None:
    """A record re-created after its deletion day is kept (tombstone = D 23:59:59Z)."""
    from partner_harvest.records import HarvestStats, Record, Tombstone
    from partner_harvest.store import StagingWriter, apply_run, begin_run, finish_harvest

    harness.run()
    victim = sorted(catalogue.live_ids())[0]
    xml = scalar(conn.execute("SELECT metadata FROM records WHERE identifier = %s", (victim,)))
    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    window = Window("incremental", day, day + timedelta(days=2), "seconds", True)
    for channel, item in (("changes", Record(victim, day + timedelta(days=1, hours=8), "marc21", xml, (), "again")),
                          ("deletions", Tombstone(victim, day + timedelta(hours=23, minutes=59, seconds=59)))):
        run = RunRef("library", "race", channel)
        begin_run(conn, run, window, "marc21")
        StagingWriter(conn, run).write_page([item])
        finish_harvest(conn, run, HarvestStats(pages=1, fetched=1))
    result = apply_run(conn, "library", "race")
    assert result.purged == 0 and victim in harness.held()


# -- the reference's section 6, quirk by quirk (those not covered above) ---------------


def test_page_size_is_never_above_the_2000_cap(conn: psycopg.Connection, sim: SierraSimulator) -> None:
    with pytest.raises(RegistryError, match="page_size"):  # the registry refuses a page above the cap
        partner(page_size=5000)
    harness = Harness(sim, conn, partner(page_size=2000, options={"export": {"limit": 5000, "rate_limit_wait": 0}}))
    harness.run()
    harness.run()
    limits = {int(r["query"]["limit"]) for r in sim.requests if r["path"].endswith(("/bibs", "/bibs/marc"))}
    assert max(limits) == 2000  # and limit=1: the id probes of the full load's size estimate


def test_legacy_deleted_stubs_are_tombstones_never_rejects(conn: psycopg.Connection) -> None:
    """Older Sierras returned deleted stubs in updatedDate windows; with deleted=false they
    do not, and the separate deletion poll still catches every deletion."""
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.0, seed=12)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, legacy_deleted_stubs=True) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        catalogue.advance_clock(60)
        deleted = catalogue.delete(4)
        _, changes, deletions, result = harness.run()
        assert changes.rejected == 0 and deletions.tombstones >= 4
        assert result.purged == 4 and not set(deleted) & harness.held()
        stub = harness.adapter()._entry_to_item({"id": "1000007", "deleted": True, "deletedDate": "2026-01-02"})
        assert stub == Tombstone("1000007", datetime(2026, 1, 2, 23, 59, 59, 999_999, tzinfo=timezone.utc))


def test_transient_faults_are_retried(harness: Harness, catalogue: SimulatedCatalogue, sim: SierraSimulator) -> None:
    harness.run()
    catalogue.advance_clock(60)
    catalogue.edit(5)
    sim.fail_next(2, status=500, path_prefix="deleted=false")  # transient 5xx on the change poll
    sim.empty_reply_next(1)  # a connection closed without a response
    _, changes, _, _ = harness.run()
    assert changes.fetched == 5 and harness.held() == catalogue.live_ids()
    statuses = [r["status"] for r in sim.requests]
    assert statuses.count(500) == 2 and None in statuses


def test_export_failure_135_is_retried(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=150, deleted_fraction=0.0, seed=13)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        sim.fail_export_next(code=135, count=1)
        harness = Harness(sim, conn, partner())
        harness.run()
        assert harness.held() == catalogue.live_ids()
        assert [r["status"] for r in sim.requests if r["path"].endswith("/bibs/marc")][0] == 500


def test_window_is_frozen_on_the_server_date_header(harness: Harness, catalogue: SimulatedCatalogue) -> None:
    catalogue.advance_clock(12345)
    window, *_ = harness.run()
    assert window.until == catalogue.clock.replace(microsecond=0)
    assert window.protocol.channels["deletions"].until.date() == catalogue.clock.date()


def test_deletions_overlap_re_sees_yesterday_harmlessly(harness: Harness, catalogue: SimulatedCatalogue, sim: SierraSimulator) -> None:
    harness.run()
    catalogue.advance_clock(3600)
    deleted = catalogue.delete(3)
    harness.run()
    catalogue.advance_clock(86400)  # next day: the one-day overlap re-sweeps yesterday
    sim.clear_requests()
    _, _, deletions, result = harness.run()
    polls = [r["query"]["deletedDate"] for r in sim.requests if r["query"].get("deleted") == "true"]
    day_before = (catalogue.clock.date() - timedelta(days=2)).isoformat()
    assert polls and polls[0].startswith(f"[{day_before},")
    assert deletions.tombstones >= len(deleted) and result.purged == 0  # re-seen, nothing left to purge
    assert harness.held() == catalogue.live_ids()


def test_a_hanging_request_times_out_and_is_retried(conn: psycopg.Connection, sim: SierraSimulator, catalogue: SimulatedCatalogue) -> None:
    harness = Harness(sim, conn, partner(options={"http": {"read_timeout": 0.5, "retries": 2, "backoff_factor": 0.01}}))
    harness.run()
    catalogue.advance_clock(60)
    catalogue.edit(3)
    sim.hang_next(seconds=5)
    _, changes, _, _ = harness.run()
    assert changes.fetched == 3 and harness.held() == catalogue.live_ids()


def test_token_is_renewed_before_it_expires(harness: Harness, catalogue: SimulatedCatalogue, sim: SierraSimulator) -> None:
    """Proactive refresh: a token near its end is replaced before use, without a 401."""
    now = [0.0]
    adapter = harness.adapter()
    adapter.client.monotonic = lambda: now[0]
    adapter.client.server_time()
    assert adapter.client.tokens_fetched == 1
    now[0] = 3600 - 59  # inside the refresh margin of a 3600 s token
    adapter.client.server_time()
    assert adapter.client.tokens_fetched == 2
    assert not [r for r in sim.requests if r["status"] == 401]


# -- a mirror that cannot silently diverge (Sierra) ----------------------------


def check_row(conn: psycopg.Connection, run_id: str = "run-1") -> tuple[Any, ...]:
    row = one(conn.execute(
        "SELECT check_kind, check_expected, check_found, check_ok, check_detail FROM harvest_runs"
        " WHERE partner_id = 'library' AND run_id = %s AND channel = 'changes'", (run_id,)))
    conn.commit()
    return row


def suppressed_live(catalogue: SimulatedCatalogue) -> set[str]:
    return {b.id for b in catalogue.bibs(int(i) for i in catalogue.sorted_live_ids()) if b.suppressed}


@pytest.mark.parametrize("limit", [2000, 5000])
def test_full_load_with_deleted_and_suppressed_bibs_in_every_block_holds_the_live_set(conn: psycopg.Connection, limit: int) -> None:
    """Real blocks hold deleted bibs (outputRecords < inputRecords): the export must not stop
    after the first block, also when options.export.limit exceeds Sierra's 2000."""
    catalogue = SimulatedCatalogue(bibs=6000, deleted_fraction=0.05, suppressed_fraction=0.03, seed=21)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": limit, "rate_limit_wait": 0}}))
        _, changes, _, result = harness.run()
        live = catalogue.live_ids()
        assert harness.held() == live and result.upserted == len(live)
        exports = [r for r in sim.requests if r["path"].endswith("/bibs/marc")]
        assert len(exports) == 4 and exports[-1]["status"] == 404  # 3 blocks of 2000, then 404/107
        assert {r["query"]["limit"] for r in exports} == {"2000"}
        kind, expected, found, ok, detail = check_row(conn)
        assert (kind, expected, found, ok) == ("sierra-id-enumeration", len(live), len(live), True)
        assert detail.startswith("fetched 0 missing of 0")


@pytest.mark.parametrize("deleted_field", ["nonzero", "always", "never"])
def test_a_block_of_only_deleted_bibs_is_not_the_end_of_the_export(conn: psycopg.Connection, deleted_field: str) -> None:
    catalogue = SimulatedCatalogue(bibs=500, deleted_fraction=0.0, suppressed_fraction=0.0, seed=22)
    catalogue.delete_ids(str(n) for n in range(1000101, 1000301))  # blocks 2 and 3 (limit 100): all deleted
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, deleted_records_field=deleted_field) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        assert harness.held() == catalogue.live_ids() and len(catalogue.live_ids()) == 300
        starts = [r["query"]["id"] for r in sim.requests if r["path"].endswith("/bibs/marc")]
        assert starts == ["[0,]", "[1000101,]", "[1000201,]", "[1000301,]", "[1000401,]", "[1000501,]"]
        _, expected, found, ok, _ = check_row(conn)
        assert expected == found == 300 and ok  # the export itself delivered everything
        id_list_fetches = [r for r in sim.requests if r["path"].endswith("/bibs") and not r["query"]["id"].startswith("[")]
        assert id_list_fetches == []  # nothing left for the completeness fix-up


def test_suppressed_bibs_the_export_omits_are_found_and_fetched_in_batches(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=1200, deleted_fraction=0.05, suppressed_fraction=0.05, seed=23)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, export_omits_suppressed=True) as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": 2000, "rate_limit_wait": 0}}))
        harness.run()
        live, suppressed = catalogue.live_ids(), suppressed_live(catalogue)
        assert suppressed and harness.held() == live  # the mirror holds suppressed bibs too
        kind, expected, found, ok, detail = check_row(conn)
        assert (expected, found, ok) == (len(live), len(live) - len(suppressed), True)
        assert detail.startswith(f"fetched {len(suppressed)} missing of {len(suppressed)}")
        fetches = [r["query"] for r in sim.requests
                   if r["path"].endswith("/bibs") and not r["query"]["id"].startswith("[")]
        assert len(fetches) == -(-len(suppressed) // 25)  # id lists of 25, never one by one
        assert sorted(i for q in fetches for i in q["id"].split(",")) == sorted(suppressed)
        assert scalar(conn.execute("SELECT count(*) FROM reconcile_ids")) == 0  # check's ids cleared


def test_bibs_without_005_or_without_ids_do_not_stop_the_full_load(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.0, seed=24, no_005_every=7, no_id_every=11)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        window, *_ = harness.run()
        no_ids = {b for b in catalogue.live_ids() if catalogue.lacks_ids(int(b))}
        no_005 = {b for b in catalogue.live_ids() if catalogue.lacks_005(int(b))} - no_ids
        # A bib without 001 (and here without 907) has no id in the export: that export record is
        # quarantined; the completeness check fetches the bib by its Sierra id, which identifies it,
        # and it lands with the marc.no_001 warning.
        assert no_ids and no_005 and harness.held() == catalogue.live_ids()
        warned: dict[str, Any] = dict(conn.execute("SELECT identifier, warnings FROM records WHERE warnings IS NOT NULL").fetchall())
        assert set(warned) == no_ids and all(set(w) == {"marc.no_001"} for w in warned.values())
        stamps: dict[str, Any] = dict(conn.execute("SELECT identifier, datestamp FROM records WHERE identifier = ANY(%s)",
                                   (sorted(no_005),)).fetchall())
        assert set(stamps) == no_005 and set(stamps.values()) == {window.until}  # no 005: the window's until
        reasons = conn.execute("SELECT identifier, reason FROM quarantine").fetchall()
        from_export = [(i, r) for i, r in reasons if i.startswith("(no bib id")]
        assert len(from_export) == len(no_ids) and all("neither 907 $a nor 001" in r for _, r in from_export)
        # ... and the completeness check found them missing and fetched them through the JSON API
        assert {i for i, r in reasons if not i.startswith("(")} == set()
        _, expected, found, ok, detail = check_row(conn)
        assert ok and found == expected - len(no_ids) and detail.startswith(f"fetched {len(no_ids)} missing")


def test_marc8_records_are_converted_not_replaced(conn: psycopg.Connection) -> None:
    from include.simulators.sierra import marc_in_json
    from partner_harvest.sierra import marc as sierra_marc

    catalogue = SimulatedCatalogue(bibs=200, deleted_fraction=0.0, seed=25, marc8_every=3)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        _, changes, _, result = harness.run()
        assert result.quarantined == 0 and harness.held() == catalogue.live_ids()
        assert scalar(conn.execute("SELECT count(*) FROM records WHERE metadata LIKE %s", ("%\ufffd%",))) == 0
        marc8 = [catalogue[b] for b in sorted(catalogue.live_ids()) if catalogue.is_marc8(int(b))]
        assert marc8 and all(not b.title.isascii() for b in marc8)
        for bib in marc8:
            title, metadata = one(conn.execute("SELECT title, metadata FROM records WHERE identifier = %s",
                                           (bib.id,)))
            assert title.startswith(bib.title)
            # the converted export record is the same bib the JSON API serves, byte for byte
            from_json = sierra_marc.to_item(sierra_marc.from_marc_json(marc_in_json(bib, zero_leader=True)),
                                            bib.id, bib.updated_date)
            assert metadata == as_record(from_json).metadata


def test_invalid_utf8_or_marc8_is_quarantined_with_the_raw_bytes_escaped(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=200, deleted_fraction=0.0, seed=26, bad_utf8_every=13, marc8_every=2)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        bad = {b for b in catalogue.live_ids() if catalogue.has_bad_utf8(int(b))}
        bad_marc8 = {b for b in bad if catalogue.is_marc8(int(b))}
        assert bad_marc8 and bad - bad_marc8 and harness.held() == catalogue.live_ids() - bad
        rows = conn.execute("SELECT identifier, reason, raw_payload FROM quarantine").fetchall()
        assert {r[0] for r in rows} == bad
        for identifier, reason, raw in rows:
            charset = "MARC-8" if identifier in bad_marc8 else "UTF-8"
            assert f"invalid {charset}" in reason and "\\xff" in raw and "\ufffd" not in raw
        assert scalar(conn.execute("SELECT count(*) FROM records WHERE metadata LIKE %s", ("%\ufffd%",))) == 0


def test_an_edit_at_the_last_second_of_a_day_loses_to_a_deletion_that_day(conn: psycopg.Connection, sim: SierraSimulator,
                                                                          catalogue: SimulatedCatalogue) -> None:
    """Deletion on D = D 23:59:59.999999: beats an edit stamped D 23:59:59 in the same run."""
    harness = Harness(sim, conn, partner(lag=timedelta(0)))
    harness.run()
    day_end = datetime.combine(catalogue.clock.date() + timedelta(days=1), datetime.min.time(), tzinfo=timezone.utc)
    catalogue.advance_clock(day_end - catalogue.clock - timedelta(seconds=2))
    catalogue.mutation_step = timedelta(seconds=1)
    live = sorted(catalogue.live_ids())
    victim = live[5]
    catalogue.edit_ids(live[:5] + [victim])  # the victim is staged 6th on the changes channel
    assert catalogue[victim].updated_date == catalogue.clock == day_end - timedelta(seconds=1)
    catalogue.mutation_step = timedelta(0)

    def delete_on_the_same_day() -> None:  # after the change poll saw the edit
        catalogue.delete_ids([victim])
        assert str(catalogue[victim].deleted_date) == str((day_end - timedelta(days=1)).date())

    _, changes, deletions, result = harness.run(between=delete_on_the_same_day)
    assert changes.records == 6 and 1 <= deletions.tombstones < 6  # the tombstone's seq is lower than the edit's
    assert victim not in harness.held() and harness.held() == catalogue.live_ids()


def test_a_legacy_edit_stamped_the_next_midnight_beats_an_earlier_applied_deletion(harness: Harness, catalogue: SimulatedCatalogue,
                                                                                   conn: psycopg.Connection) -> None:
    from partner_harvest.records import HarvestStats, Record
    from partner_harvest.sierra.harvester import end_of_day
    from partner_harvest.store import StagingWriter, apply_run, begin_run, finish_harvest

    harness.run()
    victim = sorted(catalogue.live_ids())[0]
    xml = scalar(conn.execute("SELECT metadata FROM records WHERE identifier = %s", (victim,)))
    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    window = Window("incremental", day, day + timedelta(days=2), "seconds", True)
    for run_id, channel, item in (("gone", "deletions", Tombstone(victim, end_of_day(day.date()))),
                                  ("back", "changes", Record(victim, day + timedelta(days=1), "marc21", xml, (), "again"))):
        run = RunRef("library", run_id, channel)
        begin_run(conn, run, window, "marc21")
        StagingWriter(conn, run).write_page([item])
        finish_harvest(conn, run, HarvestStats(pages=1, fetched=1))
        apply_run(conn, "library", run_id)
        assert (victim in harness.held()) == (run_id == "back")


class _RecordingListener:
    """A loopback HTTP listener that records every request it gets (the foreign file host)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: list[dict[str, Any]] = []
        self.requests = seen

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                seen.append({"method": self.command, "path": self.path, "authorization": self.headers.get("Authorization")})
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_DELETE = do_POST = do_PUT = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _RecordingListener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_export_file_on_another_origin_never_gets_our_token_or_a_delete(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.05, seed=27)
    with _RecordingListener() as foreign, SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET,
                                                          file_origin=foreign.origin) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        assert not any(r["authorization"] for r in foreign.requests)
        assert not any(r["method"] == "DELETE" for r in foreign.requests)
        assert foreign.requests == []  # nothing at all goes there
        assert harness.held() == catalogue.live_ids() and not sim.open_export_files
        assert [r["method"] for r in sim.requests if "/bibs/marc/files/" in r["path"]].count("DELETE") == 3


def test_export_query_parameters_come_only_from_options_export_params(conn: psycopg.Connection, sim: SierraSimulator,
                                                                      catalogue: SimulatedCatalogue) -> None:
    options = {"export": {"limit": 200, "rate_limit_wait": 0, "max_rate_limit_waits": 1,
                          "params": {"mapping": "toc"}}}
    with pytest.raises(RegistryError, match="options.export.locations"):  # a query key outside params
        partner(options={"export": {**options["export"], "locations": "main"}})
    harness = Harness(sim, conn, partner(options=options))
    harness.run()
    exports = [r["query"] for r in sim.requests if r["path"].endswith("/bibs/marc")]
    assert exports and all(q.get("mapping") == "toc" and "locations" not in q and "params" not in q for q in exports)
    assert harness.held() == catalogue.live_ids()
    with pytest.raises(RegistryError, match="id are set by the harvester"):  # the registry refuses it first
        Harness(sim, conn, partner(options={"export": {"params": {"id": "[1,2]"}}})).adapter()


def test_a_bib_deleted_between_the_listing_and_the_fetch_is_staged_as_a_deletion(conn: psycopg.Connection,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    catalogue = SimulatedCatalogue(bibs=400, deleted_fraction=0.02, suppressed_fraction=0.05, seed=28)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, export_omits_suppressed=True) as sim:
        harness = Harness(sim, conn, partner())
        victim = sorted(suppressed_live(catalogue))[0]
        make_adapter = harness.adapter

        def adapter_that_sees_a_deletion_after_the_listing() -> Any:
            adapter = make_adapter()
            pages = adapter.client.bib_pages

            def listing(params: dict[str, str], limit: int, start_id: int = 0, end_id: int | None = None) -> Iterator[Any]:
                yield from pages(params, limit, start_id, end_id)
                if params.get("fields") == "id":
                    catalogue.delete_ids([victim])

            monkeypatch.setattr(adapter.client, "bib_pages", listing)
            return adapter

        monkeypatch.setattr(harness, "adapter", adapter_that_sees_a_deletion_after_the_listing)
        harness.run()
        assert victim not in harness.held() and harness.held() == catalogue.live_ids()
        _, expected, found, ok, detail = check_row(conn)
        assert ok and "1 deleted since they were listed" in detail


@pytest.mark.parametrize("style", ["138", "429"])
def test_a_long_rate_limit_frees_the_task_and_the_next_try_resumes_at_the_stopped_block(conn: psycopg.Connection, style: str) -> None:
    """A rate limit longer than a task may sleep raises PartnerAsksToWait at once (no sleep);
    the next try of the same run keeps what was staged and asks only for the blocks not yet exported."""
    catalogue = SimulatedCatalogue(bibs=1000, deleted_fraction=0.05, suppressed_fraction=0.03, seed=31)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": 100, "max_sleep_seconds": 30}}))
        adapter = harness.adapter()
        run = RunRef("library", "run-1", "changes")
        window = pipeline.freeze_window(adapter, harness.partner.lag, None, pipeline.RunRequest("incremental"),
                                        {"deletions": None})
        sim.rate_limit_once(after=4, seconds=3600, style=style)  # the 5th block of 10
        before = datetime.now(timezone.utc)
        with pytest.raises(PartnerAsksToWait) as waited:
            pipeline.harvest_window(adapter, conn, run, window)
        assert harness.sleeps == []  # the wait did not happen in the task
        assert waited.value.resume_at >= before + timedelta(seconds=3600)
        staged = scalar(conn.execute("SELECT count(*) FROM staging WHERE run_id = 'run-1'"))
        assert staged > 0
        status, error = one(conn.execute("SELECT status, error FROM harvest_runs WHERE run_id = 'run-1'"
                                     " AND channel = 'changes'"))
        assert status == "waiting" and "resuming at" in error  # not "failed": the health page shows it running

        resumed = pipeline.harvest_window(harness.adapter(), conn, run, window)  # the rescheduled try
        assert resumed.fetched == len(catalogue.live_ids())
        exports = [r for r in sim.requests if r["path"].endswith("/bibs/marc")]
        served = [r for r in exports if r["status"] == 200]
        assert len([r for r in exports if r["status"] in (429, 500)]) == 1  # the one rate-limited request
        starts = [r["query"]["id"] for r in served]
        assert len(starts) == len(set(starts))  # no block exported twice
        assert len(served) <= 10 + 1  # 10 blocks of 100 ids; +1: the resumed keyset starts after the highest staged id
        stage_channel(adapter, conn, "run-1", window, "deletions")
        result = pipeline.apply_changes(conn, "library", "run-1")
        assert harness.held() == catalogue.live_ids() and result.upserted == len(catalogue.live_ids())
        check = conn.execute("SELECT check_ok, fetched FROM harvest_runs WHERE run_id = 'run-1' AND channel = 'changes'"
                             ).fetchone()
        assert check == (True, len(catalogue.live_ids()))


def test_a_new_window_for_the_same_run_does_not_keep_the_old_staging(conn: psycopg.Connection) -> None:
    """Staging is kept only for another try of the same frozen window, never across windows."""
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.0, seed=32)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner(options={"export": {"limit": 100}}))
        adapter = harness.adapter()
        run = RunRef("library", "run-1", "changes")
        window = pipeline.freeze_window(adapter, harness.partner.lag, None, pipeline.RunRequest("incremental"), {})
        sim.rate_limit_once(after=1)
        with pytest.raises(PartnerAsksToWait):
            pipeline.harvest_window(adapter, conn, run, window)
        catalogue.advance_clock(3600)
        later = pipeline.freeze_window(adapter, harness.partner.lag, None, pipeline.RunRequest("incremental"), {})
        assert later.until != window.until
        stats = pipeline.harvest_window(harness.adapter(), conn, run, later)
        starts = [r["query"]["id"] for r in sim.requests if r["path"].endswith("/bibs/marc") and r["status"] == 200]
        assert starts.count(starts[0]) == 2  # the export started over from the first block
        assert stats.fetched == len(catalogue.live_ids())


def test_a_rate_limit_on_the_change_poll_frees_the_task_too(harness: Harness, sim: SierraSimulator, catalogue: SimulatedCatalogue) -> None:
    """The transport no longer sleeps Sierra's 429/138 waits; outside the export the task is rescheduled."""
    harness.run()
    catalogue.advance_clock(3600)
    catalogue.edit(5)
    sim.fail_next(1, 500, {"code": 138, "specificCode": 0, "httpStatus": 500, "name": "Rate exceeded for endpoint",
                           "description": "Rate exceeded for endpoint. Try again in 20 minutes"},
                  path_prefix="updatedDate")
    before = datetime.now(timezone.utc)
    with pytest.raises(PartnerAsksToWait) as waited:
        harness.run()
    assert waited.value.resume_at >= before + timedelta(minutes=20) and harness.sleeps == []
    harness.run()
    assert harness.held() == catalogue.live_ids()


def test_a_gateway_503_asking_for_a_long_wait_frees_the_task_instead_of_sleeping(harness: Harness, sim: SierraSimulator,
                                                                                 catalogue: SimulatedCatalogue) -> None:
    """A 503 with Retry-After (a gateway in maintenance) longer than a task may sleep
    (options.http.max_wait_in_task, default 60 s) reschedules; urllib3 would have slept it."""
    harness.run()
    catalogue.advance_clock(3600)
    catalogue.edit(5)
    sim.fail_next(1, 503, {"message": "maintenance"}, path_prefix="updatedDate", retry_after=240)
    before = datetime.now(timezone.utc)
    with pytest.raises(PartnerAsksToWait) as waited:
        harness.run()
    after = datetime.now(timezone.utc)
    assert "HTTP 503 with Retry-After 240 s" in str(waited.value) and "updatedDate" in str(waited.value)
    assert before + timedelta(seconds=240) <= waited.value.resume_at <= after + timedelta(seconds=240)
    assert harness.sleeps == []
    harness.run()
    assert harness.held() == catalogue.live_ids()
