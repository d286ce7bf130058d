"""File deliveries without a database: dated patterns, completeness, the chain, manifests and the readers."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pymarc
import pytest

from partner_harvest.factory import Endpoint
from partner_harvest.files import layout, manifests
from partner_harvest.files.layout import Layout, Pattern, chain
from partner_harvest.files.readers import FileReader
from partner_harvest.files.spec import FilesOptions, FormatOptions
from partner_harvest.files.storage import Storage
from partner_harvest.formats.checks import DEFAULT_POLICY
from partner_harvest.records import Record, Rejected, Tombstone

NOW = datetime(2026, 6, 20, 12, tzinfo=timezone.utc)
DAY = datetime(2026, 6, 19, tzinfo=timezone.utc)


def storage(root: Path) -> Storage:
    return Storage.for_endpoint("p", Endpoint(f"file://{root}"))


def put(root: Path, path: str, data: bytes = b"id\n1\n", mtime: datetime | None = None) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    if mtime is not None:
        os.utime(target, (mtime.timestamp(), mtime.timestamp()))


def options(**given: Any) -> FilesOptions:
    given.setdefault("format", {"kind": "csv", "identifier": "id"})
    return FilesOptions.model_validate(given)


# -- patterns -----------------------------------------------------------------------------

def test_a_pattern_dates_the_paths_it_matches() -> None:
    pattern = Pattern("{date:%Y%m%d}/objects-*.csv.gz")
    assert pattern.date_of("20260619/objects-001.csv.gz") == DAY
    assert pattern.date_of("20260619/sub/objects-001.csv.gz") is None  # * stays in one segment
    assert pattern.date_of("20261319/objects-1.csv.gz") is None  # no 13th month
    assert pattern.date_of("20260619/objects-1.csv") is None
    assert Pattern("{date:%Y%m%d}/_SUCCESS").path_for(DAY) == "20260619/_SUCCESS"
    hub = Pattern("exports/hub-{date:%Y-%m-%dT%H%M}.jsonl")
    assert hub.date_of("exports/hub-2026-06-19T0630.jsonl") == DAY + timedelta(hours=6, minutes=30)
    assert (hub.prefix, hub.depth) == ("exports", 1)


def test_a_pattern_without_its_placeholder_is_refused_by_the_registry() -> None:
    with pytest.raises(ValueError, match="date:"):
        options(full="objects.csv")
    with pytest.raises(ValueError, match="give full, delta or both"):
        FilesOptions.model_validate({"format": {"kind": "csv", "identifier": "id"}})


# -- completeness and the chain ------------------------------------------------------------

def test_the_chain_waits_for_a_missing_marker_and_stops_at_a_gap(tmp_path: Path) -> None:
    opts = options(full="{date:%Y%m%d}/full.csv", delta="{date:%Y%m%d}/delta.csv",
                   done_marker="{date:%Y%m%d}/_SUCCESS", every="1d")
    for day, kind, done in ((15, "full", True), (16, "delta", True), (17, "delta", False), (18, "delta", True),
                            (20, "delta", True)):
        put(tmp_path, f"202606{day}/{kind}.csv")
        if done:
            put(tmp_path, f"202606{day}/_SUCCESS", b"")
    found = Layout("p", opts, storage(tmp_path)).list(NOW)
    picked = chain(found, opts.every)
    assert [(d.date.day, d.kind) for d in picked.deliveries] == [(15, "full"), (16, "delta")]
    assert "2026-06-17" in (picked.waiting or "") and "not complete" in (picked.waiting or "")

    put(tmp_path, "20260617/_SUCCESS", b"")  # the late marker: now up to the gap before the 20th
    picked = chain(Layout("p", opts, storage(tmp_path)).list(NOW), opts.every)
    assert [d.date.day for d in picked.deliveries] == [15, 16, 17, 18]
    assert "gap" in (picked.waiting or "")


def test_a_newer_complete_full_dump_starts_the_chain(tmp_path: Path) -> None:
    opts = options(full="{date:%Y%m%d}/full.csv", delta="{date:%Y%m%d}/delta.csv")
    for path in ("20260615/full.csv", "20260616/delta.csv", "20260617/full.csv", "20260618/delta.csv"):
        put(tmp_path, path)
    picked = chain(Layout("p", opts, storage(tmp_path)).list(NOW), None)
    assert [(d.date.day, d.kind) for d in picked.deliveries] == [(17, "full"), (18, "delta")]


def test_without_a_marker_a_delivery_settles(tmp_path: Path) -> None:
    opts = options(delta="{date:%Y%m%d}.csv", settle="10m")
    put(tmp_path, "20260619.csv", mtime=NOW - timedelta(hours=1))
    put(tmp_path, "20260620.csv", mtime=NOW - timedelta(minutes=2))  # still being written?
    found = Layout("p", opts, storage(tmp_path)).list(NOW)
    assert [d.complete for d in found] == [True, False] and "settle" in (found[1].why_not or "")


def test_a_checksum_file_lists_each_file_and_its_digest(tmp_path: Path) -> None:
    opts = options(full="{date:%Y%m%d}/part-*.csv", checksums="{date:%Y%m%d}/SHA256SUMS")
    put(tmp_path, "20260619/part-1.csv", b"id\n1\n")
    put(tmp_path, "20260619/part-2.csv", b"id\n2\n")
    put(tmp_path, "20260619/SHA256SUMS", f"{hashlib.sha256(b'id' + bytes([10]) + b'1' + bytes([10])).hexdigest()}  part-1.csv\n".encode())
    [found] = Layout("p", opts, storage(tmp_path)).list(NOW)
    assert not found.complete and "does not list 20260619/part-2.csv" in (found.why_not or "")
    digest = hashlib.sha256(b"id\n2\n").hexdigest()
    with (tmp_path / "20260619/SHA256SUMS").open("a") as sums:
        sums.write(f"{digest} *part-2.csv\n")
    [found] = Layout("p", opts, storage(tmp_path)).list(NOW)
    assert found.complete and found.checksums["20260619/part-2.csv"] == f"sha256:{digest}"


RESOURCE_LIST = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:md capability="resourcelist" at="2026-06-19T02:00:00Z"/>
  <url><loc>https://union.example/dumps/20260619/bibs-1.mrc</loc>
       <rs:md hash="md5:1e0d5cb8ef6ba40c99b14c0237be735e sha-256:%s" length="%d"/></url>
  <url><loc>https://union.example/dumps/20260619/gone.mrc</loc><rs:md change="deleted"/></url>
</urlset>"""


def test_a_resourcesync_list_says_which_files_and_their_lengths(tmp_path: Path) -> None:
    opts = options(full="{date:%Y%m%d}/bibs-*.mrc", manifest="{date:%Y%m%d}/resourcelist.xml",
                   format={"kind": "marc"})
    data = b"00026     2200025   4500\x1e\x1d"
    put(tmp_path, "20260619/bibs-1.mrc", data[:10])  # still being uploaded
    listed = RESOURCE_LIST % (hashlib.sha256(data).hexdigest().encode(), len(data))
    put(tmp_path, "20260619/resourcelist.xml", listed)
    [found] = Layout("p", opts, storage(tmp_path)).list(NOW)
    assert not found.complete and "still being uploaded" in (found.why_not or "")
    put(tmp_path, "20260619/bibs-1.mrc", data)
    [found] = Layout("p", opts, storage(tmp_path)).list(NOW)
    assert found.complete and [e.path for e in found.files] == ["20260619/bibs-1.mrc"]
    assert found.checksums["20260619/bibs-1.mrc"].startswith("sha256:")
    assert manifests.resourcesync(listed, "", "here")["bibs-1.mrc"][0] == len(data)


# -- readers ------------------------------------------------------------------------------

def read(tmp_path: Path, name: str, data: bytes, start: int = 0, **fmt: Any) -> list[Any]:
    put(tmp_path, name, data)
    reader = FileReader("p", FormatOptions.model_validate(fmt), "csv", DEFAULT_POLICY)
    items, _ = reader.read(storage(tmp_path), name, DAY, start)
    return list(items)


def test_csv_items_and_positions(tmp_path: Path) -> None:
    text = ('\ufeffid,title,deleted\r\n1,"Vase, blue",\r\n2,"Two\nlines",\r\n3,,true\r\n,no id,\r\n5,short\r\n'
            .encode("utf-8"))
    items = read(tmp_path, "a.csv", text, kind="csv", identifier="id", title="title", deleted="deleted")
    kinds = [(type(i).__name__, i.identifier) for i, _ in items]
    assert kinds == [("Record", "1"), ("Record", "2"), ("Tombstone", "3"), ("Rejected", f"a.csv@{text.index(b',no id')}"),
                     ("Rejected", "5")]
    first = items[0][0]
    assert isinstance(first, Record) and first.title == "Vase, blue" and json.loads(first.metadata)["id"] == "1"
    assert items[1][0].metadata.count("\\n") == 1  # a quoted line break stays in its field
    assert "fields, the header 3" in items[4][0].reason
    after_second = items[1][1]
    resumed = read(tmp_path, "a.csv", text, start=after_second, kind="csv", identifier="id", deleted="deleted")
    assert [i.identifier for i, _ in resumed][:1] == ["3"] and isinstance(resumed[0][0], Tombstone)


def test_tsv_gzip_and_zip_read_alike(tmp_path: Path) -> None:
    text = b"id\ttitle\n1\tOne\n2\tTwo\n"
    plain = read(tmp_path, "a.tsv", text, kind="tsv", identifier="id", title="title")
    packed = read(tmp_path, "a.tsv.gz", gzip.compress(text), kind="tsv", identifier="id", title="title")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("part-2.tsv", b"id\ttitle\n3\tThree\n")
        archive.writestr("part-1.tsv", text)
    zipped = read(tmp_path, "a.zip", buffer.getvalue(), kind="tsv", identifier="id", title="title")
    assert [i.identifier for i, _ in plain] == [i.identifier for i, _ in packed] == ["1", "2"]
    assert [(i.identifier, n) for i, n in zipped] == [("1", 1), ("2", 2), ("3", 3)]  # record numbers
    assert [i.identifier for i, _ in read(tmp_path, "a.tsv.gz", gzip.compress(text), start=1, kind="tsv",
                                          identifier="id")] == ["2"]
    reader = FileReader("p", FormatOptions.model_validate({"kind": "tsv", "identifier": "id"}), "csv", DEFAULT_POLICY)
    digest = hashlib.sha256()
    items, counted = reader.read(storage(tmp_path), "a.zip", DAY, 0, digest)
    assert len(list(items)) == 3 and digest.hexdigest() == hashlib.sha256(buffer.getvalue()).hexdigest()


def test_json_lines_paths_and_quarantine(tmp_path: Path) -> None:
    lines = b'{"meta": {"id": "a1", "deleted": false}, "title": "A"}\n\n[1, 2]\n{"meta": {"id": "a2", "deleted": true}}\nnot json\n'
    items = read(tmp_path, "d.jsonl", lines, kind="jsonl", identifier="meta.id", deleted="meta.deleted", title="title")
    assert [type(i).__name__ for i, _ in items] == ["Record", "Rejected", "Tombstone", "Rejected"]
    assert items[0][0].title == "A" and "not an object" in items[1][0].reason


LIDO = b"""<?xml version="1.0" encoding="UTF-8"?>
<lido:lidoWrap xmlns:lido="http://www.lido-schema.org">
  <lido:lido><lido:lidoRecID lido:type="local">obj-1</lido:lidoRecID>
    <lido:descriptiveMetadata xml:lang="en"><lido:objectIdentificationWrap><lido:titleWrap><lido:titleSet>
      <lido:appellationValue>Still life</lido:appellationValue></lido:titleSet></lido:titleWrap>
    </lido:objectIdentificationWrap></lido:descriptiveMetadata></lido:lido>
  <lido:lido><lido:descriptiveMetadata/></lido:lido>
</lido:lidoWrap>"""


def test_xml_records_streamed_and_hostile_documents_refused(tmp_path: Path) -> None:
    fmt: dict[str, Any] = {"kind": "xml", "record": "lido:lido", "identifier": "lido:lidoRecID",
           "namespaces": {"lido": "http://www.lido-schema.org"}}
    items = read(tmp_path, "x.xml", LIDO, **fmt)
    assert [(type(i).__name__, i.identifier) for i, _ in items] == [("Record", "obj-1"), ("Rejected", "x.xml#2")]
    hostile = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><lido:lidoWrap xmlns:lido="http://www.lido-schema.org"/>'
    with pytest.raises(Exception, match="entities"):
        read(tmp_path, "h.xml", hostile, **fmt)


def test_marc_leader_deleted_and_named_identifier(tmp_path: Path) -> None:
    live = pymarc.Record(leader="00000cam a2200000 a 4500")
    live.add_field(pymarc.Field(tag="001", data="b1"), pymarc.Field(
        tag="035", indicators=pymarc.Indicators(" ", " "), subfields=[pymarc.Subfield("a", "(OCoLC)42")]),
        pymarc.Field(tag="245", indicators=pymarc.Indicators("0", "0"), subfields=[pymarc.Subfield("a", "A title")]))
    gone = pymarc.Record(leader="00000dam a2200000 a 4500")
    gone.add_field(pymarc.Field(tag="001", data="b2"), pymarc.Field(
        tag="035", indicators=pymarc.Indicators(" ", " "), subfields=[pymarc.Subfield("a", "(OCoLC)43")]))
    data = live.as_marc() + gone.as_marc() + b"\n"
    items = read(tmp_path, "m.mrc", data, kind="marc", identifier="035$a")
    assert [(type(i).__name__, i.identifier) for i, _ in items] == [("Record", "(OCoLC)42"), ("Tombstone", "(OCoLC)43")]
    assert items[0][0].title == "A title" and items[0][1] == len(live.as_marc())
    resumed = read(tmp_path, "m.mrc", data, start=items[0][1], kind="marc")
    assert [i.identifier for i, _ in resumed] == ["b2"]


def test_unusable_rows_are_quarantined_never_dropped(tmp_path: Path) -> None:
    items = read(tmp_path, "q.csv", b"id,title\n\x00bad,x\n2,ok\n3,caf\xe9\n", kind="csv", identifier="id")
    assert len(items) == 3 and all(isinstance(i, (Record, Rejected)) for i, _ in items)
    assert isinstance(items[2][0], Rejected) and "not valid utf-8" in items[2][0].reason  # Latin-1 in a UTF-8 file
    assert layout.FULL == "full"


@pytest.mark.parametrize("ranges", [True, False])
def test_an_http_directory_lists_and_resumes_with_or_without_ranges(tmp_path: Path, ranges: bool) -> None:
    from include.simulators.files.server import DirectoryServer

    data = b"id\n" + b"".join(b"%d\n" % i for i in range(1000))
    put(tmp_path, "20260619/full/objects-001.csv", data)
    with DirectoryServer(tmp_path, ranges=ranges, etags=ranges) as server:
        where = Storage.for_endpoint("p", Endpoint(f"http://u:s3cret@127.0.0.1:{server.port}/"))
        assert "s3cret" not in where.where
        [entry] = where.find("", 3)
        assert entry.size == -1 or entry.size > 0  # a directory page says no size: asked with HEAD when needed
        assert where.complete(entry).size == len(data) and where.complete(entry).etag
        with where.open(entry.path, data.index(b"\n250\n") + 1) as handle:
            assert handle.read(4) == b"250\n"
        asked = [r["range"] for r in server.requests if r["method"] == "GET" and r["path"].endswith(".csv")]
        assert any(asked) == ranges  # without ranges the read went past the bytes before itself
