"""An IIIF Change Discovery partner pointed at the museum simulator, run as the DAG runs it."""

from __future__ import annotations

from typing import Any

from partner_harvest.factory import Endpoint
from partner_harvest.registry import Partner
from partner_harvest.run import RunResult
from tests.support.harness import Harness
from tests.support.partners import WHOLE, _entry, fast_http, partner_from_entry


def iiif_partner(id: str = "rijks", *, retries: int = 2, iiif: dict[str, Any] | None = None, **fields: Any) -> Partner:
    """An IIIF Change Discovery partner: no lag (the simulator's clock is exact), 4 pool slots."""
    options: dict[str, Any] = {"http": fast_http(retries), "iiif": {"description_concurrency": 4, **(iiif or {})}}
    defaults = {"id": id, "protocol": "iiif-change-discovery", "conn_id": "unused", "lag": "0s", "pool_slots": 4,
                "slicing": dict(WHOLE), "options": options}
    return partner_from_entry(_entry(defaults, fields))


class IiifHarness(Harness):
    """``run`` returns the whole RunResult; the Connection's host is the collection URL."""

    pages_read = 0  # the stream pages a test counted at the server for this harness's runs

    def endpoint(self) -> Endpoint:
        return Endpoint(self.sim.collection_url)

    def run(self, mode: str = "incremental", **kw: Any) -> RunResult:
        return self.run_through(mode, **kw)

    def live(self) -> set[str]:
        museum = self.sim.museum
        return {museum.identifier(self.sim.base_url, slug) for slug in museum.live}
