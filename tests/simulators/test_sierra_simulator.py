"""Tests for the loopback Sierra REST API simulator.

One test (or a few) per production behaviour the simulator reproduces (see its server.py), plus
auth, keyset paging, the two-phase export and mutations. Everything runs on
the simulator's own clock: no sleeps, no wall-clock dates.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit

import pymarc
import pytest
import requests

from include.simulators.sierra import (
    MAX_RECORD_BYTES,
    BibQuery,
    SierraSimulator,
    SimulatedCatalogue,
    bib_marc,
    check_digit,
    encode,
    export_record,
    marc_fields,
    marc_in_json,
)
from include.simulators.sierra.marc import leader_for

ROOT = Path(__file__).resolve().parents[2]

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
NOT_FOUND = {"code": 107, "specificCode": 0, "httpStatus": 404, "name": "Record not found"}


# --------------------------------------------------------------------- helpers
def make_catalogue(**overrides: object) -> SimulatedCatalogue:
    options: dict[str, object] = dict(bibs=600, deleted_fraction=0.05, suppressed_fraction=0.1,
                                      oversized_every=100, invalid_every=75)
    options.update(overrides)
    return SimulatedCatalogue(**options)  # type: ignore[arg-type]


@pytest.fixture
def catalogue() -> SimulatedCatalogue:
    return make_catalogue()


@pytest.fixture
def sim(catalogue: SimulatedCatalogue) -> Iterator[SierraSimulator]:
    with SierraSimulator(catalogue) as simulator:
        yield simulator


def login(sim: SierraSimulator, session: requests.Session | None = None) -> requests.Session:
    session = session or requests.Session()
    response = session.post(f"{sim.base_url}/token", auth=(sim.client_key, sim.client_secret),
                            data={"grant_type": "client_credentials"})
    assert response.status_code == 200, response.text
    session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"
    return session


@pytest.fixture
def client(sim: SierraSimulator) -> Iterator[requests.Session]:
    with login(sim) as session:
        yield session


def get(client: requests.Session, sim: SierraSimulator, path: str, **params: str | int) -> requests.Response:
    return client.get(f"{sim.base_url}{path}", params=params)


def ids_of(response: requests.Response) -> list[str]:
    return [entry["id"] for entry in response.json()["entries"]]


def read_marc(data: bytes) -> list[pymarc.Record]:
    return list(pymarc.MARCReader(io.BytesIO(data), to_unicode=True, force_utf8=True))


def sierra_id(record: pymarc.Record) -> str:
    """The bib id from 907 $a (".b1000001x" -> "1000001")."""
    return record["907"]["a"][2:-1]


# ------------------------------------------------------------------ catalogue
def test_catalogue_is_deterministic_and_spread_over_the_year() -> None:
    a, b = make_catalogue(), make_catalogue()
    assert [a.get(i) for i in a.sorted_live_ids()] == [b.get(i) for i in b.sorted_live_ids()]
    bibs = a.bibs(range(a.first_id, a.last_id + 1))
    assert [bib.id for bib in bibs] == [str(n) for n in range(1000001, 1000601)]
    assert all(len(bib.id) == 7 for bib in bibs)
    start = int(START.timestamp())
    assert all(start - 366 * 86400 <= bib.created <= bib.updated < start for bib in bibs)
    updated = [bib.updated for bib in bibs]
    assert updated != sorted(updated)  # not in id order
    assert a.counts() == {"live": 570, "deleted": 30, "total": 600}
    assert len([bib for bib in bibs if bib.suppressed]) == 60
    assert any(not bib.title.isascii() for bib in bibs)
    assert SimulatedCatalogue(bibs=600, seed=2).get("1000001") != a.get("1000001")


def test_catalogue_of_100k_answers_keyset_and_window_queries() -> None:
    """How fast it builds and answers is measured by the benchmarks that use it
    (benchmarks/sierra_full_load.py), not asserted here against the wall clock."""
    catalogue = SimulatedCatalogue(bibs=100_000)
    page = catalogue.select(BibQuery(id_low=1_050_000, deleted=False), limit=2000)
    window = catalogue.select(BibQuery(updated=(int(START.timestamp()) - 3600, 2**40)), limit=2000)
    assert len(page) == 2000 and page == sorted(page) and page[0] >= 1_050_000
    assert window == sorted(window)


def test_mutations_edit_delete_add() -> None:
    catalogue = make_catalogue()
    edited = catalogue.edit(3)
    assert catalogue.clock == START + timedelta(seconds=60)
    for bib_id in edited:
        bib = catalogue[bib_id]
        assert bib.version == 2 and bib.updated_date == catalogue.clock and "(revision 1)" in bib.title
    before = {bib_id: catalogue[bib_id].updated for bib_id in sorted(catalogue.live_ids())[:5]}
    deleted = catalogue.delete_ids(before)
    assert catalogue.clock == START + timedelta(seconds=120)
    for bib_id in deleted:
        bib = catalogue[bib_id]
        assert bib.deleted and bib.updated == before[bib_id]  # deleting does not bump updatedDate
        assert bib.deleted_date == catalogue.clock.date()
    assert set(deleted) <= catalogue.deleted_ids() and not set(deleted) & catalogue.live_ids()
    with pytest.raises(ValueError):
        catalogue.edit_ids(deleted[:1])  # never undeleted, never edited once gone
    with pytest.raises(ValueError):
        catalogue.delete_ids(deleted[:1])
    added = catalogue.add(2)
    assert added == ["1000601", "1000602"]
    assert catalogue["1000601"].created_date == catalogue.clock == START + timedelta(seconds=180)
    assert len(catalogue.delete(4)) == 4 and catalogue.counts()["deleted"] == 30 + 5 + 4
    catalogue.advance_clock(30)
    assert catalogue.clock == START + timedelta(seconds=270)
    with pytest.raises(ValueError):
        catalogue.advance_clock(-1)
    again = make_catalogue()
    assert again.edit(3) == edited  # same seed, same choices


# ------------------------------------------------------------------------ MARC
def test_changes_after_a_clock_rewind_are_found_by_updated_and_created_windows() -> None:
    """The soak (seed 5, clock_behind_cursor) found it: the timestamp indexes assumed the
    clock never goes back, so after a rewind bisect missed edits and adds stamped earlier
    than the last entry, and the change poll silently skipped them."""
    catalogue = SimulatedCatalogue(bibs=2_000, seed=3)
    catalogue.advance_clock(timedelta(hours=5))
    catalogue.edit(40)  # the index's last entries: stamps after the rewound clock
    catalogue.rewind_clock(timedelta(hours=26))
    since = int(catalogue.clock.timestamp())
    edited, added = catalogue.edit(5), catalogue.add(3)
    until = int(catalogue.clock.timestamp())
    window = catalogue.select(BibQuery(updated=(since, until)))
    created = catalogue.select(BibQuery(created=(since, until)))
    assert {str(n) for n in window} == set(edited) | set(added)
    assert {str(n) for n in created} == set(added)


def test_marc_record_content_and_fast_encoder_matches_pymarc(catalogue: SimulatedCatalogue) -> None:
    bib = catalogue["1000001"]
    record = bib_marc(bib)
    assert record["001"].data == "b1000001"
    assert record["005"].data == bib.updated_date.strftime("%Y%m%d%H%M%S.0")
    assert len(record["008"].data or "") == 40
    assert record["245"]["a"] == bib.title
    assert record["100"]["a"].startswith(bib.author)
    imprint = record.get("264") or record.get("260")
    assert imprint is not None and imprint["c"] == f"{bib.publish_year}."
    assert record["907"]["a"] == f".b1000001{check_digit(1000001)}"
    assert record["998"]["e"] == bib.bcode3
    assert len(record.get_fields("945")) == bib.items
    plain = bib_marc(bib, export=False)
    assert not {"907", "945", "998"} & {f.tag for f in plain.fields}
    for bib in catalogue.bibs(range(1000001, 1000151)):
        data, truncated = export_record(bib)
        if not truncated:
            assert data == bib_marc(bib).as_marc()
    assert check_digit(1000001) == "x" and check_digit(1234567) == "2"


def test_oversized_record_loses_its_945_tail(catalogue: SimulatedCatalogue) -> None:
    bib = catalogue["1000100"]  # oversized_every=100
    full = bib_marc(bib).as_marc()
    assert len(full) > MAX_RECORD_BYTES
    data, truncated = export_record(bib)
    assert truncated and len(data) <= MAX_RECORD_BYTES and int(data[:5]) == len(data)
    [record] = read_marc(data)
    items = record.get_fields("945")
    assert 0 < len(items) < bib.items and record.get("245") is not None
    assert [f.value() for f in items] == [f.value() for f in bib_marc(bib).get_fields("945")[: len(items)]]
    untouched, cut = encode(leader_for(bib), marc_fields(bib))
    assert untouched == full and cut == 0


def test_invalid_bib_lacks_245(catalogue: SimulatedCatalogue) -> None:
    bib = catalogue["1000075"]  # invalid_every=75
    assert bib.invalid and bib_marc(bib).get("245") is None
    assert bib_marc(catalogue["1000074"]).get("245") is not None


# ------------------------------------------------------------------ auth
def test_token_flow_and_expiry_on_the_simulated_clock(sim: SierraSimulator,
                                                      catalogue: SimulatedCatalogue) -> None:
    response = requests.post(f"{sim.base_url}/token", auth=("demo-key", "demo-secret"))  # no body at all
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json;charset=UTF-8"
    token = response.json()
    assert token["token_type"] == "bearer" and token["expires_in"] == 3600
    headers = {"Authorization": f"Bearer {token['access_token']}"}
    info = requests.get(f"{sim.base_url}/info/token", headers=headers).json()
    assert info["expiresIn"] == 3600 and info["authorizationScheme"] == "Bearer"
    catalogue.advance_clock(3599)
    assert requests.get(f"{sim.base_url}/info/token", headers=headers).json()["expiresIn"] == 1
    assert requests.get(f"{sim.base_url}/bibs", headers=headers).status_code == 200
    catalogue.advance_clock(1)
    expired = requests.get(f"{sim.base_url}/bibs", headers=headers)
    assert expired.status_code == 401
    assert expired.json() == {"code": 123, "specificCode": 0, "httpStatus": 401, "name": "Unauthorized",
                              "description": "invalid_grant"}
    assert sim.tokens_issued == 1


def test_auth_failures_give_113(sim: SierraSimulator) -> None:
    bad = requests.post(f"{sim.base_url}/token", auth=("demo-key", "wrong"))
    assert bad.status_code == 401 and bad.json()["code"] == 113
    assert bad.json()["description"] == "Invalid or missing authorization header"
    assert requests.post(f"{sim.base_url}/token").json()["code"] == 113
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Basic Zm9vOmJhcg=="},
                    {"Authorization": "garbage"}):
        response = requests.get(f"{sim.base_url}/bibs", headers=headers)
        assert response.status_code == 401 and response.json()["code"] == 113, headers
    unknown = requests.get(f"{sim.base_url}/bibs", headers={"Authorization": "Bearer nope"})
    assert unknown.status_code == 401 and unknown.json()["code"] == 123
    assert sim.tokens_issued == 0


def test_expire_tokens_mid_run_then_refresh(sim: SierraSimulator, client: requests.Session) -> None:
    assert get(client, sim, "/bibs").status_code == 200
    sim.expire_tokens()
    assert get(client, sim, "/bibs").json()["code"] == 123
    login(sim, client)  # the client rule: refresh once and retry
    assert get(client, sim, "/bibs").status_code == 200
    assert sim.tokens_issued == 2


def test_expired_token_code_120_variant(catalogue: SimulatedCatalogue) -> None:
    with SierraSimulator(catalogue, expired_token_code=120, token_lifetime=60) as sim, login(sim) as client:
        catalogue.advance_clock(60)
        body = get(client, sim, "/bibs").json()
        assert body["code"] == 120 and body["description"] == "invalid_token"


# ------------------------------------------------------- empty results
def test_empty_range_is_404_107_without_description(sim: SierraSimulator, client: requests.Session) -> None:
    response = get(client, sim, "/bibs", deleted="false",
                   updatedDate="[2030-01-01T00:00:00Z,2030-01-02T00:00:00Z]")
    assert response.status_code == 404 and response.json() == NOT_FOUND
    assert get(client, sim, "/bibs", id="[9000000,]").json() == NOT_FOUND
    assert get(client, sim, "/bibs", id="9000001,9000002").json() == NOT_FOUND


def test_empty_deletion_poll_is_200_without_total(sim: SierraSimulator, client: requests.Session) -> None:
    response = get(client, sim, "/bibs", deleted="true", deletedDate="[2030-01-01,2030-01-02]",
                   fields="id,deletedDate")
    assert response.status_code == 200 and response.json() == {"start": 0, "entries": []}


# ------------------------------------------------- total and the 2000 cap
def test_default_limit_and_total_is_page_size(sim: SierraSimulator, client: requests.Session) -> None:
    body = get(client, sim, "/bibs").json()
    assert body["total"] == len(body["entries"]) == 50 and body["start"] == 0
    body = get(client, sim, "/bibs", limit=7, offset=10).json()
    assert body["total"] == 7 and body["start"] == 10 and body["entries"][0]["id"] == "1000011"


def test_limit_is_capped_at_2000_silently() -> None:
    with SierraSimulator(SimulatedCatalogue(bibs=2600, deleted_fraction=0)) as sim, login(sim) as client:
        body = get(client, sim, "/bibs", limit=5000, fields="id").json()
        assert body["total"] == 2000 and len(body["entries"]) == 2000
        assert get(client, sim, "/bibs", limit=2000, id="[1000601,]").json()["total"] == 2000


# -------------------------------------- ascending ids, keyset paging, AND
def test_keyset_paging_is_gap_and_dup_free(sim: SierraSimulator, client: requests.Session,
                                           catalogue: SimulatedCatalogue) -> None:
    seen: list[str] = []
    cursor = 1000000
    while True:
        response = get(client, sim, "/bibs", id=f"[{cursor},]", limit=100, fields="id", deleted="false")
        if response.status_code == 404:
            break
        page = ids_of(response)
        assert page == sorted(page) and page[0] >= str(cursor)
        seen += page
        if len(page) < 100:
            break
        cursor = int(page[-1]) + 1
    assert seen == catalogue.sorted_live_ids()
    inclusive = ids_of(get(client, sim, "/bibs", id="[1000010,1000012]"))
    assert inclusive == ["1000010", "1000011", "1000012"]
    assert ids_of(get(client, sim, "/bibs", id="[,1000002]")) == ["1000001", "1000002"]
    listed = get(client, sim, "/bibs", id="1000005,1000003,1000004")
    assert ids_of(listed) == ["1000003", "1000004", "1000005"]
    assert ids_of(get(client, sim, "/bibs", id="1000009")) == ["1000009"]
    assert ids_of(get(client, sim, "/bibs", id="1000001,1000002,1000003", limit=2)) == ["1000001", "1000002"]


def test_filters_and_together(sim: SierraSimulator, client: requests.Session,
                              catalogue: SimulatedCatalogue) -> None:
    edited = catalogue.edit(20)
    window = f"[{catalogue.clock:%Y-%m-%dT%H:%M:%SZ},]"
    assert ids_of(get(client, sim, "/bibs", updatedDate=window, limit=2000)) == edited
    cursor = edited[10]
    assert ids_of(get(client, sim, "/bibs", updatedDate=window, id=f"[{cursor},]")) == edited[10:]
    suppressed = ids_of(get(client, sim, "/bibs", suppressed="true", limit=2000))
    assert suppressed and all(catalogue[i].suppressed for i in suppressed)
    both = ids_of(get(client, sim, "/bibs", suppressed="true", deleted="false", id="[,1000300]", limit=2000))
    assert both == [i for i in suppressed if not catalogue[i].deleted and i <= "1000300"]
    created = get(client, sim, "/bibs", createdDate="[2025-06-01,2025-06-30]", deleted="false",
                  limit=2000).json()["entries"]
    assert created and all("2025-06-01" <= e["createdDate"][:10] <= "2025-06-30" for e in created)


# ------------------------------------------------------ deletions
def test_deletions_are_date_only_and_hidden_from_updated_windows(
        sim: SierraSimulator, client: requests.Session, catalogue: SimulatedCatalogue) -> None:
    target = "1000200"
    catalogue.edit_ids([target])
    edited_at = catalogue.clock
    catalogue.delete_ids([target])
    window = f"[{edited_at - timedelta(seconds=1):%Y-%m-%dT%H:%M:%SZ},{catalogue.clock:%Y-%m-%dT%H:%M:%SZ}]"
    assert get(client, sim, "/bibs", updatedDate=window).status_code == 404  # the deletion is invisible here
    poll = get(client, sim, "/bibs", deleted="true", deletedDate=f"[{catalogue.clock:%Y-%m-%d},]",
               fields="id,deletedDate").json()
    assert poll["entries"] == [{"id": target, "deletedDate": "2026-01-01"}]
    stub = get(client, sim, "/bibs", id=target).json()["entries"][0]
    assert stub == {"id": target, "deletedDate": "2026-01-01", "deleted": True}
    assert catalogue[target].updated_date == edited_at
    single_day = get(client, sim, "/bibs", deletedDate="2026-01-01").json()
    assert ids_of_json(single_day) == [target]


def ids_of_json(body: dict) -> list[str]:
    return [entry["id"] for entry in body["entries"]]


def test_omitting_deleted_returns_both(sim: SierraSimulator, client: requests.Session,
                                       catalogue: SimulatedCatalogue) -> None:
    everything = get(client, sim, "/bibs", limit=2000).json()["entries"]
    assert len(everything) == 600
    deleted = [e for e in everything if e["deleted"]]
    assert {e["id"] for e in deleted} == catalogue.deleted_ids()
    assert all(set(e) == {"id", "deleted", "deletedDate"} for e in deleted)
    assert all(len(e["deletedDate"]) == 10 for e in deleted)
    live = ids_of(get(client, sim, "/bibs", limit=2000, deleted="false"))
    assert set(live) == catalogue.live_ids()


def test_legacy_mode_returns_deletion_stubs_in_updated_windows(catalogue: SimulatedCatalogue) -> None:
    with SierraSimulator(catalogue, legacy_deleted_stubs=True) as sim, login(sim) as client:
        [gone] = catalogue.delete(1)
        [changed] = catalogue.edit(1)
        body = get(client, sim, "/bibs", updatedDate=f"[{START:%Y-%m-%dT%H:%M:%SZ},]").json()
        assert sorted(body["entries"], key=lambda e: e["id"]) == sorted(
            [{"id": gone, "deletedDate": "2026-01-01", "deleted": True}, get_entry(client, sim, changed)],
            key=lambda e: e["id"])


def get_entry(client: requests.Session, sim: SierraSimulator, bib_id: str) -> dict:
    return client.get(f"{sim.base_url}/bibs/{bib_id}").json()


# ------------------------------------------------------ fields
def test_fields_projection_and_errors(sim: SierraSimulator, client: requests.Session,
                                      catalogue: SimulatedCatalogue) -> None:
    entry = get(client, sim, "/bibs", fields="title,publishYear", limit=1).json()["entries"][0]
    assert set(entry) == {"id", "title", "publishYear"} and isinstance(entry["publishYear"], int)
    default = get(client, sim, "/bibs", limit=1).json()["entries"][0]
    assert {"id", "updatedDate", "createdDate", "deleted", "title", "author", "lang"} <= set(default)
    assert "varFields" not in default and "deletedDate" not in default
    everything = get(client, sim, "/bibs", fields=",", limit=120).json()["entries"]
    assert "deletedDate" not in json.dumps(everything)
    live = next(e for e in everything if not e["deleted"])
    assert {"fixedFields", "varFields", "marc", "normTitle"} <= set(live)
    assert live["fixedFields"]["31"] == {"label": "BCODE3", "value": catalogue[live["id"]].bcode3}
    assert live["varFields"][0]["fieldTag"] == "_" and live["marc"]["leader"].startswith("00000")
    assert all(set(e) == {"id", "deleted"} for e in everything if e["deleted"])
    extended = get(client, sim, "/bibs", fields="default,varFields", limit=1).json()["entries"][0]
    assert set(extended) == set(default) | {"varFields"}
    assert "title" not in get(client, sim, "/bibs", id="1000075").json()["entries"][0]  # invalid bib

    crash = get(client, sim, "/bibs", fields=",", deleted="true")
    assert crash.status_code == 500
    fine = get(client, sim, "/bibs", fields="id,deletedDate", deleted="true")
    assert fine.status_code == 200 and all(set(e) == {"id", "deletedDate"} for e in fine.json()["entries"])
    bad_field = get(client, sim, "/bibs", fields="id,titel")
    assert bad_field.status_code == 400 and bad_field.json()["code"] == 108
    bad_param = get(client, sim, "/bibs", updateDate="[2025-01-01,]")  # the bookops typo
    assert bad_param.status_code == 400 and bad_param.json()["code"] == 106


# ---------------------------------------------------- dates and brackets
def test_timestamps_need_z_dates_and_open_ranges_work(sim: SierraSimulator, client: requests.Session) -> None:
    no_z = get(client, sim, "/bibs", updatedDate="[2025-06-01T00:00:00,2025-07-01T00:00:00]")
    assert no_z.status_code == 400 and no_z.json()["code"] == 108
    offset = get(client, sim, "/bibs", updatedDate="[2025-06-01T00:00:00+00:00,]")
    assert offset.status_code == 400
    dated = get(client, sim, "/bibs", updatedDate="[2025-06-01,2025-06-30]", limit=2000)
    stamped = get(client, sim, "/bibs", updatedDate="[2025-06-01T00:00:00Z,2025-06-30T23:59:59Z]", limit=2000)
    assert dated.status_code == 200 and ids_of(dated) == ids_of(stamped)
    assert get(client, sim, "/bibs", updatedDate="[,2025-06-30T23:59:59Z]").status_code == 200
    assert get(client, sim, "/bibs", deletedDate="[2025-01-01T00:00:00Z,]").json()["code"] == 108


def test_raw_and_encoded_brackets_agree(sim: SierraSimulator, client: requests.Session) -> None:
    bodies = []
    for query in ("id=[1000100,1000110]&updatedDate=[2025-01-01,]&fields=id",
                  "id=%5B1000100%2C1000110%5D&updatedDate=%5B2025-01-01%2C%5D&fields=id"):
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
        conn.request("GET", f"/iii/sierra-api/v6/bibs?{query}", headers=dict(client.headers))  # sent verbatim
        response = conn.getresponse()
        assert response.status == 200
        bodies.append(json.loads(response.read()))
        conn.close()
    assert bodies[0] == bodies[1] and bodies[0]["total"] > 0


# --------------------------------------------------- two-phase export
def test_export_three_phases_with_truncation(sim: SierraSimulator, client: requests.Session,
                                             catalogue: SimulatedCatalogue) -> None:
    summary = get(client, sim, "/bibs/marc", id="[1000050,9999999]", limit=100)
    assert summary.status_code == 200
    body = summary.json()
    block = [str(n) for n in range(1000050, 1000150)]  # the lowest 100 ids, deleted ones included
    gone = catalogue.deleted_ids()
    expected = [i for i in block if i not in gone]
    oversized = [i for i in expected if int(i) % 100 == 0]
    assert body["inputRecords"] == 100 and body["outputRecords"] == len(expected) < 100
    assert body["deletedRecords"] == 100 - len(expected) and body["errors"] == len(oversized) > 0
    url = urlsplit(body["file"])
    assert url.path.startswith("/iii/sierra-api/v6/bibs/marc/files/") and url.path.endswith(".mrc")
    name = url.path.rsplit("/", 1)[1]
    assert sim.open_export_files == [name]

    download = client.get(body["file"])
    assert download.status_code == 200 and download.headers["Content-Type"] == "application/octet-stream"
    records = read_marc(download.content)
    assert [sierra_id(r) for r in records] == expected  # the lowest live ids, contiguous
    assert all(int(r.leader[:5]) <= MAX_RECORD_BYTES for r in records)
    big = [r for r in records if sierra_id(r) in oversized]
    assert big and all(len(r.get_fields("945")) < catalogue[sierra_id(r)].items for r in big)
    invalid = [r for r in records if sierra_id(r) == "1000075"]
    assert invalid == [] or invalid[0].get("245") is None

    deleted = client.delete(f"{sim.base_url}/bibs/marc/files/{name}")
    assert deleted.status_code in (200, 204) and sim.open_export_files == []
    assert client.get(body["file"]).status_code == 404
    assert client.delete(f"{sim.base_url}/bibs/marc").status_code == 403


def test_export_keyset_sweep_covers_every_live_bib(sim: SierraSimulator, client: requests.Session,
                                                   catalogue: SimulatedCatalogue) -> None:
    exported: list[str] = []
    cursor = 1000000
    while True:
        summary = get(client, sim, "/bibs/marc", id=f"[{cursor},9999999]", limit=250)
        if summary.status_code == 404:
            assert summary.json() == NOT_FOUND
            break
        file_url = summary.json()["file"]
        ids = [sierra_id(r) for r in read_marc(client.get(file_url).content)]
        client.delete(file_url)
        exported += ids
        # The block held the lowest n ids >= cursor, so no live id below cursor + n is left out.
        cursor = max([cursor + summary.json()["inputRecords"], *(int(i) + 1 for i in ids)])
    assert exported == catalogue.sorted_live_ids() and sim.open_export_files == []


def test_export_by_id_list_and_empty_variants(sim: SierraSimulator, client: requests.Session,
                                              catalogue: SimulatedCatalogue) -> None:
    gone = sorted(catalogue.deleted_ids())[0]
    body = get(client, sim, "/bibs/marc", id=f"1000003,1000001,{gone}").json()
    assert body["outputRecords"] == 2 and body["deletedRecords"] == 1 and body["inputRecords"] == 3
    assert [sierra_id(r) for r in read_marc(client.get(body["file"]).content)] == ["1000001", "1000003"]
    assert get(client, sim, "/bibs/marc", id="[9000000,9999999]").json() == NOT_FOUND
    with SierraSimulator(catalogue, empty_export_file=True) as other, login(other) as other_client:
        empty = get(other_client, other, "/bibs/marc", id="[9000000,9999999]").json()
        assert empty["outputRecords"] == 0 and other_client.get(empty["file"]).content == b""


def test_export_blocks_count_deleted_and_suppressed_bibs(catalogue: SimulatedCatalogue) -> None:
    """A block is the lowest ids of the range, deleted ones included: inputRecords > outputRecords."""
    block = [str(n) for n in range(1000001, 1000201)]
    gone, hidden = catalogue.deleted_ids(), {b for b in block if catalogue[b].suppressed}
    live = [b for b in block if b not in gone]
    assert gone & set(block) and hidden - gone
    for variant, omit in (("nonzero", False), ("always", True), ("never", False)):
        with SierraSimulator(catalogue, export_omits_suppressed=omit, deleted_records_field=variant) as sim, \
                login(sim) as client:
            body = get(client, sim, "/bibs/marc", id="[1000001,]", limit=200).json()
            out = [b for b in live if not (omit and b in hidden)]
            assert body["inputRecords"] == 200 and body["outputRecords"] == len(out)
            assert body.get("deletedRecords") == (None if variant == "never" else 200 - len(live))
            assert [sierra_id(r) for r in read_marc(client.get(body["file"]).content)] == out
    with SierraSimulator(catalogue, deleted_records_field="always") as sim, login(sim) as client:
        first_live = next(b for b in block if b not in gone)
        body = get(client, sim, "/bibs/marc", id=f"[{first_live},{first_live}]").json()
        assert body["deletedRecords"] == 0 and body["inputRecords"] == body["outputRecords"] == 1


def test_a_block_of_deleted_bibs_gives_an_empty_file_not_404() -> None:
    catalogue = SimulatedCatalogue(bibs=50, deleted_fraction=0.0, suppressed_fraction=0.0)
    catalogue.delete_ids([str(n) for n in range(1000001, 1000011)])
    with SierraSimulator(catalogue) as sim, login(sim) as client:
        body = get(client, sim, "/bibs/marc", id="[1000001,]", limit=10).json()
        assert (body["inputRecords"], body["outputRecords"], body["deletedRecords"]) == (10, 0, 10)
        assert client.get(body["file"]).content == b""
        assert get(client, sim, "/bibs/marc", id="[1000051,]").json() == NOT_FOUND


def test_export_file_url_can_name_another_origin(catalogue: SimulatedCatalogue) -> None:
    with SierraSimulator(catalogue, file_origin="http://127.0.0.1:9/") as sim, login(sim) as client:
        body = get(client, sim, "/bibs/marc", id="[1000001,]", limit=5).json()
        url = urlsplit(body["file"])
        assert url.netloc == "127.0.0.1:9" and url.path.startswith("/iii/sierra-api/v6/bibs/marc/files/")
        name = url.path.rsplit("/", 1)[1]
        assert client.get(f"{sim.base_url}/bibs/marc/files/{name}").status_code == 200  # served here


def test_marc8_and_damaged_export_records() -> None:
    catalogue = SimulatedCatalogue(bibs=60, deleted_fraction=0.0, marc8_every=3, no_005_every=5,
                                   no_id_every=7, bad_utf8_every=11)
    marc8 = catalogue[1000003]
    data, _ = export_record(marc8)
    assert data[9:10] == b" " and marc8.title.encode() not in data  # MARC-8 bytes, not UTF-8
    record = next(iter(pymarc.MARCReader(data, to_unicode=True)))  # pymarc's MARC-8 decoder
    assert record["245"]["a"] == marc8.title and not marc8.title.isascii()
    assert marc_in_json(marc8)["leader"][9] == "a"  # the JSON API serves Unicode
    no_005 = bib_marc(catalogue[1000005])
    assert no_005.get("005") is None and no_005.get("001") is not None
    no_ids = bib_marc(catalogue[1000007])
    assert no_ids.get("001") is None and no_ids.get("907") is None
    bad, _ = export_record(catalogue[1000011])
    with pytest.raises(UnicodeDecodeError):
        pymarc.Record(bad, to_unicode=True, utf8_handling="strict")
    assert len(bad) == int(bad[:5])  # still a well-formed ISO 2709 record


def test_export_file_needs_a_live_token(sim: SierraSimulator, client: requests.Session) -> None:
    file_url = get(client, sim, "/bibs/marc", id="[1000001,1000010]").json()["file"]
    sim.expire_tokens()
    response = client.get(file_url)
    assert response.status_code == 401 and response.headers["Content-Type"].startswith("application/json")
    assert response.json()["code"] == 123
    assert requests.get(file_url).json()["code"] == 113
    login(sim, client)
    assert client.get(file_url).status_code == 200


def test_export_rate_limit_and_injected_failure(catalogue: SimulatedCatalogue) -> None:
    with SierraSimulator(catalogue, export_quota=2) as sim, login(sim) as client:
        for _ in range(2):
            assert get(client, sim, "/bibs/marc", id="[1000001,1000005]").status_code == 200
        limited = get(client, sim, "/bibs/marc", id="[1000001,1000005]")
        assert limited.status_code == 500
        assert limited.json()["code"] == 138 and limited.json()["name"] == "Rate exceeded for endpoint"
        assert get(client, sim, "/bibs", limit=1).status_code == 200  # GET bibs is not limited
        sim.reset_export_quota()
        assert get(client, sim, "/bibs/marc", id="[1000001,1000005]").status_code == 200
        assert get(client, sim, "/bibs/marc", id="[1000001,1000005]").status_code == 200
        assert get(client, sim, "/bibs/marc", id="[1000001,1000005]").json()["code"] == 138
        catalogue.advance_clock(3600)  # past the hour; the token expires too
        login(sim, client)
        assert get(client, sim, "/bibs/marc", id="[1000001,1000005]").status_code == 200
        sim.fail_export_next()
        failed = get(client, sim, "/bibs/marc", id="[1000001,1000005]")
        assert failed.status_code == 500 and failed.json()["code"] == 135
        assert failed.json()["name"] == "External Process Failed"
        assert get(client, sim, "/bibs/marc", id="[1000001,1000005]").status_code == 200
        assert len(sim.open_export_files) == 6 == sim.exports_created


# ------------------------------------------------- per-record MARC
def test_bib_marc_needs_accept(sim: SierraSimulator, client: requests.Session,
                               catalogue: SimulatedCatalogue) -> None:
    url = f"{sim.base_url}/bibs/1000100/marc"
    assert client.get(url).json()["code"] == 108
    assert client.get(url, headers={"Accept": "application/json"}).status_code == 400
    xml = client.get(url, headers={"Accept": "application/marc-xml"})
    assert xml.status_code == 200 and xml.headers["Content-Type"].startswith("application/marc-xml")
    [record] = pymarc.parse_xml_to_array(io.BytesIO(xml.content))
    bib = catalogue["1000100"]
    assert record["245"]["a"] == bib.title and record["001"].data == "b1000100"
    assert not {"907", "945", "998"} & {f.tag for f in record.fields}
    for accept in ("application/marc-json", "application/marc-in-json"):
        body = client.get(url, headers={"Accept": accept}).json()
        assert {"leader", "fields"} <= set(body)
        assert any("245" in f for f in body["fields"])
    escaped = next(b for b in catalogue.bibs(range(1000001, 1000601)) if "<" in b.title or "&" in b.title)
    xml = client.get(f"{sim.base_url}/bibs/{escaped.id}/marc", headers={"Accept": "application/marc-xml"})
    assert pymarc.parse_xml_to_array(io.BytesIO(xml.content))[0]["245"]["a"] == escaped.title
    missing = client.get(f"{sim.base_url}/bibs/9000001/marc", headers={"Accept": "application/marc-xml"})
    assert missing.status_code == 404 and missing.json() == NOT_FOUND


# ------------------------------------------------------ bibs/query
def test_json_query_returns_links_only(sim: SierraSimulator, client: requests.Session,
                                       catalogue: SimulatedCatalogue) -> None:
    edited = catalogue.edit(5)
    query = {"target": {"record": {"type": "bib"}, "id": 84},
             "expr": {"op": "greater_than", "operands": ["2025-12-31"]}}
    response = client.post(f"{sim.base_url}/bibs/query", params={"offset": 0, "limit": 3}, json=query)
    body = response.json()
    assert response.status_code == 200 and body["total"] == 3
    assert body["entries"] == [{"link": f"{sim.base_url}/bibs/{i}"} for i in edited[:3]]
    followed = client.get(body["entries"][0]["link"]).json()
    assert followed["id"] == edited[0]
    compound = {"queries": [query, "and", {"target": {"record": {"type": "bib"}, "id": 31},
                                           "expr": {"op": "equals", "operands": ["-"]}}]}
    links = client.post(f"{sim.base_url}/bibs/query", params={"limit": 50}, json=compound).json()["entries"]
    unsuppressed = {i for i in edited if not catalogue[i].suppressed}
    assert {e["link"].rsplit("/", 1)[1] for e in links} == unsuppressed
    wrong_method = client.get(f"{sim.base_url}/bibs/query")
    assert wrong_method.status_code == 400 and wrong_method.json()["code"] == 106


# ------------------------------------------------------ transport
def test_transient_failures_and_path_filter(sim: SierraSimulator, client: requests.Session) -> None:
    sim.fail_next(2)
    for _ in range(2):
        response = get(client, sim, "/bibs")
        assert response.status_code == 500 and response.json()["httpStatus"] == 500
    assert get(client, sim, "/bibs").status_code == 200
    sim.fail_next(1, status=503, path_prefix="deleted=true")
    assert get(client, sim, "/bibs", deleted="false").status_code == 200
    assert get(client, sim, "/bibs", deleted="true", fields="id").status_code == 503
    assert get(client, sim, "/bibs", deleted="true", fields="id").status_code == 200
    sim.fail_next(1, status=502, body=b"<html>Bad gateway</html>")
    assert get(client, sim, "/bibs").text == "<html>Bad gateway</html>"


def test_empty_reply_then_recovery(sim: SierraSimulator, client: requests.Session) -> None:
    sim.empty_reply_next()
    with pytest.raises(requests.ConnectionError):
        get(client, sim, "/bibs")
    assert get(client, sim, "/bibs").status_code == 200
    assert sim.requests[-2]["status"] is None and sim.requests[-1]["status"] == 200


def test_hang_times_out_the_client(sim: SierraSimulator, client: requests.Session) -> None:
    sim.hang_next(30)
    with pytest.raises(requests.ReadTimeout):
        client.get(f"{sim.base_url}/bibs", timeout=0.3)
    assert get(client, sim, "/bibs").status_code == 200


def test_date_header_follows_the_simulated_clock(sim: SierraSimulator, client: requests.Session,
                                                 catalogue: SimulatedCatalogue) -> None:
    assert parsedate_to_datetime(get(client, sim, "/bibs").headers["Date"]) == START
    catalogue.edit(1)
    catalogue.advance_clock(3.5)
    response = get(client, sim, "/bibs")
    assert response.headers["Date"] == "Thu, 01 Jan 2026 00:01:03 GMT"
    assert response.headers["Keep-Alive"].startswith("timeout=5, max=")  # counting down, as Apache's
    unauthorised = requests.post(f"{sim.base_url}/token")
    assert parsedate_to_datetime(unauthorised.headers["Date"]) == catalogue.clock.replace(microsecond=0)


def test_idle_keep_alive_connection_is_closed(catalogue: SimulatedCatalogue) -> None:
    with SierraSimulator(catalogue, keep_alive_timeout=0.2) as sim:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
        conn.request("POST", "/iii/sierra-api/v6/token")
        response = conn.getresponse()
        assert response.status == 401 and response.read()
        assert not response.will_close and conn.sock is not None  # kept alive ...
        readable, _, _ = select.select([conn.sock], [], [], 5)  # ... until the server drops it
        assert readable and conn.sock.recv(1) == b""
        conn.close()


def test_connection_closes_after_keep_alive_max(catalogue: SimulatedCatalogue) -> None:
    with SierraSimulator(catalogue, keep_alive_max=2) as sim:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
        for expected in ("timeout=5, max=2", "timeout=5, max=1", None):  # counting down, as Apache's
            conn.request("POST", "/iii/sierra-api/v6/token")
            response = conn.getresponse()
            response.read()
            assert response.getheader("Keep-Alive") == expected
        assert response.getheader("Connection") == "close" and response.will_close
        conn.close()


# ------------------------------------------------- request log and control API
def test_request_log(sim: SierraSimulator, client: requests.Session) -> None:
    sim.clear_requests()
    get(client, sim, "/bibs", limit=3, id="[1000001,]")
    requests.get(f"{sim.base_url}/bibs")
    assert sim.requests == [
        {"method": "GET", "path": "/iii/sierra-api/v6/bibs", "query": {"limit": "3", "id": "[1000001,]"},
         "had_auth": True, "status": 200},
        {"method": "GET", "path": "/iii/sierra-api/v6/bibs", "query": {}, "had_auth": False, "status": 401},
    ]
    sim.clear_requests()
    assert sim.requests == []


def test_control_api(sim: SierraSimulator, catalogue: SimulatedCatalogue) -> None:
    control = f"http://127.0.0.1:{sim.port}/_control"
    result = requests.post(f"{control}/mutate", json={"edit": 2, "delete": 1, "add": 3}).json()
    assert len(result["edited"]) == 2 and len(result["deleted"]) == 1 and len(result["added"]) == 3
    assert result["clock"] == "2026-01-01T00:03:00Z"
    advanced = requests.post(f"{control}/advance_clock", json={"seconds": 60}).json()
    assert advanced == {"clock": "2026-01-01T00:04:00Z"}
    live = requests.get(f"{control}/live_ids").text.split()
    assert live == sorted(catalogue.live_ids()) and len(live) == 570 - 1 + 3
    with login(sim) as client:
        assert requests.post(f"{control}/expire_tokens").json() == {"ok": True}
        assert get(client, sim, "/bibs").status_code == 401
    state = requests.get(f"{control}/state").json()
    assert state["live"] == len(live) and state["tokens_issued"] == 1
    assert state["clock"] == "2026-01-01T00:04:00Z"
    # Its own CPU so far, for the benchmarks' time split: a number that never goes down.
    cpu = state["process_cpu_seconds"]
    assert cpu >= 0 and requests.get(f"{control}/state").json()["process_cpu_seconds"] >= cpu
    assert requests.post(f"{control}/nope", json={}).status_code == 404
    assert requests.post(f"{control}/mutate", json={"delete": 10**6}).status_code == 400


def test_cli_serves_until_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "include.simulators.sierra", "--bibs", "3000", "--deleted-fraction", "0.02",
         "--seed", "1", "--port", "0", "--export-quota", "1", "--oversized-every", "500"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "simulator did not start"
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/iii/sierra-api/v6")
        base_url = line.removeprefix("listening on ")
        token = requests.post(f"{base_url}/token", auth=("demo-key", "demo-secret")).json()["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        body = requests.get(f"{base_url}/bibs/marc", params={"id": "[1000001,1000600]", "limit": "600"},
                            headers=headers).json()
        assert body["errors"] == 1 and body["outputRecords"] <= 600
        limited = requests.get(f"{base_url}/bibs/marc", params={"id": "[1000001,]"}, headers=headers)
        assert limited.status_code == 500 and limited.json()["code"] == 138
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert out == "" and err == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
