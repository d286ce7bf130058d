"""A CSV file staged through the server (files/copy_path.py) stages exactly what the ordinary
path stages, column by column: awkward rows the server parses, and rows only the ordinary
path can judge (which it then reads, from the same byte). A later night or a reconcile
would otherwise see changes that are none."""

from __future__ import annotations

import gzip
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from partner_harvest import run
from partner_harvest.files import copy_path
from tests.support.files_harness import FilesHarness, files_partner

DAY0, DAY1 = datetime(2026, 6, 15, tzinfo=timezone.utc), datetime(2026, 6, 16, tzinfo=timezone.utc)
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
    # rows only the ordinary path judges
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
    'A-13,after the detours,,,,\r\n',
]
BAD_BYTES = b'A-14,invalid \xff utf-8,,,,\r\nA-15,a NUL \x00 here,,,,\r\n'
TAIL = 'A-16,"the last row, without its newline",,,,'


def dump() -> bytes:
    good = "".join(f"G-{n},Row {n} of many,{'x' * (n % 50)},,,\r\n" for n in range(300))
    return (HEADER + "".join(ROWS) + good).encode() + BAD_BYTES + (good.replace("G-", "H-") + TAIL).encode()


def deliver(folder: Path, date: datetime, name: str, data: bytes) -> None:
    where = folder / f"{date:%Y%m%d}"
    (where / "full").mkdir(parents=True)
    (where / "full" / name).write_bytes(data)
    (where / "_SUCCESS").write_bytes(b"")


def staged(conn: psycopg.Connection, run_id: str) -> list[tuple[Any, ...]]:
    rows = conn.execute("SELECT seq, kind, identifier, datestamp, metadata_prefix, metadata, set_specs, title, "
                        "content_hash, reason, warnings, entity, parents FROM staging WHERE run_id = %s ORDER BY seq",
                        (run_id,)).fetchall()
    conn.commit()
    return rows


@pytest.mark.parametrize("no_title", ["warn", "reject"])
def test_the_server_side_path_stages_what_the_ordinary_path_stages(tmp_path: Path, conn: psycopg.Connection,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   no_title: str) -> None:
    folder = tmp_path / "dumps"
    deliver(folder, DAY0, "objects-001.csv", dump())
    partner = files_partner(options={"limits": {"max_record_bytes": 4096},
                                     "validation": {"generic.no_title": no_title}})
    harness = FilesHarness(f"file://{folder}", conn, partner)
    monkeypatch.setattr(copy_path, "CHUNK_BYTES", 4096)  # many chunks, cut inside rows, one refused by the server
    monkeypatch.setattr(copy_path, "DETOUR_BYTES", 1)  # back to the server after each row it cannot take
    chunks: list[bool] = []
    real_chunk = copy_path.ServerSide._chunk

    def noting(self: Any, *args: Any) -> bool:
        chunks.append(real_chunk(self, *args))
        return chunks[-1]

    monkeypatch.setattr(copy_path.ServerSide, "_chunk", noting)

    def both_ways(run_id: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        window = harness.freeze()
        server = run.stage_channel(harness.adapter(), conn, f"{run_id}-server", window, run.CHANGES)
        with monkeypatch.context() as ordinary:
            ordinary.setattr(copy_path, "why_not", lambda *_: "the ordinary way")
            usual = run.stage_channel(harness.adapter(), conn, f"{run_id}-ordinary", window, run.CHANGES)
        assert (server.fetched, server.records, server.tombstones, server.rejected) == (
            usual.fetched, usual.records, usual.tombstones, usual.rejected)
        return staged(conn, f"{run_id}-server"), staged(conn, f"{run_id}-ordinary")

    server, ordinary = both_ways("day0")
    assert len(ordinary) == len(ROWS) - 1 + 600 + 2 + 1  # the blank line is no item
    for mine, theirs in zip(server, ordinary, strict=True):
        assert mine == theirs
    assert True in chunks and False in chunks  # rows went through the server, and a chunk it refused did not
    assert {row[1] for row in server} == {"R", "T", "Q"}

    window = harness.freeze()
    run.stage_channel(harness.adapter(), conn, "apply", window, run.CHANGES)
    run.apply(conn, partner.id, "apply", window, run.Kept(), None)
    deliver(folder, DAY1, "objects-001.csv.gz", gzip.compress(dump()))  # restated: the records keep their stamps
    server, ordinary = both_ways("day1")
    assert server == ordinary and DAY0 in {row[3] for row in server}


def test_what_python_strips_and_lowers_is_declared_for_the_server() -> None:
    everything = map(chr, range(0x110000))
    spaces, lowering = [], []
    for c in everything:
        if c.isspace():
            spaces.append(c)
        if not c.isascii() and c.lower().isascii():
            lowering.append(c)
    assert "".join(spaces) == copy_path.WHITESPACE and "".join(lowering) == copy_path.LOWERS_TO_ASCII
