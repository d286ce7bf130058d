"""Idle keep-alive closing, built once in the loopback base for every simulator: what real
servers do to a connection that waits (Apache's KeepAliveTimeout 5 s, announced as
``Keep-Alive: timeout=5, max=N`` as recorded from a production Sierra)."""

from __future__ import annotations

import http.client

import pytest

from include.simulators.iiif.server import IiifServer
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue


def _get(conn: http.client.HTTPConnection, path: str) -> http.client.HTTPResponse:
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    return response


def test_every_simulator_announces_its_idle_timeout_counting_the_requests_down() -> None:
    with SierraSimulator(SimulatedCatalogue(bibs=3)) as sierra, \
            OaiSimulator(SimulatedRepository(records=3)) as oai, IiifServer() as iiif:
        conn = http.client.HTTPConnection("127.0.0.1", sierra.port)
        assert _get(conn, "/iii/sierra-api/v6/info/token").getheader("Keep-Alive") == "timeout=5, max=100"
        assert _get(conn, "/iii/sierra-api/v6/info/token").getheader("Keep-Alive") == "timeout=5, max=99"
        conn.close()
        for port, path in ((oai.port, "/oai?verb=Identify"), (iiif.port, "/stream/collection.json")):
            conn = http.client.HTTPConnection("127.0.0.1", port)
            assert _get(conn, path).getheader("Keep-Alive") == "timeout=5"
            conn.close()


def test_closing_idle_connections_on_demand_leaves_the_client_a_closed_connection() -> None:
    with OaiSimulator(SimulatedRepository(records=3)) as sim:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port)
        _get(conn, "/oai?verb=Identify")
        assert sim.close_idle_connections() == 1
        assert conn.sock is not None and conn.sock.recv(1) == b""  # the server's FIN: end of stream
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            _get(conn, "/oai?verb=Identify")
        conn.close()
        assert sim.close_idle_connections() == 0  # nothing idle any more


def test_without_a_timeout_an_idle_connection_stays_open() -> None:
    with OaiSimulator(SimulatedRepository(records=3), keep_alive_timeout=None) as sim:
        conn = http.client.HTTPConnection("127.0.0.1", sim.port)
        assert _get(conn, "/oai?verb=Identify").getheader("Keep-Alive") is None
        assert _get(conn, "/oai?verb=Identify").status == 200  # the same connection, served again
        conn.close()
