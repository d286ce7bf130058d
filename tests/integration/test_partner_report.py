"""The partner-facing report: from the library, the CLI and the health page.

Two partners harvested into one database through the real staging and apply; the report of
one must hold its runs, quarantine and warnings by reason with samples, and its proofs, and
nothing of the other partner, of the aggregation's hosts or of any secret.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

from partner_harvest.cli import main
from partner_harvest.formats.checks import Finding
from partner_harvest.records import Record, Rejected
from partner_harvest.report import build_report, report_csv, scrub
from partner_harvest.store import RunRef, apply_run, fail_run
from partner_harvest.store.runs import record_check
from tests.support.partners import oai_partner, registry_text
from tests.support.records import stage

AT = datetime(2026, 3, 1, tzinfo=timezone.utc)
ENDPOINT = "https://museum.example.org/oai?verb=Identify"
INTERNAL_ERROR = ("HTTP 503 from https://museum.example.org/oai?verb=ListRecords&from=2026-01-01, then the proxy "
                  "http://proxy.corp.internal:3128 refused; aggregation db aggregation-db.prod.internal at 10.1.2.3")


def rec(ident: str, *warnings: Finding) -> Record:
    return Record(ident, AT, "oai_dc", f'<dc xmlns="urn:x"><title>{ident}</title></dc>', (), ident, tuple(warnings))


def harvest(conn: psycopg.Connection, partner_id: str) -> None:
    no_date = Finding("dc.no_date", "no dc:date: the record lands without a year")
    items: list = [rec(f"oai:{partner_id}:{i}", *((no_date,) if i % 3 == 0 else ())) for i in range(30)]
    items += [Rejected(f"oai:{partner_id}:bad{i}", "no title", "<x/>") for i in range(8)]
    items += [Rejected(f"oai:{partner_id}:formula", "=HYPERLINK(\"http://evil.example\")", "<x/>")]
    stage(conn, partner_id, f"harvest_{partner_id}/manual__1", items)
    record_check(conn, RunRef(partner_id, f"harvest_{partner_id}/manual__1", "changes"), "oai-complete-list-size",
                 39, 39, True, "completeListSize 39 at https://museum.example.org/oai")
    apply_run(conn, partner_id, f"harvest_{partner_id}/manual__1")
    failed = RunRef(partner_id, f"harvest_{partner_id}/manual__2", "changes")
    stage(conn, partner_id, failed.run_id, [])
    fail_run(conn, failed, INTERNAL_ERROR)
    conn.commit()


@pytest.fixture
def two_partners(conn: psycopg.Connection) -> psycopg.Connection:
    harvest(conn, "museum")
    harvest(conn, "other_gallery")
    return conn


def test_the_report_holds_the_partners_runs_reasons_samples_and_proofs_and_nothing_else(two_partners: psycopg.Connection) -> None:
    now = datetime.now(timezone.utc)
    report = build_report(two_partners, oai_partner("museum"), now, endpoint=ENDPOINT, samples=3)
    text = json.dumps(report)
    assert "other_gallery" not in text  # no other partner's data
    assert report["partner"] == {"id": "museum", "protocol": "oai-pmh", "endpoint": "https://museum.example.org/oai"}
    assert {r["status"] for r in report["history"]} == {"applied", "failed"}
    (failed,) = [r for r in report["history"] if r["status"] == "failed"]
    assert failed["error"] == ("HTTP 503 from https://museum.example.org/oai, then the proxy [internal] refused; "
                               "aggregation db [internal] at [internal]")
    for secret in ("proxy.corp", "prod.internal", "10.1.2.3", "verb=ListRecords"):
        assert secret not in text
    reasons = {q["reason"]: q for q in report["quarantine"]}
    assert reasons["no title"]["rejects"] == 8 and reasons["no title"]["still_quarantined"] == 8
    assert len(reasons["no title"]["samples"]) == 3  # capped
    assert all(s["identifier"].startswith("oai:museum:bad") for s in reasons["no title"]["samples"])
    (warned,) = report["warnings"]
    assert warned["check"] == "dc.no_date" and warned["records_landed"] == 10 and len(warned["samples"]) == 3
    (proof,) = report["completeness"]
    assert proof["check"] == "oai-complete-list-size" and proof["ok"] is True and proof["expected"] == 39
    assert report["summary"]["runs_failed"] == 1 and report["summary"]["records_held"] == 30

    rows = list(csv.DictReader(io.StringIO(report_csv(report))))
    sections = {row["section"] for row in rows}
    assert sections == {"run", "quarantine", "quarantine_sample", "warning", "warning_sample", "completeness"}
    formula = [row for row in rows if row["section"] == "quarantine" and "HYPERLINK" in row["reason"]]
    assert formula and formula[0]["reason"].startswith("'=")  # a spreadsheet shows it, never runs it


def test_scrub_keeps_the_partners_own_host_and_file_names() -> None:
    assert scrub("GET https://museum.example.org/oai?verb=Identify failed", "museum.example.org") == \
        "GET https://museum.example.org/oai failed"
    assert scrub("schema oai_dc.xsd, host museum.example.org:8443", "museum.example.org") == \
        "schema oai_dc.xsd, host museum.example.org:8443"
    assert scrub("resolve db-1.internal.example failed", "museum.example.org") == "resolve [internal] failed"


def test_the_cli_and_the_health_page_serve_the_report(two_partners: psycopg.Connection, db: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "partners.yaml"
    path.write_text(registry_text({"id": "museum", "protocol": "oai-pmh", "conn_id": "partner_museum"},
                                  {"id": "other_gallery", "protocol": "oai-pmh", "conn_id": "partner_other"}))
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", raising=False)
    argv = ["report", "museum", "--registry", str(path), "--database-url", db, "--endpoint", ENDPOINT]
    assert main([*argv, "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["partner"]["id"] == "museum" and "other_gallery" not in out
    assert main([*argv, "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("section,run_id,channel,")
    assert main(["report", "nobody", "--registry", str(path), "--database-url", db]) == 1
    assert "no partner 'nobody'" in capsys.readouterr().err

    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.registry import load_registry
    from partner_harvest.store import connect

    registry = load_registry(path)
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: {})
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(source, "partner_base_url", lambda conn_id: ENDPOINT if conn_id == "partner_museum" else None)
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))
    client = TestClient(health_app.create_app())
    page = client.get("/partner/museum").text
    assert 'href="/partner/museum/report.json"' in page and 'href="/partner/museum/report.csv"' in page
    assert 'href="/partner/museum/report.csv" class="report-link' in client.get("/").text
    served = client.get("/partner/museum/report.json")
    assert served.status_code == 200 and "attachment" in served.headers["content-disposition"]
    assert served.json()["partner"]["endpoint"] == "https://museum.example.org/oai"
    assert client.get("/partner/museum/report.csv").headers["content-type"].startswith("text/csv")
    assert client.get("/partner/museum/report.xml").status_code == 404
    assert client.get("/partner/nobody/report.json").status_code == 404
