"""The OAI-PMH partners real aggregators have: credentials, several sets, ListIdentifiers + GetRecord.

Each test runs nights through the pipeline (partner_harvest.run, as the DAG does) against
the simulator and compares ``records`` with what the partner holds, identifier for identifier.
"""

from __future__ import annotations

import logging

import psycopg
import pytest
from psycopg import sql

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.errors import ConfigurationError, PartnerHttpError
from partner_harvest.factory import Endpoint
from tests.support.harness import OaiHarness
from tests.support.partners import oai_partner

SECRET = "s3cr3t+key/of=the&museum"  # characters that need URL encoding, on purpose
CREDENTIALS = {  # form -> (what the simulator requires, the Connection's login and extras)
    "basic": ({"login": "harvester"}, "harvester", {}),
    "bearer": ({}, None, {"auth": "bearer"}),
    "header": ({"name": "Token"}, None, {"auth": "header", "auth_header": "Token"}),
    "query": ({"name": "apikey"}, None, {"auth": "query", "auth_param": "apikey"}),
}


class Harness(OaiHarness):
    """An OAI partner whose Connection carries login, password and extras."""

    def __init__(self, sim, conn, partner, login=None, password=None, extra=None):
        super().__init__(sim, conn, partner)
        self.login, self.password, self.extra = login, password, extra or {}

    def endpoint(self) -> Endpoint:
        return Endpoint(self.sim.base_url, self.login, self.password, self.extra)


def night(repo: SimulatedRepository) -> int:
    """A night of staff work: edits, deletions, additions; how many records changed."""
    repo.advance_clock(3600)
    return len({*repo.edit(7), *repo.delete(3), *repo.add(4)})


def texts_holding(conn: psycopg.Connection, needle: str) -> list[str]:
    """Every table.column of the aggregation holding ``needle`` in any row (as text)."""
    found = []
    tables = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                          "AND table_type = 'BASE TABLE'").fetchall()
    for (table,) in tables:
        query = sql.SQL("SELECT count(*) FROM {} t WHERE t::text LIKE %s").format(sql.Identifier(table))
        if conn.execute(query, (f"%{needle}%",)).fetchone()[0]:
            found.append(table)
    conn.commit()
    return found


# -------------------------------------------------------------------- credentials


@pytest.mark.parametrize("form", sorted(CREDENTIALS))
def test_each_credential_form_harvests_exactly_and_the_secret_is_nowhere(form, conn, caplog) -> None:
    required, login, extra = CREDENTIALS[form]
    repo = SimulatedRepository(records=240, page_size=40, deleted_fraction=0.05, seed=41)
    with OaiSimulator(repo) as sim, caplog.at_level(logging.DEBUG):
        sim.require_credentials(form, SECRET, **required)
        harness = Harness(sim, conn, oai_partner(), login, SECRET, extra)
        window, stats, result = harness.run()
        assert window.is_full and harness.held() == repo.live_identifiers() and stats.pages == 6
        changed = night(repo)
        window, stats, result = harness.run()
        assert not window.is_full and stats.fetched == changed and result.purged == 3
        assert harness.held() == repo.live_identifiers()
        assert sim.refused_credentials == 0 and len(sim.requests) == 6 + 1 + 1 + 1  # 6 pages, Identify x2, one list
        # continuations carry verb and token only, as far as OAI-PMH is concerned
        assert all(set(r) == {"verb", "resumptionToken"} for r in sim.requests if "resumptionToken" in r)

        sim.require_credentials(form, "another-secret", **required)  # the partner rotated its secret
        with pytest.raises(PartnerHttpError) as failed:
            harness.run()
        assert "HTTP 401" in str(failed.value)
    assert "s3cr3t" not in caplog.text and "s3cr3t" not in str(failed.value)
    assert texts_holding(conn, SECRET) == [] and texts_holding(conn, "s3cr3t") == []


def test_a_secret_in_a_request_url_is_redacted_from_logs_and_errors(conn, caplog) -> None:
    """The query form puts the secret in every request URL: a retry's log line and a failure's
    error (harvest_runs.error, the alert) show it as ***."""
    repo = SimulatedRepository(records=30, page_size=40, seed=42)
    with OaiSimulator(repo) as sim, caplog.at_level(logging.DEBUG):
        sim.require_credentials("query", SECRET, name="apikey")
        sim.fail_next(50, status=503)
        harness = Harness(sim, conn, oai_partner(), None, SECRET, {"auth": "query", "auth_param": "apikey"})
        with pytest.raises(PartnerHttpError) as failed:
            harness.run()
    retries = [r.getMessage() for r in caplog.records if "failed (HTTP 503); retry" in r.getMessage()]
    assert retries and all("apikey=***" in line for line in retries), retries
    assert "s3cr3t" not in caplog.text and "s3cr3t" not in str(failed.value) and failed.value.__cause__ is None
    assert texts_holding(conn, "s3cr3t") == []


def test_a_connection_that_cannot_say_how_to_send_its_secret_is_a_configuration_error(conn) -> None:
    repo = SimulatedRepository(records=5, seed=43)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(), None, SECRET, {"auth": "header"})
        with pytest.raises(ConfigurationError, match="auth_header") as failed:
            harness.run()
    assert SECRET not in str(failed.value) and sim.requests == []
