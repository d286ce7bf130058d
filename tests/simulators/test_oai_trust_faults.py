"""The OAI-PMH simulator lies about datestamps and renames identifiers on request (I13): over
HTTP, as a harvester sees it."""

from __future__ import annotations

import re
from datetime import timedelta

import requests

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository


def _get(sim: OaiSimulator, **params: str) -> str:
    return requests.get(sim.base_url, params=params, timeout=10).text


def test_a_silent_edit_changes_the_content_but_not_the_datestamp() -> None:
    repo = SimulatedRepository(records=20, page_size=50, deleted_fraction=0.0, seed=3)
    with OaiSimulator(repo) as sim:
        (identifier,) = repo.edit_silently(1)
        record = repo.get(identifier)
        assert record is not None
        body = _get(sim, verb="GetRecord", identifier=identifier, metadataPrefix="oai_dc")
        assert "version 2:" in body and repo.get(identifier) == record  # the stamp it had
        since = (repo.clock - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        listed = _get(sim, verb="ListIdentifiers", metadataPrefix="oai_dc", **{"from": since})
        assert identifier not in listed  # no incremental window since the edit lists it


def test_a_rename_retires_the_old_identifiers_and_serves_the_same_content_under_the_new_prefix() -> None:
    repo = SimulatedRepository(records=10, page_size=50, deleted_fraction=0.0, deleted_record="persistent", seed=3)
    with OaiSimulator(repo) as sim:
        before = _get(sim, verb="GetRecord", identifier="oai:sim.example:rec-0000004", metadataPrefix="oai_dc")
        pairs = dict(repo.rename("oai:new.example:object-"))
        assert pairs["oai:sim.example:rec-0000004"] == "oai:new.example:object-0000004"
        after = _get(sim, verb="GetRecord", identifier="oai:new.example:object-0000004", metadataPrefix="oai_dc")
        metadata = re.compile(r"<metadata>.*</metadata>", re.S)
        assert metadata.findall(before) == metadata.findall(after) != []  # the same content
        listed = _get(sim, verb="ListIdentifiers", metadataPrefix="oai_dc")
        assert listed.count('status="deleted"') == 10 and listed.count("oai:new.example:object-") == 10
        assert repo.live_identifiers() == set(pairs.values())
        reply = requests.post(f"{sim.base_url.rsplit('/', 1)[0]}/_control/mutate",
                              json={"edit_silently": 2}, timeout=10).json()
        assert len(reply["edited_silently"]) == 2 and set(reply["edited_silently"]) <= set(pairs.values())
