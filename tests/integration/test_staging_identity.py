"""What the staging writer stages, column by column, and where the CSV reader checkpoints, as
they were before the per-record cost was cut (tests/fixtures/staging/identity.json, written by
that code). A changed content hash would make every held record look edited; a changed
position would resume a killed try at another byte."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from partner_harvest import run
from partner_harvest.files import harvester, readers
from partner_harvest.formats.checks import Finding
from partner_harvest.records import HarvestItem, Record, Rejected, Tombstone
from tests.support.files_harness import FilesHarness, files_partner
from tests.support.records import stage

EXPECTED = Path(__file__).parents[1] / "fixtures" / "staging" / "identity.json"
T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
ODD = Finding("generic.odd", "odd")
SURROGATE = "\udc80"


def items() -> list[HarvestItem]:
    """Every kind of item, storable or not, with every optional field (max_record_bytes 300)."""
    east = T0.astimezone(timezone(timedelta(hours=2)))
    return [
        Record("plain", T0, "oai_dc", "<dc>plain</dc>"),
        Record("sets", east, "oai_dc", "<dc>sets</dc>", ("a:b", "c"), "A title", (ODD, Finding("generic.odd", "2nd"),
                                                                                  Finding("x.y", "why"))),
        Record("ünï 漢", T0, "oai_dc", "<dc>Ünïcödé 漢字 \U0001F600 \u2028</dc>", ("sét",), "Tïtle 😀"),
        Record("item-1", T0, "items", '{"barcode": "1"}', (), None, (), "items", ("b1", "b2")),
        Record("item-2", T0, "items", '{"barcode": "2"}', ("s",), None, (), "holdings"),
        Record("empty", T0, "oai_dc", "", (), ""),
        Record("at-the-limit", T0, "oai_dc", "x" * 300),
        Record("over-the-limit", T0, "oai_dc", "x" * 301),
        Record("over-in-bytes", T0, "oai_dc", "é" * 151),
        Record("four-byte", T0, "oai_dc", "\U0001F600" * 75),
        Record("nul-metadata", T0, "oai_dc", "<dc>a\x00b</dc>", ("s",), "t"),
        Record("nul-title", T0, "oai_dc", "<dc/>", (), "a\x00b"),
        Record("nul-set", T0, "oai_dc", "<dc/>", ("a\x00",)),
        Record("nul-prefix", T0, "oai\x00dc", "<dc/>"),
        Record("surrogate-metadata", T0, "oai_dc", f"<dc>{SURROGATE}</dc>"),
        Record("surrogate-title", T0, "oai_dc", "<dc/>", (), f"t{SURROGATE}"),
        Record("surrogate-set", T0, "oai_dc", "<dc/>", (SURROGATE,)),
        Record("nul\x00identifier", T0, "oai_dc", "<dc/>"),
        Record(f"surrogate{SURROGATE}identifier", T0, "oai_dc", "<dc/>"),
        Record("i" * 1000, T0, "oai_dc", "<dc>longest identifier</dc>"),
        Record("i" * 1001, T0, "oai_dc", "<dc>identifier too long</dc>"),
        Record("é" * 501, T0, "oai_dc", "<dc>identifier too long in bytes</dc>"),
        Record("é" * 250, T0, "oai_dc", "<dc>long identifier in bytes, within</dc>"),
        Tombstone("gone", T0),
        Tombstone("suppressed", T0, "suppressed", "items"),
        Tombstone("nul\x00gone", T0),
        Rejected("bad", "no title", "<dc/>", T0, "oai_dc"),
        Rejected("bare", "unreadable", ""),
        Rejected("nul-raw", "reason\x00", "<dc>\x00</dc>", T0, "oai\x00dc"),
        Rejected("surrogate-raw", "why", f"<dc>{SURROGATE}</dc>", T0, "oai_dc"),
        Rejected("nul\x00rejected", "why", "<dc>" + "y" * 2000 + "</dc>", T0),
    ]


HEADER = '\ufeffobject_id,title,note,deleted,"50% ""off""",note\r\n'
ROWS = [
    'A-1,"Still life, with ""quotes"", and commas",plain,,x,last note\r\n',
    'A-2,"Two\r\nlines and\nan LF","tab\there, \\ backslash, \x01 control, \x7f del",,,\r\n',
    '  A-3\u3000,"  Ünïcödé 漢字 \U0001F600 \u2028 ",é,,"",""\r\n',
    'A-4,,empty title,,,\r\n',
    'A-5,Gone,,  TRUE ,,\r\n',
    'A-6,Deleted too,,Deleted,,\r\n',
    'A-1,Again: a later row of the same identifier,,,,\r\n',
    'A-7,"ends with a quote """,,no,,\r\n',
    'A-8,short row\r\n',
    'A-9,a,long,row,with,too,many\r\n',
    'A-10,ab"c,stray quote,,,\r\n',
    'A-11,"ab"c,after the closing quote,,,\r\n',
    '\r\n',
    '\\.\r\n',
    ',no identifier,,,,\r\n',
    '\u3000 ,only blanks as identifier,,,,\r\n',
    'X' * 1001 + ',identifier too long,,,,\r\n',
    'A-12,' + 'big ' * 1100 + ',,,,\r\n',
    'A-13,"a quoted field\n\n\nof blank lines",,,,\n',
    'A-14,lf only,,,,\n',
]
BAD_BYTES = b'A-15,invalid \xff utf-8,,,,\r\nA-16,a NUL \x00 here,,,,\r\n'
TAIL = 'A-17,"the last row, without its newline",,,,'


def dump() -> bytes:
    good = "".join(f"G-{n},Row {n},{'x' * (n % 7)},,,\r\n" for n in range(20))
    return (HEADER + "".join(ROWS) + good).encode() + BAD_BYTES + (good.replace("G-", "H-") + TAIL).encode()


def staged(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    rows = conn.execute("SELECT seq, kind, identifier, datestamp, metadata_prefix, metadata, set_specs, title, "
                        "content_hash, reason, warnings, entity, parents FROM staging WHERE run_id = %s ORDER BY seq",
                        (run_id,)).fetchall()
    audit = conn.execute("SELECT pages, fetched, quarantined, warnings, staged_bytes, checkpoint FROM harvest_runs "
                         "WHERE run_id = %s", (run_id,)).fetchone()
    conn.commit()
    return {"rows": [[c.isoformat() if isinstance(c, datetime) else c for c in row] for row in rows],
            "audit": list(audit or ())}


def generic(conn: psycopg.Connection) -> dict[str, Any]:
    stage(conn, "p", "generic", items(), max_record_bytes=300)
    return staged(conn, "generic")


def from_a_file(conn: psycopg.Connection, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The awkward dump read and staged page by page (7 items), each item's position and each
    page's checkpoint noted."""
    where = folder / "20260615"
    (where / "full").mkdir(parents=True)
    (where / "full" / "objects-001.csv").write_bytes(dump())
    (where / "_SUCCESS").write_bytes(b"")
    harness = FilesHarness(f"file://{folder}", conn, files_partner(options={"limits": {"max_record_bytes": 4096}}))
    positions: list[int] = []
    checkpoints: list[int] = []
    real_read, real_flush = readers.FileReader.read, harvester.FileDeliveryAdapter._flush

    def read(self: Any, *args: Any) -> Any:
        items, counting = real_read(self, *args)

        def noting() -> Any:
            for item, position in items:
                positions.append(position)
                yield item, position

        return noting(), counting

    def flush(self: Any, page: Any, sink: Any, stats: Any, at: int) -> None:
        checkpoints.append(at)
        real_flush(self, page, sink, stats, at)

    monkeypatch.setattr(readers.FileReader, "read", read)
    monkeypatch.setattr(harvester.FileDeliveryAdapter, "_flush", flush)
    monkeypatch.setattr(harvester, "PAGE_ITEMS", 7)
    run.stage_channel(harness.adapter(), conn, "file", harness.freeze(), run.CHANGES)
    return {**staged(conn, "file"), "positions": positions, "checkpoints": checkpoints}


def test_the_writer_stages_every_kind_of_item_as_before(conn: psycopg.Connection) -> None:
    expected = json.loads(EXPECTED.read_text())["generic"]
    actual = generic(conn)
    assert len(actual["rows"]) == len(expected["rows"]) == len(items())
    for mine, before in zip(actual["rows"], expected["rows"], strict=True):
        assert mine == before
    assert actual == expected  # and the channel's audit: the payload bytes the run cap counts


@pytest.mark.parametrize("chunk", [None, 1, 7, 64])
def test_a_csv_file_is_staged_and_checkpointed_as_before(tmp_path: Path, conn: psycopg.Connection,
                                                         monkeypatch: pytest.MonkeyPatch, chunk: int | None) -> None:
    if chunk is not None:  # batches of lines cut inside quoted rows
        monkeypatch.setattr(readers, "CHUNK_BYTES", chunk)
    expected = json.loads(EXPECTED.read_text())["file"]
    actual = from_a_file(conn, tmp_path, monkeypatch)
    for mine, before in zip(actual["rows"], expected["rows"], strict=True):
        assert mine == before
    assert actual == expected
