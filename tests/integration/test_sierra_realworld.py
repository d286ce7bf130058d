"""Responses recorded from real Sierra servers, replayed on loopback, harvested into PostgreSQL.

Every case's expected outcome is written from the API's documented behaviour and MARC 21,
not from our code: a bib is identified by its Sierra id (the list entry's ``id``, the
export's 907 $a), so it lands whether or not it carries a 001; a MARC-in-JSON leader
is the 24 positions MARC 21 defines, and an empty one is rebuilt (MARC-in-JSON
responses come with computed positions zeroed anyway); a bib without a 245 title cannot
be shown and stays a reject; deleted stubs (``deleted: true``, ``deletedDate``) are
deletions on that day; 404 code 107 is "no results"; 401 means "get a new token".

A bib without a 001, or with an empty leader, lands (identified by its Sierra id; the
leader rebuilt, with a warning): docs/operator/validation.md. The corpus: SOURCES.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import psycopg
import pytest

from partner_harvest import pipeline
from partner_harvest.errors import HarvestError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.run import run_partner
from partner_harvest.sierra.harvester import end_of_day
from tests.integration.sierra_replay import ExportRecord, Replay, ReplayServer, export_records, recorded, wiremock_body
from tests.support.harness import SIERRA_KEY as KEY
from tests.support.harness import SIERRA_SECRET as SECRET
from tests.support.partners import sierra_partner as partner

SINCE = datetime(2025, 11, 1, tzinfo=timezone.utc)  # a cursor before the replay's Date


@dataclass
class Outcome:
    records: dict[str, datetime]
    quarantine: dict[str, str]
    tombstones: dict[str, datetime]
    error: str | None
    requests: list


_OUTCOMES: dict[str, Outcome] = {}


def _read(conn: psycopg.Connection, error: str | None, requests: list) -> Outcome:
    q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    out = Outcome(dict(q("SELECT identifier, datestamp FROM records WHERE partner_id = 'library'")),
                  dict(q("SELECT identifier, reason FROM quarantine WHERE partner_id = 'library'")),
                  dict(q("SELECT identifier, datestamp FROM tombstones WHERE partner_id = 'library'")),
                  error, list(requests))
    conn.commit()
    return out


def change_poll(conn: psycopg.Connection, replay: Replay, run_id: str = "run-1") -> Outcome:
    """One incremental run (change poll, deletion poll, apply) against the replay. The window
    is frozen from SINCE by hand: a fresh database would not trust a cursor (resume_point)."""
    p = partner()
    error = None
    with ReplayServer(replay) as server:
        adapter = build_adapter(p, Endpoint(server.base_url, KEY, SECRET))
        window = pipeline.freeze_window(adapter, p.lag, SINCE, pipeline.RunRequest("incremental"),
                                        {"deletions": SINCE})
        try:
            run_partner(p, adapter, conn, run_id, window=window)
        except HarvestError as exc:
            conn.rollback()
            error = str(exc)
    return _read(conn, error, replay.requests)


def full_load(conn: psycopg.Connection, replay: Replay, limit: int = 100) -> Outcome:
    p = partner(options={"export": {"limit": limit, "rate_limit_wait": 0}})
    error = None
    with ReplayServer(replay) as server:
        adapter = build_adapter(p, Endpoint(server.base_url, KEY, SECRET))
        window = pipeline.freeze_window(adapter, p.lag, None, pipeline.RunRequest("full"))
        try:
            run_partner(p, adapter, conn, "run-1", window=window)
        except HarvestError as exc:
            conn.rollback()
            error = str(exc)
    return _read(conn, error, replay.requests)


def outcome(conn: psycopg.Connection, scenario: str) -> Outcome:
    """Each scenario is harvested once (in the first test that needs it); its cases read it."""
    if scenario not in _OUTCOMES:
        _OUTCOMES[scenario] = SCENARIOS[scenario](conn)
    return _OUTCOMES[scenario]


def stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


NYPL_FILES = ("nypl-export/test_has_bnumber.mrc", "nypl-export/test_multiple_items.mrc",
              "nypl-export/test_no_001_no_991.mrc", "nypl-export/test_has_oclc.mrc",
              "nypl-export/test_too_large_record.mrc", "nypl-export/test_a_lot_of_items.mrc",
              "nypl-export/test_multiple_866_2.mrc")

SCENARIOS = {
    "sandbox-10": lambda conn: change_poll(conn, Replay(changes=(200, recorded("dcb-sandbox/bibs-slice-0-9.json")))),
    "sandbox-3": lambda conn: change_poll(conn, Replay(changes=(200, recorded("dcb-sandbox/bibs-slice-0-2.json")))),
    "sandbox-deleted": lambda conn: change_poll(conn, Replay(deletions=(200, recorded("dcb-sandbox/sierra-api-deleted.json")))),
    "sandbox-no-marc": lambda conn: change_poll(conn, Replay(changes=(200, recorded("dcb-sandbox/sierra-api-offset.json")))),
    "sandbox-no-dates": lambda conn: change_poll(
        conn, Replay(changes=(200, recorded("dcb-sandbox/sierra-api-GET-bibs-success-response.json")))),
    "sandbox-400-130": lambda conn: change_poll(conn, Replay(changes=(400, recorded("dcb-sandbox/json-error.json")))),
    "wellcome-stubs": lambda conn: change_poll(
        conn, Replay(token=wiremock_body("wellcome/mappings/token-8be78772-0670-4bf7-bc54-dd9997eb6c74.json")[1],
                     changes=wiremock_body("wellcome/mappings/bibs-56afed67-47e7-4cf7-ad12-264ab5944e84.json"))),
    "wellcome-mixed": lambda conn: change_poll(
        conn, Replay(changes=wiremock_body("wellcome/mappings/bibs-98489466-8f22-4559-8d26-19ba2c013dea.json"))),
    "wellcome-107": lambda conn: change_poll(conn, Replay()),
    "wellcome-401-113": lambda conn: change_poll(
        conn, Replay(changes=(200, recorded("dcb-sandbox/bibs-slice-0-9.json")),
                     first_bibs_401=wiremock_body("wellcome/mappings/token_refresh-1-unauthorized.json")[1])),
    "nypl-export": lambda conn: full_load(conn, Replay(export=export_records(*NYPL_FILES)), limit=2),
    "nypl-export-135": lambda conn: full_load(conn, Replay(export=export_records(*NYPL_FILES), poison={11651268})),
}

SANDBOX_10 = json.loads(recorded("dcb-sandbox/bibs-slice-0-9.json"))["entries"]


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["id"]) for e in SANDBOX_10])
def test_vendor_sandbox_bibs_land_by_their_sierra_id(conn: psycopg.Connection, entry: dict[str, Any]) -> None:
    """dcb-sandbox/bibs-slice-0-9.json: MARC-in-JSON in storage order; 1000001 has no 245."""
    got = outcome(conn, "sandbox-10")
    if entry["id"] == "1000001":
        assert "title" in got.quarantine.get("1000001", "") and "1000001" not in got.records
    else:
        assert got.records.get(entry["id"]) == stamp(entry["updatedDate"]), got.quarantine.get(entry["id"])


@pytest.mark.parametrize("bib_id", ["1000001", "1000002", "1000003"])
def test_vendor_sandbox_bibs_without_updated_date_land_stamped(conn: psycopg.Connection, bib_id: str) -> None:
    """dcb-sandbox/bibs-slice-0-2.json: no ``updatedDate`` in the entries; identified by id."""
    got = outcome(conn, "sandbox-3")
    if bib_id == "1000001":
        assert "title" in got.quarantine.get(bib_id, "")
    else:
        assert bib_id in got.records, got.quarantine.get(bib_id)


@pytest.mark.parametrize("entry", json.loads(recorded("dcb-sandbox/sierra-api-deleted.json"))["entries"],
                         ids=lambda e: e["id"])
def test_deleted_stubs_are_deletions_on_their_day(conn: psycopg.Connection, entry: dict[str, Any]) -> None:
    got = outcome(conn, "sandbox-deleted")
    assert got.error is None
    assert got.tombstones.get(entry["id"]) == end_of_day(date.fromisoformat(entry["deletedDate"]))


def test_a_2017_change_window_of_deleted_stubs_without_start_is_all_deletions(conn: psycopg.Connection) -> None:
    """wellcome bibs-56afed67: 28 stubs and one suppressed bib (default fields: no ``marc``), no
    ``start`` in the body, answered to an updatedDate window."""
    body = json.loads(json.loads(recorded("wellcome/mappings/bibs-56afed67-47e7-4cf7-ad12-264ab5944e84.json"))
                      ["response"]["body"])
    got = outcome(conn, "wellcome-stubs")
    stubs = [e for e in body["entries"] if e.get("deleted")]
    assert got.error is None and not got.records and len(stubs) == 28
    assert got.tombstones == {e["id"]: end_of_day(date.fromisoformat(e["deletedDate"])) for e in stubs}
    assert set(got.quarantine) == {"2043097"} and "marc" in got.quarantine["2043097"]


def test_a_page_mixing_stubs_and_bibs_without_marc(conn: psycopg.Connection) -> None:
    """wellcome bibs-98489466: 50 entries, deleted stubs among live bibs that came without ``marc``
    (the server answered default fields): stubs are deletions, the others cannot be stored."""
    body = json.loads(recorded("wellcome/__files/bibs-98489466-8f22-4559-8d26-19ba2c013dea.json"))
    got = outcome(conn, "wellcome-mixed")
    deleted = {e["id"] for e in body["entries"] if e.get("deleted")}
    assert got.error is None and set(got.tombstones) == deleted and not got.records
    assert set(got.quarantine) == {e["id"] for e in body["entries"]} - deleted
    assert all("marc" in reason for reason in got.quarantine.values())


def test_a_bib_without_marc_is_quarantined_by_id(conn: psycopg.Connection) -> None:
    got = outcome(conn, "sandbox-no-marc")
    assert set(got.quarantine) == {"1000002"} and "marc" in got.quarantine["1000002"]


def test_bibs_without_updated_date_or_marc_are_quarantined_by_id(conn: psycopg.Connection) -> None:
    got = outcome(conn, "sandbox-no-dates")
    assert set(got.quarantine) == {"1000002", "1000003", "1000004"}  # no marc either: nothing to show
    assert all("marc" in r for r in got.quarantine.values())


def test_a_400_code_130_fails_the_run_naming_the_code(conn: psycopg.Connection) -> None:
    got = outcome(conn, "sandbox-400-130")
    assert got.error and "code 130" in got.error and "library" in got.error and "/bibs" in got.error
    assert "\n" not in got.error and not got.records


def test_404_code_107_is_an_empty_window(conn: psycopg.Connection) -> None:
    got = outcome(conn, "wellcome-107")
    assert got.error is None and not got.records and not got.quarantine and not got.tombstones


@pytest.mark.parametrize("scenario", ["sandbox-10", "wellcome-stubs"], ids=["dcb-token", "wellcome-token"])
def test_recorded_token_responses_are_used(conn: psycopg.Connection, scenario: str) -> None:
    got = outcome(conn, scenario)
    tokens = [r for r in got.requests if r[1].endswith("v6/token")]
    assert got.error is None and len(tokens) == 1


def test_a_401_code_113_gets_one_fresh_token_and_the_run_goes_on(conn: psycopg.Connection) -> None:
    got = outcome(conn, "wellcome-401-113")
    assert got.error is None
    assert [r[1] for r in got.requests].count("/iii/sierra-api/v6/token") == 2
    assert "1000004" in got.records


NYPL = export_records(*NYPL_FILES)


@pytest.mark.parametrize("rec", [pytest.param(r, id=str(r.bib_id))
                                 for r in NYPL])
def test_nypl_export_records_with_8_digit_ids_land(conn: psycopg.Connection, rec: ExportRecord) -> None:
    """NYPL's ISO 2709 export: 907 $a .b116512684 and the like, 001s such as NYPG92-S7029."""
    got = outcome(conn, "nypl-export")
    assert got.error is None
    assert str(rec.bib_id) in got.records, got.quarantine.get(str(rec.bib_id))


def test_the_nypl_export_goes_block_by_block_to_its_end(conn: psycopg.Connection) -> None:
    """limit 2: four blocks. Every bib comes through bibs/marc, none through the id-list fetch."""
    got = outcome(conn, "nypl-export")
    summaries = [r for r in got.requests if r[1].endswith("/bibs/marc")]
    listed_fetches = [r for r in got.requests if r[1].endswith("/bibs") and "," in r[2].get("id", "[")
                      and not r[2]["id"].startswith("[")]
    assert len(summaries) == 5 and not listed_fetches, (summaries, listed_fetches)


def test_a_recorded_135_isolates_the_bib_and_fetches_it_through_get_bibs(conn: psycopg.Connection) -> None:
    """brown/bibs-marc-500-135.json answered for every block holding bib 11651268."""
    got = outcome(conn, "nypl-export-135")
    assert got.error is None
    assert {str(r.bib_id) for r in NYPL} - {"10700819"} <= set(got.records)
    assert "11651268" in got.records
    singles = [r for r in got.requests if r[1].endswith("/bibs") and r[2].get("id") == "11651268"]
    assert singles  # fetched by itself
