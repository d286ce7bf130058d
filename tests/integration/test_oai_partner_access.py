"""The OAI-PMH partners real aggregators have: credentials, several sets, ListIdentifiers + GetRecord.

Each test runs nights through the pipeline (partner_harvest.run, as the DAG does) against
the simulator and compares ``records`` with what the partner holds, identifier for identifier.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

import psycopg
import pytest
from psycopg import sql

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.errors import ConfigurationError, PartnerHttpError
from partner_harvest.factory import Endpoint
from tests.support.checks import present
from tests.support.harness import OaiHarness
from tests.support.partners import oai_partner

if TYPE_CHECKING:
    from collections.abc import Iterable

    from partner_harvest.registry import Partner

SECRET = "s3cr3t+key/of=the&museum"  # characters that need URL encoding, on purpose
CREDENTIALS = {  # form -> (what the simulator requires, the Connection's login and extras)
    "basic": ({"login": "harvester"}, "harvester", {}),
    "bearer": ({}, None, {"auth": "bearer"}),
    "header": ({"name": "Token"}, None, {"auth": "header", "auth_header": "Token"}),
    "query": ({"name": "apikey"}, None, {"auth": "query", "auth_param": "apikey"}),
}


class Harness(OaiHarness):
    """An OAI partner whose Connection carries login, password and extras."""

    def __init__(self, sim: OaiSimulator, conn: psycopg.Connection, partner: Partner, login: str | None = None,
                 password: str | None = None, extra: dict[str, str] | None = None) -> None:
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
    found: list[str] = []
    tables = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                          "AND table_type = 'BASE TABLE'").fetchall()
    for (table,) in tables:
        query = sql.SQL("SELECT count(*) FROM {} t WHERE t::text LIKE %s").format(sql.Identifier(table))
        if present(conn.execute(query, (f"%{needle}%",)).fetchone())[0]:
            found.append(table)
    conn.commit()
    return found


# -------------------------------------------------------------------- credentials


@pytest.mark.parametrize("form", sorted(CREDENTIALS))
def test_each_credential_form_harvests_exactly_and_the_secret_is_nowhere(form: str, conn: psycopg.Connection,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
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


def test_a_secret_in_a_request_url_is_redacted_from_logs_and_errors(conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
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


def test_a_connection_that_cannot_say_how_to_send_its_secret_is_a_configuration_error(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=5, seed=43)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(), None, SECRET, {"auth": "header"})
        with pytest.raises(ConfigurationError, match="auth_header") as failed:
            harness.run()
    assert SECRET not in str(failed.value) and sim.requests == []


# ---------------------------------------------------------------------------- sets


ALLOWED = ("type:painting", "type:print", "dept:paintings")  # paintings of the paintings department in two
EXCLUDED = ("dept:asian-art",)


def selected(repo: SimulatedRepository, allowed: Iterable[str] = ALLOWED, excluded: Iterable[str] = EXCLUDED) -> set[str]:
    """The live records in an allowed set and in no excluded one (the set hierarchy included)."""
    def within(specs: Iterable[str], ancestors: Iterable[str]) -> bool:
        return any(s == a or s.startswith(a + ":") for s in specs for a in ancestors)
    return {i for i in repo.live_identifiers() if within(repo.in_sets(i), allowed) and not within(repo.in_sets(i), excluded)}


def moves(repo: SimulatedRepository, seed: int) -> None:
    """Records move between sets: out of the allowed ones, into them, into and out of the excluded one."""
    live = sorted(repo.live_identifiers())[seed::7]
    repo.move_to(live[0:4], "sculpture")  # out of the allowed types (some stay in dept:paintings)
    repo.move_to(live[4:8], "print", "prints")  # into an allowed set
    repo.move_to(live[8:11], None, "asian-art")  # into the excluded set
    asian = [i for i in sorted(repo.live_identifiers()) if "dept:asian-art" in repo.in_sets(i)]
    repo.move_to(asian[:3], "painting", "paintings")  # out of it, into two allowed sets


@pytest.mark.parametrize("method", ["list_records", "identifiers_then_get"])
def test_sets_and_exclusions_hold_the_selection_over_nights_of_moves(method: str, conn: psycopg.Connection) -> None:
    from partner_harvest.reconcile import reconcile

    repo = SimulatedRepository(records=300, page_size=40, deleted_fraction=0.04, seed=44, header_sets="leaf")
    with OaiSimulator(repo) as sim:
        partner = oai_partner(sets=list(ALLOWED), exclude_sets=list(EXCLUDED), pool_slots=2,
                              options={"oai": {"method": method}})
        harness = Harness(sim, conn, partner)
        window, stats, result = harness.run()
        assert window.is_full and harness.held() == selected(repo)
        lists = [r for r in sim.requests if r.get("verb") in ("ListRecords", "ListIdentifiers") and "set" in r]
        assert sorted(r["set"] for r in lists) == sorted(ALLOWED)  # one list per set, no sweep on a full harvest
        for seed in (1, 2):  # two nights of moves, edits, deletions and additions
            moves(repo, seed)
            night(repo)
            sim.clear_requests()
            window, stats, result = harness.run()
            assert harness.held() == selected(repo), seed
            sweep = [r for r in sim.requests if r.get("verb") == "ListIdentifiers" and "set" not in r and "from" in r]
            assert len(sweep) == 1  # the whole repository's headers of the window, for the leavers
        reasons: dict[str, int] = dict(conn.execute("SELECT reason, count(*) FROM deletions GROUP BY reason").fetchall())
        assert reasons.get("outside_sets") and reasons.get("excluded_set") and reasons.get("tombstone"), reasons
        # a quiet night: one request, the whole repository's headers of the window
        repo.advance_clock(3600)
        harness.run()  # the lag's overlap with the last night
        repo.advance_clock(3600)
        adapter = harness.adapter()
        sim.clear_requests()
        assert adapter.window_is_empty(harness.freeze())
        assert [r["verb"] for r in sim.requests] == ["Identify", "ListIdentifiers"] and "set" not in sim.requests[1]
        # the reconcile compares against the same selection, also after the selection changed
        narrower = partner.evolve(exclude_sets=[*EXCLUDED, "dept:prints"])
        outcome = reconcile(harness.adapter(), conn, partner, "reconcile-1")
        assert outcome.purged == 0 and harness.held() == selected(repo)
        harness.partner = narrower
        reconcile(harness.adapter(), conn, narrower, "reconcile-2", allow_mass_purge=True)
        assert harness.held() == selected(repo, excluded=(*EXCLUDED, "dept:prints"))


# ---------------------------------------------------------------- identifiers_then_get


def test_a_repository_whose_list_records_always_fails_is_harvested_with_get_record(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=260, page_size=40, deleted_fraction=0.05, seed=45)
    with OaiSimulator(repo) as sim:
        sim.break_verb("ListRecords", 500)
        partner = oai_partner(pool_slots=3, options={"oai": {"method": "identifiers_then_get"}},
                              slicing={"threshold_records": 100, "target_records": 100, "max_slices": 3})
        harness = Harness(sim, conn, partner)
        live = len(repo.live_identifiers())
        result = harness.run_through()
        assert len(result.pieces) == 3 and harness.held() == repo.live_identifiers()  # a sliced full harvest
        gets = [r for r in sim.requests if r.get("verb") == "GetRecord"]
        assert len(gets) == live and len({r["identifier"] for r in gets}) == live  # deleted headers: no GetRecord
        requests = {"full": Counter(r.get("verb") for r in sim.requests)}
        for name in ("night 1", "night 2"):
            changed = night(repo)
            deleted_meanwhile = sorted(repo.live_identifiers())[5]
            repo.edit_ids([deleted_meanwhile])
            sim.delete_on_get([deleted_meanwhile])  # listed, then deleted before its GetRecord
            sim.clear_requests()
            sim.reset_in_flight()
            window, stats, applied = harness.run()
            assert harness.held() == repo.live_identifiers() and deleted_meanwhile not in harness.held()
            assert stats.fetched >= changed + 1  # and the last night's changes again: the lag overlaps
            requests[name] = Counter(r.get("verb") for r in sim.requests)
            assert 1 <= sim.max_in_flight <= 3
        assert not [r for r in sim.requests if r.get("verb") == "ListRecords"]
        print(f"\nrequests with identifiers_then_get: {requests}")
        # the quiet night and the reconcile need no ListRecords either
        repo.advance_clock(3600)
        harness.run()  # the lag's overlap with the last night
        repo.advance_clock(3600)
        assert harness.adapter().window_is_empty(harness.freeze())
        from partner_harvest.reconcile import reconcile

        assert reconcile(harness.adapter(), conn, partner, "reconcile-1").purged == 0
        assert sim.errors == [] and not [r for r in sim.requests if r.get("verb") == "ListRecords"]


def test_get_record_answers_between_the_two_steps(conn: psycopg.Connection) -> None:
    """idDoesNotExist (a repository that keeps no deletions): a deletion; one 403: that record
    quarantined; many 403s in a row: the route is gone, the run stops."""
    repo = SimulatedRepository(records=80, page_size=40, deleted_fraction=0.0, seed=46, deleted_record="no")
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(lag="0s", options={"oai": {"method": "identifiers_then_get"}}))
        harness.run()
        repo.advance_clock(3600)
        gone, edited = repo.edit(2)
        sim.delete_on_get([gone])
        harness.run()
        assert gone not in harness.held() and harness.held() == repo.live_identifiers()
        sim.break_verb("GetRecord", 403)
        repo.advance_clock(3600)
        repo.edit(3)
        sim.clear_requests()
        window, stats, applied = harness.run()
        gets = [r for r in sim.requests if r.get("verb") == "GetRecord"]
        assert applied.quarantined == len(gets) >= 3  # restricted records: quarantined by id, the run goes on
        reasons = {r[0].split(":")[0] for r in conn.execute("SELECT reason FROM quarantine").fetchall()}
        assert reasons == {"GetRecord answered HTTP 403 Forbidden"}, reasons
        repo.advance_clock(3600)
        repo.edit(12)
        sim.clear_requests()
        with pytest.raises(PartnerHttpError, match="10 GetRecord requests in a row answered HTTP 403"):
            harness.run()
        assert len([r for r in sim.requests if r.get("verb") == "GetRecord"]) == 10  # then it stopped


def test_a_record_that_leaves_the_one_set_is_no_longer_held(conn: psycopg.Connection) -> None:
    """Regression: with ``set``, a record moved out of the set stayed held for ever (no list of
    the set shows it again, and the reconcile's GetRecord found it live)."""
    repo = SimulatedRepository(records=120, page_size=50, deleted_fraction=0.0, seed=47)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(set="type:print"))
        harness.run()
        prints = sorted(i for i in repo.live_identifiers() if "type:print" in repo.in_sets(i))
        assert harness.held() == set(prints)
        repo.advance_clock(3600)
        repo.move_to(prints[:3], "painting")
        harness.run()
        assert harness.held() == set(prints[3:])
