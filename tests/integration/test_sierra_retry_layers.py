"""One retry layer per failure kind (Sierra): a server that keeps failing costs each call
the retries of ONE layer, not the product of two stacked ones.

The transport (urllib3, ``options.http.retries``) retries gateway answers (502/503/504)
and broken connections; the Sierra client (``options.sierra.server_error_tries``) retries
only the 500s it must read itself (their bodies carry Sierra's error codes: 135, 138).
"""

from __future__ import annotations

import pytest

from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.errors import PartnerHttpError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.registry import Partner
from partner_harvest.sierra.client import SierraClient
from partner_harvest.sierra.harvester import SierraAdapter

KEY, SECRET = "demo-key", "s3cr3t-demo-secret"
HTTP_RETRIES, SERVER_ERROR_TRIES = 4, 3


def client(sim: SierraSimulator) -> SierraClient:
    partner = Partner(id="library", protocol="sierra", conn_id="unused", options={
        "http": {"backoff_factor": 0.001, "backoff_max": 0.002, "retries": HTTP_RETRIES},
        "sierra": {"server_error_backoff": 0.001, "server_error_tries": SERVER_ERROR_TRIES},
    })
    adapter = build_adapter(partner, Endpoint(sim.base_url, KEY, SECRET))
    assert isinstance(adapter, SierraAdapter)
    return adapter.client


@pytest.mark.parametrize("status,expected", [
    (503, 1 + HTTP_RETRIES),  # the transport's layer: 5 requests (two stacked layers made 15)
    (502, 1 + HTTP_RETRIES),
    (500, SERVER_ERROR_TRIES),  # the client's layer: the transport hands a 500 over at once
])
def test_a_server_that_keeps_failing_is_retried_by_one_layer(status: int, expected: int) -> None:
    catalogue = SimulatedCatalogue(bibs=20, deleted_fraction=0.0, seed=5)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        sierra = client(sim)
        sierra.server_time()  # the token, outside the count
        sim.clear_requests()
        sim.fail_next(1000, status=status, path_prefix="/bibs")
        with pytest.raises(PartnerHttpError) as failed:
            sierra.get_json("/bibs", {"limit": 5})
        calls = [r for r in sim.requests if r["path"].endswith("/bibs")]
        assert len(calls) == expected, [r["status"] for r in calls]
        assert f"HTTP {status}" in str(failed.value) and "library" in str(failed.value)
