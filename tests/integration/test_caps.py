"""Caps a partner cannot pass: a resumptionToken's size, a chain's pages against
its completeListSize, the bytes one run may stage. Each is a registry option with a gentle
default and a one-line failure naming the partner, the cap and the request; nothing of
the run is applied. Real PostgreSQL, the OAI simulator over loopback."""

from __future__ import annotations

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.errors import PartnerCapExceeded
from partner_harvest.registry import Partner
from partner_harvest.store.apply import ApplyResult
from partner_harvest.store.db import one, scalar
from tests.support.harness import run_once
from tests.support.partners import oai_partner


def partner(limits: dict[str, float] | None = None) -> Partner:
    return oai_partner(retries=1, options={"limits": limits} if limits else {})


def harvest(sim: OaiSimulator, conn: psycopg.Connection, who: Partner, run_id: str = "r1") -> ApplyResult:
    return run_once(sim, conn, who, run_id, request=pipeline.RunRequest("full")).applied


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 600, text
    return text


def records(conn: psycopg.Connection) -> int:
    n = scalar(conn.execute("SELECT count(*) FROM records WHERE partner_id = 'museum'"))
    conn.commit()
    return n


def test_a_resumption_token_over_the_cap_fails_the_chain(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=300, page_size=100, seed=41)
    with OaiSimulator(repo) as sim:
        sim.pad_tokens(100_000)  # over the default cap (64 KiB)
        with pytest.raises(PartnerCapExceeded) as caught:
            harvest(sim, conn, partner())
        text = one_line(caught.value)
        assert "'museum'" in text and "max_token_bytes = 65536" in text and "resumptionToken of 1000" in text, text
        assert "verb=ListRecords" in text, text
        assert records(conn) == 0
        sim.pad_tokens(1_000)  # under the cap: the same partner harvests
        assert harvest(sim, conn, partner(), "r2").upserted == repo.counts()["live"]


def test_a_token_cap_is_a_registry_option(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=200, page_size=100, seed=42)
    with OaiSimulator(repo) as sim:
        sim.pad_tokens(2_000)
        with pytest.raises(PartnerCapExceeded, match="max_token_bytes = 1024"):
            harvest(sim, conn, partner({"max_token_bytes": 1024}))


def test_a_chain_longer_than_its_complete_list_size_justifies_fails(conn: psycopg.Connection) -> None:
    """The simulator announces a tenth of its list (I13: a count may be wrong): 20 pages
    where 2 are announced; at slack 3 the chain stops at page 11, naming the cap."""
    repo = SimulatedRepository(records=1000, page_size=50, deleted_fraction=0.0, seed=43)
    with OaiSimulator(repo, list_size="understated") as sim:
        with pytest.raises(PartnerCapExceeded) as caught:
            harvest(sim, conn, partner())
        text = one_line(caught.value)
        assert "page 11" in text and "completeListSize 100" in text and "chain_pages_slack = 3" in text, text
        assert "resumptionToken=" in text and "'museum'" in text
        assert records(conn) == 0
        # the slack is the partner's: at 12 the whole chain (20 pages) is justified
        assert harvest(sim, conn, partner({"chain_pages_slack": 12.0}), "r2").upserted == 1000


def test_a_chain_is_capped_in_pages_whatever_it_announces(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=500, page_size=50, seed=44)
    with OaiSimulator(repo, list_size="omitted") as sim:
        with pytest.raises(PartnerCapExceeded, match="page 5, over the cap options.limits.max_chain_pages = 4"):
            harvest(sim, conn, partner({"max_chain_pages": 4}))


def test_a_run_cannot_stage_more_than_its_cap(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=400, page_size=100, deleted_fraction=0.0, seed=45)
    with OaiSimulator(repo) as sim:
        with pytest.raises(PartnerCapExceeded) as caught:
            harvest(sim, conn, partner({"max_run_bytes": 150_000}))
        text = one_line(caught.value)
        assert "max_run_bytes = 150000" in text and "staging of changes of run r1" in text, text
        staged = one(conn.execute("SELECT count(*), max(staged_bytes) FROM staging s JOIN harvest_runs h"
                                  " USING (partner_id, run_id, channel) WHERE s.run_id = 'r1'"))
        conn.commit()
        assert staged[0] % 100 == 0 and staged[1] <= 150_000  # whole pages under the cap, none past it
        assert records(conn) == 0
