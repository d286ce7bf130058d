"""`partner-harvest check` against the three simulators on loopback, each fault switched on
in turn: the report names it (``[fault]``), says whether the harvest will work, and the
exit status follows. No database, no Airflow; no real pause (the check's sleep is given).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from include.simulators.iiif.museum import Museum
from include.simulators.iiif.server import IiifServer
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest import protocols, readiness
from partner_harvest.cli import main
from partner_harvest.factory import Endpoint
from partner_harvest.readiness import FAIL, INFO, OK, WARN, CheckSettings, Report, run_check
from tests.support.iiif_harness import iiif_partner
from tests.support.partners import oai_partner, sierra_partner

NOW = CheckSettings(delay=0, pause=0)
SECRET = "s3cret-value-never-shown"


def faults(report: Report) -> dict[str, str]:
    return {f.fault: f.status for f in report.findings if f.fault}


# -- OAI-PMH ---------------------------------------------------------------------------------

def oai_check(repo: SimulatedRepository | None = None, *, setup: Callable[[OaiSimulator], Any] = lambda sim: None,
              endpoint: dict[str, Any] | None = None, expire_on_pause: bool = False,
              settings: CheckSettings = NOW, **partner: Any) -> tuple[Report, OaiSimulator]:
    repo = repo or SimulatedRepository(records=300, page_size=50, seed=41)
    with OaiSimulator(repo) as sim:
        setup(sim)
        sleep = (lambda seconds: sim.expire_tokens()) if expire_on_pause else (lambda seconds: None)
        report = run_check(oai_partner("museum", **{"metadata_prefix": "auto", **partner}),
                           Endpoint(sim.base_url, **(endpoint or {})), settings, sleep=sleep)
        assert report.requests == sim.requests_served + sim.refused_credentials  # every request counted
    return report, sim


def test_an_honest_oai_endpoint_is_ready_in_a_few_requests() -> None:
    report, sim = oai_check()
    assert report.verdict == "ready" and report.exit_status == 0
    assert {f.status for f in report.findings} == {OK}, report.text()
    subjects = [f.subject for f in report.findings]
    assert subjects == ["Identify", "deletions", "metadata formats", "ListIdentifiers", "window", "ListRecords",
                        "validation", "resumptionToken"]
    assert report.requests == 6  # Identify, ListMetadataFormats, the list, the window twice, the token
    assert "the harvest asks for lido" in report.text()


def _refuse(sim: OaiSimulator) -> None:
    sim.refuse_windows_longer_than((sim.repo.clock_epoch - sim.repo.earliest_stamp()) // 6, "413")


@pytest.mark.parametrize("fault, status, kw", [
    ("window-refused", WARN, {"setup": _refuse}),
    ("from-ignored", FAIL, {"setup": lambda sim: sim.ignore_from()}),
    ("token-expires", WARN, {"expire_on_pause": True}),
    ("list-records-broken", FAIL, {"setup": lambda sim: sim.break_verb("ListRecords", 500)}),
    ("credentials-refused", FAIL, {"setup": lambda sim: sim.require_credentials("bearer", SECRET),
                                   "endpoint": {"password": "wrong-" + SECRET, "extra": {"auth": "bearer"}}}),
    ("credentials-required", FAIL, {"setup": lambda sim: sim.require_credentials("basic", SECRET, login="me")}),
    ("no-deletions", WARN, {"repo": SimulatedRepository(records=300, page_size=50, seed=41, deleted_record="no")}),
    ("deletions-transient", WARN, {"repo": SimulatedRepository(records=300, page_size=50, seed=41,
                                                               deleted_record="transient")}),
    ("records-rejected", FAIL, {"repo": SimulatedRepository(records=300, page_size=50, seed=41, invalid_every=1)}),
    ("prefix-not-offered", FAIL, {"metadata_prefix": "marcxml"}),
    ("set-unknown", FAIL, {"sets": ["type:painting", "type:pastel"]}),
    ("get-record-forbidden", FAIL, {"setup": lambda sim: sim.break_verb("GetRecord", 403),
                                    "options": {"oai": {"method": "identifiers_then_get"}}}),
    ("granularity-refused", FAIL, {"repo": SimulatedRepository(records=300, page_size=50, seed=41, granularity="day"),
                                   "setup": lambda sim: sim.announce_granularity("seconds")}),
    ("budget-spent", INFO, {"settings": CheckSettings(delay=0, pause=0, max_requests=3)}),
])
def test_each_oai_fault_is_named_in_the_report(fault: str, status: str, kw: dict[str, Any]) -> None:
    report, _ = oai_check(**kw)
    assert faults(report).get(fault) == status, report.text()
    assert f"[{fault}]" in report.text()
    assert report.exit_status == (1 if status == FAIL else 0)
    assert SECRET not in report.text() and SECRET not in json.dumps(report.to_json())


def test_a_repository_refusing_long_windows_is_still_probed_on_a_window_it_answers() -> None:
    report, _ = oai_check(setup=_refuse)
    assert report.verdict == "ready"
    assert faults(report) == {"window-refused": WARN}
    assert [f.status for f in report.findings if f.subject in ("window", "ListRecords", "validation")] == [OK] * 3


def test_accepted_credentials_are_said_and_never_shown() -> None:
    report, _ = oai_check(setup=lambda sim: sim.require_credentials("query", SECRET, name="apikey"),
                          endpoint={"password": SECRET, "extra": {"auth": "query", "auth_param": "apikey"}})
    assert report.verdict == "ready"
    assert report.findings[0] == readiness.Finding(OK, "credentials", "accepted (sent as the query parameter apikey)")
    assert SECRET not in report.text()


def test_identifiers_then_get_is_probed_with_get_record_not_list_records() -> None:
    report, sim = oai_check(setup=lambda sim: sim.break_verb("ListRecords", 500),
                            options={"oai": {"method": "identifiers_then_get"}})
    assert report.verdict == "ready", report.text()
    assert "GetRecord" in [f.subject for f in report.findings]
    assert not [r for r in sim.requests if r.get("verb") == "ListRecords"]


def test_the_check_is_paced_and_bounded() -> None:
    slept: list[float] = []
    repo = SimulatedRepository(records=300, page_size=50, seed=41)
    with OaiSimulator(repo) as sim:
        report = run_check(oai_partner("museum", request_delay=2000), Endpoint(sim.base_url),
                           CheckSettings(delay=0.5, pause=7.0, max_requests=40), sleep=slept.append)
    assert report.verdict == "ready"
    pause = [s for s in slept if s == 7.0]
    gaps = [s for s in slept if s != 7.0]
    assert len(pause) == 1 and len(gaps) == report.requests - 1  # the partner's 2 s beat the check's 0.5 s
    assert all(1.9 < gap <= 2.0 for gap in gaps), gaps


# -- Sierra ----------------------------------------------------------------------------------

def sierra_check(setup: Callable[[SierraSimulator], Any] = lambda sim: None, secret: str = "demo-secret",
                 **partner: Any) -> Report:
    catalogue = SimulatedCatalogue(bibs=300, seed=41, deleted_fraction=0.05, suppressed_fraction=0.05)
    with SierraSimulator(catalogue) as sim:
        setup(sim)
        return run_check(sierra_partner("library", **partner), Endpoint(sim.base_url, "demo-key", secret), NOW)


def test_an_honest_sierra_api_is_ready() -> None:
    report = sierra_check()
    assert report.verdict == "ready", report.text()
    assert [f.subject for f in report.findings if f.status == OK] == [
        "token", "change poll", "validation", "deletion poll", "export", "validation"]


def _strip_all(sim: SierraSimulator) -> None:
    sim.catalogue.strip_marc(sim.catalogue.sorted_live_ids(), touch=False)


@pytest.mark.parametrize("fault, status, kw", [
    ("credentials-refused", FAIL, {"secret": "wrong-" + SECRET}),
    ("no-marc", FAIL, {"setup": _strip_all}),
    ("export-failed", WARN, {"setup": lambda sim: sim.fail_export_next(135)}),
    ("export-failed", FAIL, {"setup": lambda sim: sim.fail_next(3, status=403, path_prefix="bibs/marc")}),
    ("deletion-poll-failed", FAIL, {"setup": lambda sim: sim.fail_next(10, status=500, path_prefix="deleted=true")}),
    ("change-poll-failed", FAIL, {"setup": lambda sim: sim.fail_next(10, status=500, path_prefix="updatedDate")}),
])
def test_each_sierra_fault_is_named_in_the_report(fault: str, status: str, kw: dict[str, Any]) -> None:
    report = sierra_check(**kw)
    assert faults(report).get(fault) == status, report.text()
    assert report.exit_status == (1 if FAIL in faults(report).values() else 0)
    assert SECRET not in report.text()


# -- IIIF Change Discovery -------------------------------------------------------------------

def iiif_check(setup: Callable[[IiifServer], Any] = lambda sim: None, **partner: Any) -> Report:
    museum = Museum(page_sizes=(20,))
    museum.create(50)
    with IiifServer(museum) as sim:
        setup(sim)
        return run_check(iiif_partner(**partner), Endpoint(sim.collection_url), NOW)


def test_an_honest_stream_is_ready() -> None:
    report = iiif_check()
    assert report.verdict == "ready" and {f.status for f in report.findings} == {OK}, report.text()


@pytest.mark.parametrize("fault, status, setup", [
    ("description-failed", FAIL, lambda sim: sim.museum.missing.update(sim.museum.live)),
    ("records-rejected", FAIL, lambda sim: sim.museum.invalid.update(sim.museum.live)),
    ("no-description", FAIL, lambda sim: setattr(sim.museum, "see_also_style", "none")),
    ("no-total-items", INFO, lambda sim: setattr(sim.museum, "total_items", "missing")),
    ("not-a-stream", FAIL, lambda sim: sim.fail_next(5, status=500)),
])
def test_each_iiif_fault_is_named_in_the_report(fault: str, status: str, setup: Callable[[IiifServer], Any]) -> None:
    report = iiif_check(setup)
    assert faults(report).get(fault) == status, report.text()


# -- a protocol without probes, and the command line -----------------------------------------

def test_a_protocol_without_a_readiness_check_says_so_and_does_not_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(protocols.spec_of("oai-pmh"), check=None)
    monkeypatch.setattr(readiness.protocols, "spec_of", lambda name: spec)
    report = run_check(oai_partner("museum"), Endpoint("http://127.0.0.1:9/never-asked"), NOW)
    assert report.verdict == "not checked" and report.exit_status == 0 and report.requests == 0
    assert "no readiness check yet for OAI-PMH partners" in report.text()


def test_the_command_checks_a_bare_url_and_exits_1_when_not_ready(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECK_SECRET", SECRET)
    repo = SimulatedRepository(records=300, page_size=50, seed=41)
    with OaiSimulator(repo) as sim:
        sim.require_credentials("header", SECRET, name="Token")
        argv = ["check", "--url", sim.base_url, "--protocol", "oai-pmh", "--delay", "0", "--pause", "0",
                "--password-env", "CHECK_SECRET", "--auth", "header", "--auth-name", "Token"]
        assert main([*argv, "--format", "json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["verdict"] == "ready" and out["subject"] == f"{sim.base_url} as OAI-PMH"
        sim.ignore_from()
        assert main([*argv, "--entry", "{sets: [dept]}"]) == 1
        out, err = capsys.readouterr()
    assert "[from-ignored]" in out and "NOT READY" in out and SECRET not in out + err
    assert "sets: the repository lists dept" in out


def test_the_command_refuses_what_it_cannot_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--url", "http://127.0.0.1:9/oai"]) == 1
    assert "give a registry PARTNER, or --url and --protocol" in capsys.readouterr().err
    assert main(["check", "--url", "http://127.0.0.1:9/oai", "--protocol", "oai-pmh", "--entry", "{lag: soon}"]) == 1
    assert "lag" in capsys.readouterr().err


def _faults_named(path: Path) -> set[str]:
    """The fault names a readiness module reports (probe.warn/fail/info's fourth argument,
    Finding's fifth), and records-rejected when it validates a sample."""
    source = path.read_text(encoding="utf-8")
    found = {"records-rejected"} if ".validated(" in source else set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("-ignored"):
            found.add(node.value)  # chosen before the call (from-ignored or until-ignored)
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        at = {"warn": 3, "fail": 3, "info": 3, "Finding": 4}.get(name)
        argument = node.args[at] if at is not None and len(node.args) > at else None
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            found.add(argument.value)
    return found


def test_the_onboarding_page_names_every_fault_the_probes_report() -> None:
    """docs/operator/onboarding.md's table lists, per protocol, exactly the faults its probes name."""
    library = Path(protocols.__file__).parent
    page = (library.parents[1] / "docs" / "operator" / "onboarding.md").read_text(encoding="utf-8")
    for spec in protocols.specs():
        if spec.check is None:
            continue
        package = spec.check.__module__.rsplit(".", 1)[0]
        row = next(line for line in page.splitlines() if line.startswith(f"| {spec.title} |"))
        assert set(re.findall(r"`([a-z-]+)`", row.rsplit(" | ", 1)[1])) == _faults_named(
            library / package.split(".", 1)[1] / "readiness.py"), spec.name
    assert all(f"`{fault}`" in page for fault in _faults_named(library / "readiness.py"))


def test_the_command_checks_a_registry_entry_at_a_given_url(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    registry = tmp_path / "partners.yaml"
    registry.write_text("partners:\n  - {id: museum, protocol: oai-pmh, conn_id: partner_museum, sets: [nope],\n"
                        "     options: {http: {retries: 0}}}\n", encoding="utf-8")
    with OaiSimulator(SimulatedRepository(records=100, page_size=50, seed=41)) as sim:
        status = main(["check", "museum", "--registry", str(registry), "--url", sim.base_url, "--delay", "0",
                       "--pause", "0", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 1 and out["subject"] == "partner museum (OAI-PMH)" and out["verdict"] == "not ready"
    assert [f["fault"] for f in out["findings"] if f["status"] == FAIL] == ["set-unknown"]
