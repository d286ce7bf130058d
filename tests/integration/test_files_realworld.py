"""Real published files replayed through the file-delivery adapter into PostgreSQL
(tests/fixtures/realworld/files/SOURCES.md): three dated exports of the National Gallery of
Art's constituents table, Library of Congress MARC records, Cooper Hewitt's exhibitions as
JSON Lines. The expected outcomes are counted from the files (SOURCES.md says which rows
differ between the exports), not from the harvester."""

from __future__ import annotations

import gzip
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from tests.support.files_harness import FilesHarness, files_partner

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "files"


def deliver(folder: Path, date: str, name: str, source: Path, *, gz: bool = False) -> None:
    target = folder / date / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        target.with_name(name + ".gz").write_bytes(gzip.compress(source.read_bytes(), mtime=0))
    else:
        shutil.copyfile(source, target)
    (folder / date / "_SUCCESS").write_bytes(b"")


def test_three_exports_of_the_national_gallery(tmp_path: Path, conn: psycopg.Connection) -> None:
    partner = files_partner("nga", files={
        "full": "{date:%Y%m%d}/constituents.csv*", "delta": None, "every": None,
        "format": {"kind": "csv", "identifier": "constituentid", "title": "preferreddisplayname"}})
    harness = FilesHarness(f"file://{tmp_path}", conn, partner)

    deliver(tmp_path, "20240706", "constituents.csv", CORPUS / "nga" / "constituents-20240706.csv")
    first = harness.run()
    assert first.applied.upserted == 77 and first.applied.quarantined == 0 and len(harness.held()) == 77
    assert title_of(conn, "nga", "30") == "de Ménil, Lois and Georges, Doctors"

    deliver(tmp_path, "20240708", "constituents.csv", CORPUS / "nga" / "constituents-20240708.csv", gz=True)
    second = harness.run()
    assert second.applied.upserted == 5 and second.applied.purged == 0  # 53945-53948 new, 4276 changed
    assert len(harness.held()) == 81
    assert json.loads(metadata_of(conn, "nga", "4276"))["displaydate"] == "French, 1756 - 1808"

    deliver(tmp_path, "20250307", "constituents.csv", CORPUS / "nga" / "constituents-20250307.csv")
    third = harness.run()
    assert third.applied.upserted == 17 and third.applied.purged == 8  # 8 new and 9 changed; 8 gone
    gone = {"103", "5110", "8232", "8252", "18963", "29269", "30765", "38871"}
    assert len(harness.held()) == 81 and not gone & harness.held()
    assert harness.cursor == datetime(2025, 3, 7, tzinfo=timezone.utc)


def test_library_of_congress_marc_and_damaged_records(tmp_path: Path, conn: psycopg.Connection) -> None:
    partner = files_partner("loc", files={
        "full": "{date:%Y%m%d}/full.mrc", "delta": "{date:%Y%m%d}/delta.mrc", "every": None,
        "format": {"kind": "marc", "identifier": "001"}})
    harness = FilesHarness(f"file://{tmp_path}", conn, partner)
    deliver(tmp_path, "20200101", "full.mrc", CORPUS / "pymarc" / "marc.dat")
    first = harness.run()
    assert first.applied.upserted == 20 and len(harness.held()) == 20  # 20 records, 20 distinct 001s
    assert (title_of(conn, "loc", "12370044") or "").startswith("Introduction to algorithms")

    deliver(tmp_path, "20200102", "delta.mrc", CORPUS / "pymarc" / "marc8.dat")
    second = harness.run()
    assert second.applied.upserted == 1 and (title_of(conn, "loc", "2") or "").startswith("Escape from loneliness")

    deliver(tmp_path, "20200103", "delta.mrc", CORPUS / "pymarc" / "bad_records.mrc")
    damaged = harness.run()
    # Eight records by their ISO 2709 lengths (127, 127, 127, 128, 128, 127, 26, 127 bytes) and a
    # newline: two decode without a 001, six do not decode; all quarantined, the newline is no record.
    assert damaged.applied.upserted == 0 and damaged.applied.quarantined == 8
    assert len(harness.held()) == 21


def test_cooper_hewitt_exhibitions_as_json_lines(tmp_path: Path, conn: psycopg.Connection) -> None:
    partner = files_partner("cooper", files={
        "full": "exhibitions-{date:%Y-%m-%d}.jsonl", "delta": None, "done_marker": None, "every": None,
        "format": {"kind": "jsonl", "identifier": "id", "title": "title"}})
    harness = FilesHarness(f"file://{tmp_path}", conn, partner)
    shutil.copyfile(CORPUS / "cooperhewitt" / "exhibitions.jsonl", tmp_path / "exhibitions-2016-09-12.jsonl")
    result = harness.run()
    assert result.applied.upserted == 3 and harness.held() == {"35349375", "35349401", "35349303"}
    assert title_of(conn, "cooper", "35349401") == "More than Meets the Eye"


def title_of(conn: psycopg.Connection, partner_id: str, identifier: str) -> str | None:
    row = conn.execute("SELECT title FROM records WHERE partner_id = %s AND identifier = %s",
                       (partner_id, identifier)).fetchone()
    conn.commit()
    return str(row[0]) if row and row[0] is not None else None


def metadata_of(conn: psycopg.Connection, partner_id: str, identifier: str) -> str:
    row = conn.execute("SELECT metadata FROM records WHERE partner_id = %s AND identifier = %s",
                       (partner_id, identifier)).fetchone()
    conn.commit()
    return str(row[0]) if row else ""
