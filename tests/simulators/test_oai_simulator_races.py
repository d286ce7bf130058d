"""The OAI simulator's race switches: offset re-query paging, staff edits between pages,
and lists that stop short. Simulated clock only; no sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from lxml import etree

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository, identifier_for

ROOT = Path(__file__).resolve().parents[2]

NS = {"o": "http://www.openarchives.org/OAI/2.0/"}


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def walk(sim: OaiSimulator, session: requests.Session, verb: str,
         **params: str) -> tuple[list[str], list[etree._Element]]:
    """Follow a chain; returns (identifiers in order, resumptionToken elements)."""
    query = {"verb": verb, **params}
    ids: list[str] = []
    tokens: list[etree._Element] = []
    while True:
        root = etree.fromstring(session.get(sim.base_url, params=query).content)
        assert root.find("o:error", NS) is None, etree.tostring(root)[:300]
        ids += [h.text or "" for h in root.iterfind(f"o:{verb}//o:header/o:identifier", NS)]
        token = root.find(f"o:{verb}/o:resumptionToken", NS)
        if token is None or not (token.text or "").strip():
            return ids, tokens + ([token] if token is not None else [])
        tokens.append(token)
        query = {"verb": verb, "resumptionToken": token.text or ""}


def test_snapshot_chains_still_list_a_record_edited_mid_list(session: requests.Session) -> None:
    repo = SimulatedRepository(records=500, page_size=100, deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        until = repo.format_stamp(repo.clock_epoch)
        sim.mutate_after_pages(1, edit_ids=[identifier_for(400)])
        ids, _ = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc", until=until)
        assert len(ids) == 500 and sim.mutations == [{"edited": [identifier_for(400)], "deleted": []}]


def test_requery_drops_a_record_edited_past_until(session: requests.Session) -> None:
    repo = SimulatedRepository(records=500, page_size=100, deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        sim.requery_pages()
        until = repo.format_stamp(repo.clock_epoch)
        sim.mutate_after_pages(1, edit_ids=[identifier_for(400)])
        ids, _ = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc", until=until)
        assert ids == [identifier_for(n) for n in range(1, 501) if n != 400]


def test_requery_skips_one_record_per_deletion_behind_the_cursor(session: requests.Session) -> None:
    repo = SimulatedRepository(records=500, page_size=100, deleted_record="no", deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        sim.requery_pages()
        sim.mutate_after_pages(2, delete_ids=[identifier_for(10), identifier_for(20)])
        ids, tokens = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc")
        assert identifier_for(201) not in ids and identifier_for(202) not in ids
        assert len(ids) == 498 and tokens[-1].get("completeListSize") == "498"  # 10 and 20 came first


def test_mutate_after_pages_waits_for_its_verb_and_is_one_shot(session: requests.Session) -> None:
    repo = SimulatedRepository(records=300, page_size=100, deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        sim.mutate_after_pages(1, edit=2, verb="ListRecords")
        walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc")
        assert sim.mutations == []
        walk(sim, session, "ListRecords", metadataPrefix="oai_dc")
        walk(sim, session, "ListRecords", metadataPrefix="oai_dc")
        assert len(sim.mutations) == 1 and len(sim.mutations[0]["edited"]) == 2


def test_end_list_after_stops_short_but_announces_the_whole_list(session: requests.Session) -> None:
    repo = SimulatedRepository(records=500, page_size=100, deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        sim.end_list_after(2)
        ids, tokens = walk(sim, session, "ListRecords", metadataPrefix="oai_dc")
        assert len(ids) == 200 and tokens[-1].get("completeListSize") == "500"
        assert len(walk(sim, session, "ListRecords", metadataPrefix="oai_dc")[0]) == 500  # one shot


def test_race_switches_over_the_control_api(session: requests.Session) -> None:
    repo = SimulatedRepository(records=300, page_size=100, deleted_fraction=0.0)
    with OaiSimulator(repo) as sim:
        control = sim.base_url.replace("/oai", "/_control/")
        assert session.post(control + "requery_pages", json={"on": True}).json() == {"ok": True}
        assert session.post(control + "mutate_after_pages",
                            json={"pages": 1, "edit_ids": [identifier_for(250)], "verb": "ListIdentifiers"}
                            ).json() == {"ok": True}
        assert session.post(control + "end_list_after", json={"pages": 5}).json() == {"ok": True}
        until = repo.format_stamp(repo.clock_epoch)
        ids, _ = walk(sim, session, "ListIdentifiers", metadataPrefix="oai_dc", until=until)
        assert len(ids) == 299 and identifier_for(250) not in ids
        assert session.post(control + "mutate_after_pages", json={"pages": 0}).status_code == 400
