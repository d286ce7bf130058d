"""Pacing, retries and the server's connection handling must not feed each other.

Against a Sierra server that closes idle keep-alive connections after 5 s and answers 500/135
on a few poison bibs, a full load crawled: the 500/135 answers of the export's bisection
counted as strain on the host and grew its back-off past 5 s; from then on every request
waited for its slot longer than the server keeps a connection, found its pooled connection
closed, failed, was counted as strain again, and the back-off stayed at its cap. Here the
host's pacing state is in memory (its sleeps are the simulator's idle timeout passing, driven
at once), so each link of that loop is checked without waiting for it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.politeness import Pacer, Reservation
from partner_harvest.sierra.harvester import SierraAdapter
from partner_harvest.transport import PartnerSession
from tests.support.harness import SIERRA_KEY, SIERRA_SECRET, SierraHarness
from tests.support.partners import oai_partner, sierra_partner

if TYPE_CHECKING:
    from partner_harvest.registry import Partner


class MemoryPacing:
    """The host's pacing state in memory: every slot starts ``wait`` seconds from now; strains counted."""

    def __init__(self, wait: float = 0.0) -> None:
        self.wait = wait
        self.strains = 0
        self.reserved = 0

    def __call__(self) -> MemoryPacing:  # the factory build_adapter calls on first need
        return self

    def register(self, partner_id: str, host: str, delay_ms: int) -> None: ...

    def reserve(self, host: str, delay_ms: int, healthy: int, recovery: float) -> Reservation:
        self.reserved += 1
        return Reservation(self.wait, float(delay_ms), 0.0)

    def strain(self, host: str, step_ms: int, cap_ms: int) -> float:
        self.strains += 1
        return float(step_ms)

    def close(self) -> None: ...


def test_a_connection_closed_while_its_request_waited_for_a_slot_is_replaced_before_it_is_sent(caplog: pytest.LogCaptureFixture) -> None:
    """The server's idle timeout passes while a request waits for its pacing slot: the pooled
    connection it was handed is closed by then. It must be replaced before the request goes
    out, not fail (and count as strain, and be retried)."""
    pacing = MemoryPacing(wait=6.0)
    with OaiSimulator(SimulatedRepository(records=40, page_size=10)) as sim:
        adapter = build_adapter(oai_partner(request_delay=500), Endpoint(sim.base_url), pacing=pacing)
        assert isinstance(adapter, OaiAdapter)
        session = adapter.client.session
        assert isinstance(session, PartnerSession) and isinstance(session.pacer, Pacer)

        def idle_passes(seconds: float) -> None:  # 6 s pass: the server closes idle connections
            sim.close_idle_connections()

        session.pacer._sleep = idle_passes
        with caplog.at_level(logging.WARNING):
            pages = list(adapter.client.list_pages("ListRecords", metadata_prefix="oai_dc", set_spec=None,
                                                   from_=None, until=None))
        assert len(pages) == 4 and sim.idle_closed >= 3
    assert pacing.strains == 0, "a connection the server closed during the pacing wait counted as strain"
    assert not [r for r in caplog.records if "failed" in r.getMessage()], caplog.text


def test_a_stale_pooled_connection_a_fresh_one_serves_is_no_strain_but_a_fresh_one_failing_is() -> None:
    """A request on a reused connection that the server drops without an answer is sent again
    on a new connection at once (urllib3's retry): answered there, the host is fine; a new
    connection failing too is strain."""
    pacing = MemoryPacing()
    with SierraSimulator(SimulatedCatalogue(bibs=10), client_key=SIERRA_KEY, client_secret=SIERRA_SECRET) as sim:
        adapter = build_adapter(sierra_partner(), Endpoint(sim.base_url, SIERRA_KEY, SIERRA_SECRET), pacing=pacing)
        assert isinstance(adapter, SierraAdapter)
        adapter.client.server_time()  # the token, then /info/token: one pooled connection
        sim.empty_reply_next(1)  # the server had closed it: the next request on it gets nothing
        adapter.client.server_time()
        assert pacing.strains == 0
        sim.empty_reply_next(2)  # the reused one and then a new one: the host is failing
        adapter.client.server_time()
        assert pacing.strains == 1


def test_a_poison_bibs_500_135_is_the_records_error_not_strain_on_the_host(conn: psycopg.Connection) -> None:
    """bibs/marc answers 500/135 on every block holding a poison bib, however small: the export
    bisects down to it and fetches it through GET bibs. Those answers are about one record."""
    pacing = MemoryPacing()
    catalogue = SimulatedCatalogue(bibs=300, poison_every=100)
    with SierraSimulator(catalogue, client_key=SIERRA_KEY, client_secret=SIERRA_SECRET) as sim:
        runs = Paced(sim, conn, sierra_partner(), pacing)
        runs.run("full")
        refused = sum(1 for r in sim.requests if r.get("status") == 500)
    assert runs.held() == catalogue.live_ids()
    assert pacing.strains == 0, f"{pacing.strains} strains from the export's 500/135 answers ({refused} seen)"


class Paced(SierraHarness):
    """A Sierra partner whose session is paced through ``pacing``."""

    def __init__(self, sim: SierraSimulator, conn: psycopg.Connection, partner: Partner, pacing: MemoryPacing) -> None:
        super().__init__(sim, conn, partner)
        self.pacing = pacing

    def adapter(self) -> SierraAdapter:
        adapter = build_adapter(self.partner, self.endpoint(), pacing=self.pacing)
        assert isinstance(adapter, SierraAdapter)
        adapter.sleep = self.sleeps.append
        return adapter


@pytest.mark.parametrize("announced", ["timeout=5, max=100", "timeout=5"])
def test_the_servers_announced_idle_timeout_is_read(announced: str) -> None:
    from partner_harvest.transport import keep_alive_timeout

    assert keep_alive_timeout(announced) == 5.0
    assert keep_alive_timeout(None) is None and keep_alive_timeout("max=3") is None


def test_a_poison_bibs_135_is_bisected_at_once_not_retried_by_the_client(conn: psycopg.Connection) -> None:
    """135 says bib2Marc already failed twice; the client's own retries (2 s, then 4 s, by
    default) only delayed the bisection by 6 s a poison bib: a 12,000-bib full load with 12 of
    them spent 72 of its 90 s asleep."""
    catalogue = SimulatedCatalogue(bibs=150, poison_every=120, deleted_fraction=0.0, suppressed_fraction=0.0)
    with SierraSimulator(catalogue, client_key=SIERRA_KEY, client_secret=SIERRA_SECRET) as sim:
        runs = Paced(sim, conn, sierra_partner(), MemoryPacing())
        runs.run("full")
        first = [r for r in sim.requests if r["path"].endswith("/bibs/marc") and r["query"].get("limit") == "100"
                 and r["status"] == 500]
    assert runs.held() == catalogue.live_ids()
    assert len(first) == 1, f"the failing block was asked {len(first)} times at its own size before the bisection"
