"""Tests for the loopback OAI-PMH partner simulator.

Everything runs on the simulator's own clock: no sleeps, no wall-clock dates.
"""

from __future__ import annotations

import gzip
import http.client
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import requests
from lxml import etree

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository, title
from include.simulators.oai_pmh.collection import identifier_for, parse_oai_date
from include.simulators.oai_pmh.server import TOKEN_MARKUPS

ROOT = Path(__file__).resolve().parents[2]

NS = {
    "o": "http://www.openarchives.org/OAI/2.0/",
    "dc": "http://purl.org/dc/elements/1.1/",
    "oai_dc": "http://www.openarchives.org/OAI/2.0/oai_dc/",
    "lido": "http://www.lido-schema.org",
}
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


# --------------------------------------------------------------------- helpers
@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def fetch(sim: OaiSimulator, session: requests.Session, **params: str) -> etree._Element:
    """GET one OAI request and parse it (params may use from_ for `from`)."""
    if "from_" in params:
        params["from"] = params.pop("from_")
    response = session.get(sim.base_url, params=params)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/xml; charset=utf-8"
    return etree.fromstring(response.content)


def child(element: etree._Element, path: str) -> etree._Element:
    """The first `path` (OAI namespaces) under `element`; the test fails when there is none."""
    found = element.find(path, NS)
    assert found is not None, f"no {path} in {etree.tostring(element)[:300]!r}"
    return found


def text(element: etree._Element, path: str) -> str:
    """The text of the first `path` (OAI namespaces) under `element`, which must be there."""
    found = element.findtext(path, namespaces=NS)
    assert found is not None, f"no {path} in {etree.tostring(element)[:300]!r}"
    return found


def error_code(root: etree._Element) -> str | None:
    error = root.find("o:error", NS)
    return None if error is None else error.get("code")


def walk(sim: OaiSimulator, session: requests.Session, verb: str = "ListRecords",
         **params: str) -> tuple[list[etree._Element], list[etree._Element]]:
    """Follow the token chain; returns (items, token elements)."""
    root = fetch(sim, session, verb=verb, **params)
    items: list[etree._Element] = []
    tokens: list[etree._Element] = []
    while True:
        assert error_code(root) is None, etree.tostring(root)[:500]
        body = child(root, f"o:{verb}")
        items += body.findall("o:record" if verb == "ListRecords" else "o:header", NS)
        token = body.find("o:resumptionToken", NS)
        if token is None:
            return items, tokens
        tokens.append(token)
        if not (token.text or "").strip():
            return items, tokens
        assert len(tokens) < 10_000
        root = fetch(sim, session, verb=verb, resumptionToken=token.text or "")


def header_of(item: etree._Element) -> etree._Element:
    """A ListIdentifiers header, or a record's."""
    return item if str(item.tag).endswith("header") else child(item, "o:header")


def ident(item: etree._Element) -> str:
    return text(header_of(item), "o:identifier")


def is_deleted(item: etree._Element) -> bool:
    return header_of(item).get("status") == "deleted"


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------- data model
def test_repository_is_deterministic_and_spread_over_a_year() -> None:
    a = SimulatedRepository(records=2000, seed=7)
    b = SimulatedRepository(records=2000, seed=7)
    c = SimulatedRepository(records=2000, seed=8)
    assert a.select() == b.select() and a.select() != c.select()
    stamps = [r.stamp for r in a.select()]
    start = int(START.timestamp())
    assert all(start - 365 * 86400 <= s < start for s in stamps)
    assert stamps != sorted(stamps)
    assert max(stamps) - min(stamps) > 300 * 86400
    assert len(a.deleted_identifiers()) == 100 and len(a.live_identifiers()) == 1900
    assert a.clock == START
    record = a[identifier_for(1)]
    assert record.version == 1 and record.identifier == "oai:sim.example:rec-0000001"
    assert {"type", "dept"} < set(record.sets) and record.sets[1].startswith("type:")
    all_sets = {s for r in a.select() for s in r.sets}
    assert {"type:painting", "type:print", "type:sculpture", "dept:prints", "dept:asian-art"} <= all_sets


def test_large_repository_builds_and_selects_a_month() -> None:
    """Speed is the benchmarks' business (benchmarks/oai_full_harvest.py builds 200,000 and
    more); here: a large collection builds and a month's window holds about a twelfth."""
    repo = SimulatedRepository(records=200_000)
    window = repo.select("2025-06-01", "2025-06-30")
    assert 10_000 < len(window) < 20_000
    assert all("2025-06-01" <= iso(r.datestamp)[:10] <= "2025-06-30" for r in window[:: max(1, len(window) // 500)])


def test_format_stamp_matches_strftime() -> None:
    seconds, day = SimulatedRepository(records=0), SimulatedRepository(records=0, granularity="day")
    for stamp in (0, 86399, 1_767_225_599, 1_767_225_600, 1_700_000_123, -1):
        moment = datetime.fromtimestamp(stamp, timezone.utc)
        assert seconds.format_stamp(stamp) == moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert day.format_stamp(stamp) == moment.strftime("%Y-%m-%d")


def test_select_is_inclusive_at_the_granularity() -> None:
    repo = SimulatedRepository(records=500)
    record = repo[identifier_for(10)]
    at = record.datestamp
    assert record in repo.select(at, at)
    assert record not in repo.select(at + timedelta(seconds=1), None)
    assert record in repo.select(iso(at), iso(at))
    assert record in repo.select(None, at.strftime("%Y-%m-%d"))  # a day `until` covers the day
    day_repo = SimulatedRepository(records=500, granularity="day")
    record = day_repo[identifier_for(10)]
    day = record.datestamp.strftime("%Y-%m-%d")
    assert record in day_repo.select(day, day)
    assert record in day_repo.select(record.datestamp.replace(hour=23, minute=59), None)
    numbers = [r.number for r in repo.select()]
    assert numbers == sorted(numbers)
    paintings = repo.select(set_spec="type:painting")
    assert paintings and all("type:painting" in r.sets for r in paintings)
    assert repo.select(set_spec="type") == repo.select()


def test_deleted_records_may_leave_their_sets() -> None:
    """deleted_in_sets=False (``--deleted-outside-sets``): set-restricted lists omit
    tombstones, and a tombstone's header names no set, as on repositories that drop a
    deleted item's set membership."""
    repo = SimulatedRepository(records=400, deleted_fraction=0.1, page_size=1000, deleted_in_sets=False)
    deleted = repo.deleted_identifiers()
    by_type = [r for spec in ("type:painting", "type:print", "type:sculpture") for r in repo.select(set_spec=spec)]
    assert deleted and not any(r.deleted for r in by_type)
    assert len(by_type) == len(repo.select()) - len(deleted)
    with OaiSimulator(repo) as sim:
        body = requests.get(sim.base_url, params={"verb": "ListIdentifiers", "metadataPrefix": "oai_dc"}).content
    ns = {"o": "http://www.openarchives.org/OAI/2.0/"}
    tombstones = etree.fromstring(body).findall(".//o:header[@status='deleted']", ns)
    assert len(tombstones) == len(deleted) and all(h.find("o:setSpec", ns) is None for h in tombstones)


def test_mutations_are_seeded_and_stamped_with_the_clock() -> None:
    a, b = SimulatedRepository(records=300), SimulatedRepository(records=300)
    assert a.edit(5) == b.edit(5)
    assert a.clock == START + timedelta(seconds=60)
    edited = a.edit_ids([identifier_for(3)])
    assert edited == [identifier_for(3)] and a[edited[0]].version in (2, 3)
    assert a[edited[0]].datestamp == START + timedelta(seconds=120)
    added = a.add(3)
    assert added == [identifier_for(n) for n in (301, 302, 303)]
    deleted = a.delete(4)
    assert set(deleted) <= a.deleted_identifiers() and not set(deleted) & a.live_identifiers()
    assert all(a[i].deleted for i in deleted)
    a.advance_clock(3600)
    assert a.clock == START + timedelta(seconds=240 + 3600)
    with pytest.raises(ValueError):
        a.edit_ids([deleted[0]])
    with pytest.raises(KeyError):
        a.delete_ids(["oai:elsewhere:1"])


# --------------------------------------------------------------------- payloads
def test_payloads_escape_and_mark_invalid_records(session: requests.Session) -> None:
    repo = SimulatedRepository(records=120, deleted_fraction=0, invalid_every=10, page_size=200)
    with OaiSimulator(repo) as sim:
        dc_records, _ = walk(sim, session, metadataPrefix="oai_dc")
        lido_records, _ = walk(sim, session, metadataPrefix="lido")
    dc_titles = {ident(r): r.findtext(".//dc:title", namespaces=NS) for r in dc_records}
    lido_titles = {ident(r): r.findtext(".//lido:titleSet/lido:appellationValue", namespaces=NS)
                   for r in lido_records}
    assert dc_titles == lido_titles
    assert dc_titles[identifier_for(10)] == "" and dc_titles[identifier_for(20)] == ""
    assert dc_titles[identifier_for(11)] == title(repo[identifier_for(11)])
    values = [t for t in dc_titles.values() if t]
    assert any("&" in t for t in values) and any(not t.isascii() for t in values)
    assert any("<" in t for t in values)
    lido = child(lido_records[0], "o:metadata/lido:lido")
    assert child(lido, "lido:lidoRecID").get(f"{{{NS['lido']}}}type") == "local"
    assert lido.findtext("lido:category/lido:term", namespaces=NS)
    assert child(lido, "lido:descriptiveMetadata").get("{http://www.w3.org/XML/1998/namespace}lang") == "en"
    assert text(lido, ".//lido:objectWorkTypeWrap/lido:objectWorkType/lido:term") in (
        "painting", "print", "sculpture")
    wrap = child(lido, "lido:administrativeMetadata/lido:recordWrap")
    assert wrap.findtext("lido:recordID", namespaces=NS) == "rec-0000001"
    assert wrap.findtext("lido:recordType/lido:term", namespaces=NS)
    assert wrap.findtext("lido:recordSource/lido:legalBodyName/lido:appellationValue", namespaces=NS)
    dc = child(dc_records[0], "o:metadata/oai_dc:dc")
    for field in ("title", "creator", "date", "type", "identifier", "subject"):
        assert dc.find(f"dc:{field}", NS) is not None, field


@pytest.mark.parametrize("earliest", ["true", "late", "absent", "epoch"])
def test_identify_may_announce_a_wrong_earliest_datestamp(session: requests.Session, earliest: str) -> None:
    """Real repositories announce an earliestDatestamp after records they hold, none, or 1970 (I13)."""
    repo = SimulatedRepository(records=200, seed=3, earliest_datestamp=earliest)
    with OaiSimulator(repo) as sim:
        announced = child(fetch(sim, session, verb="Identify"), "o:Identify").findtext("o:earliestDatestamp",
                                                                                         namespaces=NS)
        headers, _ = walk(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc")
        stamps = sorted(parse_oai_date(text(h, "o:datestamp"))[0] for h in headers)
    if earliest == "absent":
        assert announced is None
        return
    assert announced is not None
    moment = parse_oai_date(announced)[0]
    older = sum(1 for s in stamps if s < moment)
    expected = {"true": (0, 0), "late": (len(stamps) // 3, len(stamps) * 2 // 3), "epoch": (0, 0)}[earliest]
    assert expected[0] <= older <= expected[1], (announced, older, len(stamps))
    if earliest == "epoch":
        assert moment == 0  # 1970-01-01T00:00:00Z, in epoch seconds


@pytest.mark.parametrize("list_size", ["exact", "omitted"])
def test_complete_list_size_may_be_left_out(session: requests.Session, list_size: str) -> None:
    """completeListSize is optional on a resumptionToken; some repositories never send it (I13)."""
    repo = SimulatedRepository(records=250, page_size=100, seed=4, deleted_fraction=0.0)
    with OaiSimulator(repo, list_size=list_size) as sim:
        headers, tokens = walk(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc")
    assert len(headers) == 250 and len(tokens) == 3
    sizes = {token.get("completeListSize") for token in tokens}
    assert sizes == ({"250"} if list_size == "exact" else {None})


# -------------------------------------------------------------------- protocol
def test_identify_formats_and_sets(session: requests.Session) -> None:
    repo = SimulatedRepository(records=50, granularity="day", formats=("lido",), deleted_record="transient")
    with OaiSimulator(repo) as sim:
        identify = child(fetch(sim, session, verb="Identify"), "o:Identify")
        assert identify.findtext("o:baseURL", namespaces=NS) == sim.base_url
        assert sim.base_url.startswith("http://127.0.0.1:") and sim.base_url.endswith("/oai")
        assert identify.findtext("o:protocolVersion", namespaces=NS) == "2.0"
        assert identify.findtext("o:granularity", namespaces=NS) == "YYYY-MM-DD"
        assert identify.findtext("o:deletedRecord", namespaces=NS) == "transient"
        assert identify.findtext("o:adminEmail", namespaces=NS)
        earliest = text(identify, "o:earliestDatestamp")
        assert parse_oai_date(earliest)[1] == "day"
        root = fetch(sim, session, verb="ListMetadataFormats")
        assert root.findtext("o:responseDate", namespaces=NS) == "2026-01-01T00:00:00Z"
        prefixes = [e.text for e in root.iterfind(".//o:metadataPrefix", NS)]
        assert prefixes == ["oai_dc", "lido"]
        root = fetch(sim, session, verb="ListMetadataFormats", identifier="oai:sim.example:rec-9999999")
        assert error_code(root) == "idDoesNotExist"
        specs = [e.text for e in fetch(sim, session, verb="ListSets").iterfind(".//o:setSpec", NS)]
        assert {"type", "type:painting", "dept", "dept:prints"} <= set(specs)
        record = fetch(sim, session, verb="GetRecord", identifier=identifier_for(2), metadataPrefix="lido")
        assert dict(child(record, "o:request").attrib) == {
            "verb": "GetRecord", "identifier": identifier_for(2), "metadataPrefix": "lido"}
        assert ident(child(record, ".//o:record")) == identifier_for(2)
        assert len(text(record, ".//o:datestamp")) == 10


def test_token_chain_walks_to_exhaustion(session: requests.Session) -> None:
    repo = SimulatedRepository(records=1050, page_size=100)
    with OaiSimulator(repo) as sim:
        for verb, prefix in (("ListRecords", "oai_dc"), ("ListIdentifiers", "lido")):
            sim.clear_requests()
            items, tokens = walk(sim, session, verb, metadataPrefix=prefix)
            ids = [ident(i) for i in items]
            assert ids == sorted(ids) and len(ids) == len(set(ids)) == 1050
            assert len(tokens) == 11
            assert [int(t.get("cursor", "")) for t in tokens] == list(range(0, 1100, 100))
            assert {t.get("completeListSize") for t in tokens} == {"1050"}
            assert all(t.get("expirationDate") for t in tokens[:-1])
            final = tokens[-1]
            assert final.text is None and final.get("completeListSize") == "1050"
            assert final.get("cursor") == "1000"
            assert all(set(t.text or "") & set("+!/") for t in tokens[:-1])
            # continuations carried the verb and the token only
            assert [set(q) for q in sim.requests[1:]] == [{"verb", "resumptionToken"}] * 10
            deleted = [i for i in items if is_deleted(i)]
            assert {ident(i) for i in deleted} == repo.deleted_identifiers() and len(deleted) == 52
            if verb == "ListRecords":
                assert all(i.find("o:metadata", NS) is None for i in deleted)
                assert all(i.find("o:metadata", NS) is not None for i in items if not is_deleted(i))
        # a list that fits one page carries no token at all
        items, tokens = walk(sim, session, metadataPrefix="oai_dc", set="dept:asian-art",
                             from_="2025-12-01")
        assert items and not tokens
        assert sim.errors == []


@pytest.mark.parametrize("markup", TOKEN_MARKUPS)
def test_every_token_markup_serves_the_same_chain(session: requests.Session, markup: str) -> None:
    """Token markup varies as real servers' does (padding, CDATA, character references,
    comments mentioning a token); each is valid OAI-PMH that a parser reads the same."""
    repo = SimulatedRepository(records=1050, page_size=100)
    with OaiSimulator(repo, token_markup=markup) as sim:
        ids: list[str] = []
        bodies: list[bytes] = []
        params = {"verb": "ListRecords", "metadataPrefix": "oai_dc"}
        while True:
            bodies.append(session.get(sim.base_url, params=params).content)
            body = child(etree.fromstring(bodies[-1]), "o:ListRecords")
            ids += [ident(item) for item in body.findall("o:record", NS)]
            token = body.find("o:resumptionToken", NS)
            text = "".join(token.itertext()).strip() if token is not None else ""
            if not text:
                break
            params = {"verb": "ListRecords", "resumptionToken": text}
        assert ids == sorted(ids) and len(set(ids)) == 1050 and len(bodies) == 11
        assert sim.errors == []
        last = bodies[-1]
        if markup == "stale-comment":  # no element, an old token in a comment
            assert b"<!--" in last and etree.fromstring(last).find("o:ListRecords/o:resumptionToken", NS) is None
        if markup == "varied":
            assert b"CDATA" in b"".join(bodies) and b"&#33;" in b"".join(bodies) and b"<!--" in b"".join(bodies)


def test_continuation_rules(session: requests.Session) -> None:
    repo = SimulatedRepository(records=300, page_size=100)
    with OaiSimulator(repo) as sim:
        first = fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc")
        token = text(first, ".//o:resumptionToken")
        for extra in ({"metadataPrefix": "oai_dc"}, {"from_": "2025-01-01"}, {"set": "type"}):
            root = fetch(sim, session, verb="ListRecords", resumptionToken=token, **extra)
            assert error_code(root) == "badArgument"
            assert dict(child(root, "o:request").attrib) == {}  # no echo after badArgument
        # an unencoded "+" arrives as a space: the token is then unknown
        raw = session.get(f"{sim.base_url}?verb=ListRecords&resumptionToken={token}")
        assert error_code(etree.fromstring(raw.content)) == "badResumptionToken"
        encoded = session.get(f"{sim.base_url}?verb=ListRecords&resumptionToken={quote(token, safe='')}")
        assert error_code(etree.fromstring(encoded.content)) is None
        # tokens are bound to their verb and are idempotent (safe to retry)
        root = fetch(sim, session, verb="ListIdentifiers", resumptionToken=token)
        assert error_code(root) == "badResumptionToken"
        again = fetch(sim, session, verb="ListRecords", resumptionToken=token)
        assert [ident(r) for r in again.iterfind(".//o:record", NS)] == [
            ident(r) for r in etree.fromstring(encoded.content).iterfind(".//o:record", NS)]
        assert error_code(fetch(sim, session, verb="ListRecords", resumptionToken="nonsense")) == \
            "badResumptionToken"
        assert error_code(fetch(sim, session, verb="ListSets", resumptionToken="x")) == "badResumptionToken"


@pytest.mark.parametrize("params, code", [
    ({}, "badVerb"),
    ({"verb": "ListEverything"}, "badVerb"),
    ({"verb": "ListRecords"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": ""}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "colour": "red"}, "badArgument"),
    ({"verb": "Identify", "metadataPrefix": "oai_dc"}, "badArgument"),
    ({"verb": "GetRecord", "identifier": "oai:sim.example:rec-0000001"}, "badArgument"),
    ({"verb": "GetRecord", "identifier": "oai:sim.example:rec-0000001", "metadataPrefix": "marc21"},
     "cannotDisseminateFormat"),
    ({"verb": "GetRecord", "identifier": "oai:sim.example:rec-0999999", "metadataPrefix": "oai_dc"},
     "idDoesNotExist"),
    ({"verb": "ListRecords", "metadataPrefix": "marc21"}, "cannotDisseminateFormat"),
    ({"verb": "ListIdentifiers", "metadataPrefix": "oai_dc", "set": "type:tapestry"}, "noRecordsMatch"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2027-01-01"}, "noRecordsMatch"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2025-13-01"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2025-01-01T00:00:00"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "until": "2025-01-01T00:00:00.000Z"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2025-06-02", "until": "2025-06-01"},
     "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2025-06-01",
      "until": "2025-06-02T00:00:00Z"}, "badArgument"),
])
def test_argument_errors(session: requests.Session, params: dict[str, str], code: str) -> None:
    repo = SimulatedRepository(records=200)
    with OaiSimulator(repo) as sim:
        root = etree.fromstring(session.get(sim.base_url, params=params).content)
        assert error_code(root) == code
        assert root.findtext("o:request", namespaces=NS) == sim.base_url


def test_repeated_arguments_are_rejected(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=10)) as sim:
        url = f"{sim.base_url}?verb=ListRecords&metadataPrefix=oai_dc&metadataPrefix=lido"
        assert error_code(etree.fromstring(session.get(url).content)) == "badArgument"
        url = f"{sim.base_url}?verb=Identify&verb=Identify"
        assert error_code(etree.fromstring(session.get(url).content)) == "badVerb"
        assert sim.requests[0]["metadataPrefix"] == ["oai_dc", "lido"]


def test_windows_at_seconds_granularity(session: requests.Session) -> None:
    repo = SimulatedRepository(records=400, page_size=1000)
    with OaiSimulator(repo) as sim:
        low, high = "2025-05-01T12:00:00Z", "2025-08-15T06:30:00Z"
        items, _ = walk(sim, session, metadataPrefix="oai_dc", from_=low, until=high)
        expected = [r.identifier for r in repo.select(low, high)]
        assert [ident(i) for i in items] == expected and expected
        stamps = [text(i, ".//o:datestamp") for i in items]
        assert all(low <= s <= high and len(s) == 20 for s in stamps)
        # day-only dates are legal on a seconds repository; `until` covers the whole day
        items, _ = walk(sim, session, metadataPrefix="oai_dc", from_="2025-05-01", until="2025-08-15")
        assert [ident(i) for i in items] == [r.identifier for r in repo.select(
            "2025-05-01T00:00:00Z", "2025-08-15T23:59:59Z")]
        # inclusive at both ends, to the second
        record = repo[identifier_for(5)]
        items, _ = walk(sim, session, metadataPrefix="oai_dc", from_=iso(record.datestamp),
                        until=iso(record.datestamp))
        assert identifier_for(5) in [ident(i) for i in items]


def test_windows_at_day_granularity(session: requests.Session) -> None:
    repo = SimulatedRepository(records=400, granularity="day", page_size=1000)
    with OaiSimulator(repo) as sim:
        root = fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc", from_="2025-05-01T00:00:00Z")
        assert error_code(root) == "badArgument"
        root = fetch(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc", until="2025-05-01T00:00:00Z")
        assert error_code(root) == "badArgument"
        items, _ = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc", from_="2025-05-01",
                        until="2025-05-31")
        stamps = [text(i, "o:datestamp") for i in items]
        assert stamps and all("2025-05-01" <= s <= "2025-05-31" and len(s) == 10 for s in stamps)
        assert len(items) == len(repo.select("2025-05-01", "2025-05-31"))


@pytest.mark.parametrize("granularity", ["seconds", "day"])
def test_mutations_show_up_in_the_next_window_and_nowhere_else(
        session: requests.Session, granularity: str) -> None:
    repo = SimulatedRepository(records=600, page_size=250, granularity=granularity)
    day = granularity == "day"
    fmt = (lambda d: d.strftime("%Y-%m-%d")) if day else iso
    with OaiSimulator(repo) as sim:
        t0 = repo.clock
        before, _ = walk(sim, session, metadataPrefix="oai_dc", until=fmt(t0 - timedelta(days=1) if day else t0))
        assert len(before) == 600
        edited, deleted, added = repo.edit(4), repo.delete(3), repo.add(5)
        changed = set(edited) | set(deleted) | set(added)
        low = fmt(t0) if day else iso(t0 + timedelta(seconds=1))
        window, _ = walk(sim, session, metadataPrefix="oai_dc", from_=low, until=fmt(repo.clock))
        assert {ident(i) for i in window} == changed
        assert {ident(i) for i in window if is_deleted(i)} == set(deleted)
        for item in window:
            if ident(item) in edited:
                assert ", version 2:" in text(item, ".//dc:title")
        old, _ = walk(sim, session, metadataPrefix="oai_dc", until=fmt(t0 - timedelta(days=1) if day else t0))
        assert {ident(i) for i in old} == {ident(i) for i in before} - changed
        if not day:  # each mutation call is its own clock step
            first_step, _ = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc",
                                 from_=low, until=iso(t0 + timedelta(seconds=60)))
            assert {ident(i) for i in first_step} == set(edited)


def test_deleted_record_no_hides_deletions(session: requests.Session) -> None:
    repo = SimulatedRepository(records=500, deleted_record="no", page_size=1000)
    with OaiSimulator(repo) as sim:
        items, _ = walk(sim, session, metadataPrefix="oai_dc")
        assert len(items) == 475 and not any(is_deleted(i) for i in items)
        assert {ident(i) for i in items} == repo.live_identifiers()
        gone = repo.delete(10)
        items, _ = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc")
        assert not {ident(i) for i in items} & set(gone) and len(items) == 465
        root = fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc", from_=iso(repo.clock))
        assert error_code(root) == "noRecordsMatch"
        root = fetch(sim, session, verb="GetRecord", identifier=gone[0], metadataPrefix="oai_dc")
        assert error_code(root) == "idDoesNotExist"
        assert set(gone) <= repo.deleted_identifiers()


def test_persistent_tombstones_in_get_record(session: requests.Session) -> None:
    repo = SimulatedRepository(records=50)
    with OaiSimulator(repo) as sim:
        (gone,) = repo.delete(1)
        root = fetch(sim, session, verb="GetRecord", identifier=gone, metadataPrefix="lido")
        record = child(root, ".//o:record")
        assert is_deleted(record) and record.find("o:metadata", NS) is None
        assert record.findtext(".//o:datestamp", namespaces=NS) == iso(repo.clock)


def test_changes_during_a_harvest(session: requests.Session) -> None:
    repo = SimulatedRepository(records=300, page_size=100, deleted_record="no", deleted_fraction=0)
    with OaiSimulator(repo) as sim:
        first = fetch(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc")
        token = text(first, ".//o:resumptionToken")
        repo.delete_ids([identifier_for(150)])
        (new,) = repo.add(1)
        second = fetch(sim, session, verb="ListIdentifiers", resumptionToken=token)
        ids = [e.text for e in second.iterfind(".//o:identifier", NS)]
        assert len(ids) == 99 and identifier_for(150) not in ids and new not in ids
        assert child(second, ".//o:resumptionToken").get("completeListSize") == "300"


# ---------------------------------------------------------------- misbehaviour
def test_expire_tokens(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=300, page_size=100)) as sim:
        token = text(fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc"), ".//o:resumptionToken")
        sim.expire_tokens()
        assert error_code(fetch(sim, session, verb="ListRecords", resumptionToken=token)) == "badResumptionToken"
        items, _ = walk(sim, session, metadataPrefix="oai_dc")
        assert len(items) == 300


def test_expire_tokens_after_is_one_shot(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=500, page_size=100)) as sim:
        sim.expire_tokens_after(2)
        root = fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc")
        token = text(root, ".//o:resumptionToken")
        root = fetch(sim, session, verb="ListRecords", resumptionToken=token)
        token = text(root, ".//o:resumptionToken")
        assert error_code(root) is None and token
        assert error_code(fetch(sim, session, verb="ListRecords", resumptionToken=token)) == "badResumptionToken"
        items, tokens = walk(sim, session, metadataPrefix="oai_dc")  # a restarted chain works
        assert len(items) == 500 and len(tokens) == 5


def test_fail_next_with_retry_after(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=10)) as sim:
        sim.fail_next(2, retry_after="7")
        for _ in range(2):
            response = session.get(sim.base_url, params={"verb": "Identify"})
            assert response.status_code == 503 and response.headers["Retry-After"] == "7"
            assert response.headers["Content-Type"].startswith("text/html") and "<html" in response.text
        assert session.get(sim.base_url, params={"verb": "Identify"}).status_code == 200
        http_date = "Wed, 21 Oct 2026 07:28:00 GMT"
        sim.fail_next(1, status=429, retry_after=http_date)
        response = session.get(sim.base_url, params={"verb": "Identify"})
        assert response.status_code == 429 and response.headers["Retry-After"] == http_date
        sim.fail_next(1, status=500)
        response = session.get(sim.base_url, params={"verb": "Identify"})
        assert response.status_code == 500 and "Retry-After" not in response.headers
        assert len(sim.requests) == 5  # failed requests are logged too


def test_html_and_broken_responses(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=300, page_size=100)) as sim:
        sim.html_next()
        response = session.get(sim.base_url, params={"verb": "ListRecords", "metadataPrefix": "oai_dc"})
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/html")
        assert response.text.lstrip().lower().startswith("<!doctype html")
        sim.broken_next()
        response = session.get(sim.base_url, params={"verb": "ListRecords", "metadataPrefix": "oai_dc"})
        assert response.status_code == 200 and response.headers["Content-Type"] == "text/xml; charset=utf-8"
        assert "<record>" in response.text and "</OAI-PMH>" not in response.text
        assert not response.text.rstrip().endswith("</record>")
        with pytest.raises(etree.XMLSyntaxError):
            etree.fromstring(response.content)
        items, _ = walk(sim, session, metadataPrefix="oai_dc")
        assert len(items) == 300


@pytest.mark.parametrize("kind, marker", [
    ("billion_laughs", '<!ENTITY lol9 "&lol8;'),
    ("xxe", '<!ENTITY xxe SYSTEM "file:///etc/hostname">'),
])
def test_hostile_documents(session: requests.Session, kind: str, marker: str) -> None:
    with OaiSimulator(SimulatedRepository(records=20)) as sim:
        sim.hostile_next(kind)
        response = session.get(sim.base_url, params={"verb": "ListRecords", "metadataPrefix": "oai_dc"})
        assert response.status_code == 200 and "<!DOCTYPE OAI-PMH [" in response.text and marker in response.text
        safe = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
        try:
            root = etree.fromstring(response.content, safe)
            assert root.find(".//dc:title", NS) is not None
        except etree.XMLSyntaxError as exc:  # libxml2 refuses the expansion even unresolved
            assert kind == "billion_laughs" and "amplification" in str(exc)
        assert "<dc:title>&lol9;" in response.text or "<dc:title>&xxe;" in response.text
        assert "<!DOCTYPE" not in session.get(sim.base_url, params={"verb": "Identify"}).text
        with pytest.raises(ValueError):
            sim.hostile_next("zip_bomb")


def test_repeat_token(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=500, page_size=100)) as sim:
        sim.repeat_token(True)
        token = text(fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc"), ".//o:resumptionToken")
        for _ in range(6):
            root = fetch(sim, session, verb="ListRecords", resumptionToken=token)
            assert text(root, ".//o:resumptionToken") == token
            assert ident(child(root, ".//o:record")) == identifier_for(101)
        sim.repeat_token(False)
        items, tokens = walk(sim, session, metadataPrefix="oai_dc")
        assert len(items) == 500 and tokens[-1].text is None


def test_empty_pages_with_token(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=250, page_size=100)) as sim:
        sim.empty_pages_with_token(True)
        root = fetch(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc")
        seen = set()
        for _ in range(5):
            body = child(root, "o:ListIdentifiers")
            assert body.find("o:header", NS) is None
            token = body.findtext("o:resumptionToken", namespaces=NS)
            assert token and token not in seen
            seen.add(token)
            root = fetch(sim, session, verb="ListIdentifiers", resumptionToken=token)
        sim.empty_pages_with_token(False)
        items, tokens = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc")
        assert len(items) == 250 and len(tokens) == 3


# ------------------------------------------------------------------------ HTTP
def test_gzip_and_identity(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=200, page_size=100)) as sim:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
        for encoding in ("gzip", "identity"):
            conn.request("GET", "/oai?verb=ListRecords&metadataPrefix=lido", headers={"Accept-Encoding": encoding})
            response = conn.getresponse()
            raw = response.read()
            assert int(response.getheader("Content-Length", "")) == len(raw)
            assert response.getheader("Content-Type") == "text/xml; charset=utf-8"
            if encoding == "gzip":
                assert response.getheader("Content-Encoding") == "gzip"
                raw = gzip.decompress(raw)
            else:
                assert response.getheader("Content-Encoding") is None
            assert len(etree.fromstring(raw).findall(".//o:record", NS)) == 100
        conn.close()


def test_post_and_request_log(session: requests.Session) -> None:
    with OaiSimulator(SimulatedRepository(records=150, page_size=100)) as sim:
        root = etree.fromstring(session.post(sim.base_url, data={"verb": "ListRecords",
                                                                   "metadataPrefix": "oai_dc"}).content)
        token = text(root, ".//o:resumptionToken")
        root = etree.fromstring(session.post(sim.base_url, data={"verb": "ListRecords",
                                                                   "resumptionToken": token}).content)
        assert len(root.findall(".//o:record", NS)) == 50
        assert sim.requests == [{"verb": "ListRecords", "metadataPrefix": "oai_dc"},
                                {"verb": "ListRecords", "resumptionToken": token}]
        sim.clear_requests()
        assert sim.requests == [] and sim.requests_served == 2
        assert session.get(sim.base_url.replace("/oai", "/elsewhere")).status_code == 404


def test_http_control_api(session: requests.Session) -> None:
    repo = SimulatedRepository(records=400, page_size=100)
    with OaiSimulator(repo) as sim:
        control = sim.base_url.replace("/oai", "/_control/")
        result = session.post(control + "mutate", json={"edit": 3, "delete": 2, "add": 4}).json()
        assert len(result["edited"]) == 3 and len(result["deleted"]) == 2 and len(result["added"]) == 4
        assert result["clock"] == iso(START + timedelta(seconds=180))
        assert result["added"][0] == identifier_for(401)
        result = session.post(control + "advance_clock", json={"seconds": 3600}).json()
        assert result["clock"] == iso(START + timedelta(seconds=3780)) and repo.clock == START + timedelta(seconds=3780)
        live = session.get(control + "live_ids")
        lines = live.text.splitlines()
        assert lines == sorted(repo.live_identifiers()) and len(lines) == 400 - 20 - 2 + 4
        state = session.get(control + "state").json()
        assert state["live"] == len(lines) and state["deleted"] == 22
        assert state["clock"] == iso(repo.clock) and state["requests"] == 0
        token = text(fetch(sim, session, verb="ListRecords", metadataPrefix="oai_dc"), ".//o:resumptionToken")
        assert session.post(control + "expire_tokens", json={}).json() == {"ok": True}
        assert error_code(fetch(sim, session, verb="ListRecords", resumptionToken=token)) == "badResumptionToken"
        session.post(control + "fail_next", json={"count": 1, "status": 503, "retry_after": "5"})
        response = session.get(sim.base_url, params={"verb": "Identify"})
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
        assert session.get(control + "state").json()["requests"] == 3
        assert session.post(control + "nonsense", json={}).status_code == 404
        assert session.post(control + "mutate", json={"delete": 10_000}).status_code == 400
        assert session.post(control + "hostile_next", json={"kind": "xxe"}).json() == {"ok": True}
        assert "<!ENTITY xxe" in session.get(sim.base_url, params={"verb": "Identify"}).text
        assert sim.errors == []


def test_cli_serves_until_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "include.simulators.oai_pmh", "--records", "2000", "--page-size", "500",
         "--granularity", "day", "--formats", "oai_dc,lido", "--deleted-record", "no", "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "simulator did not start"
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/oai")
        base_url = line.removeprefix("listening on ")
        root = etree.fromstring(requests.get(base_url, params={"verb": "Identify"}).content)
        assert root.findtext(".//o:granularity", namespaces=NS) == "YYYY-MM-DD"
        assert root.findtext(".//o:deletedRecord", namespaces=NS) == "no"
        assert urlsplit(base_url).path == "/oai"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert out == "" and err == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# ------------------------------------------------- soak changes
@pytest.mark.parametrize("policy", ["persistent", "no"])
def test_recreate_brings_deleted_identifiers_back_as_new_versions(policy: str) -> None:
    repo = SimulatedRepository(records=50, deleted_fraction=0.0, deleted_record=policy, seed=3, start_clock=START)
    deleted = repo.delete(4)
    before = repo.clock_epoch
    back = repo.recreate(2)
    assert set(back) <= set(deleted) and len(back) == 2
    for identifier in back:
        record = repo.get(identifier)
        assert record is not None and not record.deleted and record.version == 2 and record.stamp > before
    assert repo.live_identifiers() >= set(back)
    assert repo.recreate(10) and not repo.deleted_identifiers()  # fewer when fewer are deleted


def test_move_sets_changes_sets_and_datestamp_but_not_the_title() -> None:
    repo = SimulatedRepository(records=30, deleted_fraction=0.0, seed=4, start_clock=START)
    before = {r.identifier: r for r in repo.select()}
    moved = repo.move_sets(3)
    assert len(moved) == 3
    for identifier in moved:
        old, new = before[identifier], repo[identifier]
        assert new.sets != old.sets and new.stamp > old.stamp and title(new) == title(old)
        assert {s.split(":")[0] for s in new.sets if ":" in s} == {"type", "dept"}
    assert [r.identifier for r in repo.select(from_=repo.clock)] == moved


def test_control_mutate_recreates_and_moves(session: requests.Session) -> None:
    repo = SimulatedRepository(records=20, deleted_fraction=0.1, seed=5, start_clock=START)
    with OaiSimulator(repo) as sim:
        base = sim.base_url.rsplit("/", 1)[0]
        done = session.post(f"{base}/_control/mutate", json={"recreate": 1, "move_sets": 2}, timeout=10).json()
    assert len(done["recreated"]) == 1 and len(done["moved"]) == 2
    assert set(done["recreated"]) <= repo.live_identifiers()


def test_a_repository_may_ignore_from(session: requests.Session) -> None:
    repo = SimulatedRepository(records=120, page_size=500, seed=3)
    with OaiSimulator(repo) as sim:
        middle = iso(sorted(r.datestamp for r in repo.select())[60])
        honest, _ = walk(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc", from_=middle)
        sim.ignore_from()
        ignored, _ = walk(sim, session, verb="ListIdentifiers", metadataPrefix="oai_dc", from_=middle)
    assert len(honest) < len(ignored) == 120
