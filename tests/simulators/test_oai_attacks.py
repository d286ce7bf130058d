"""The OAI-PMH simulator's hostile bodies (attack_next), seen with a plain HTTP client."""

from __future__ import annotations

import gzip
import http.client

import requests

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository


def raw_get(sim: OaiSimulator, query: str, accept_gzip: bool = True) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    conn.request("GET", f"/oai?{query}", headers={"Accept-Encoding": "gzip"} if accept_gzip else {})
    return conn.getresponse()


def test_gzip_bomb_is_small_on_the_wire_and_huge_decoded() -> None:
    with OaiSimulator(SimulatedRepository(records=5, seed=1)) as sim:
        sim.attack_next("gzip_bomb", size=32 << 20)
        response = raw_get(sim, "verb=Identify")
        wire = response.read()
        assert response.getheader("Content-Encoding") == "gzip" and len(wire) < 100_000
        decoded = gzip.decompress(wire)
        assert len(decoded) > 32 << 20 and decoded.startswith(b"<?xml") and decoded.rstrip().endswith(b"</OAI-PMH>")


def test_endless_body_keeps_coming_and_the_server_survives_the_hang_up() -> None:
    with OaiSimulator(SimulatedRepository(records=5, seed=1)) as sim:
        sim.attack_next("endless_body")
        response = raw_get(sim, "verb=Identify")
        assert response.getheader("Content-Length") is None
        assert len(response.read(5 << 20)) == 5 << 20
        response.close()
        assert requests.get(sim.base_url, params={"verb": "Identify"}, timeout=10).status_code == 200
        assert sim.errors == []


def test_attack_waits_for_its_verb_and_fires_once() -> None:
    with OaiSimulator(SimulatedRepository(records=5, seed=1)) as sim:
        sim.attack_next("wide_xml", size=1000, verb="ListRecords")
        assert b"<wide>" not in requests.get(sim.base_url, params={"verb": "Identify"}, timeout=10).content
        params = {"verb": "ListRecords", "metadataPrefix": "oai_dc"}
        assert requests.get(sim.base_url, params=params, timeout=10).content.count(b"<w/>") == 1000
        assert b"<wide>" not in requests.get(sim.base_url, params=params, timeout=10).content


def test_attack_over_the_control_api() -> None:
    with OaiSimulator(SimulatedRepository(records=5, seed=1)) as sim:
        control = sim.base_url.replace("/oai", "/_control/attack_next")
        assert requests.post(control, json={"kind": "nonsense"}, timeout=10).status_code == 400
        assert requests.post(control, json={"kind": "deep_xml", "size": 300}, timeout=10).json() == {"ok": True}
        body = requests.get(sim.base_url, params={"verb": "Identify"}, timeout=10).content
        assert body.count(b"<deep>") == 300 and body.rstrip().endswith(b"</OAI-PMH>")
