"""The UTF-8 fast path of the Sierra export decoder gives what pymarc + lxml give, or steps aside.

Plain UTF-8 records are decoded straight from the ISO 2709 directory.
Every record here goes both ways; where the fast path answers, the bib id, the 005
stamp, the MARCXML text and the item (record or quarantine verdict, title) must be
identical to the pymarc path's; MARC-8, bad bytes and NUL must always take pymarc.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pymarc
import pytest
from lxml import etree
from pymarc import Field, Indicators, Subfield

from include.simulators.sierra import SimulatedCatalogue
from include.simulators.sierra import marc as simmarc
from include.simulators.sierra.catalogue import BibQuery
from partner_harvest.sierra import marc

UNTIL = datetime(2026, 1, 1, tzinfo=timezone.utc)


def both_ways(raw: bytes) -> tuple[marc.FastBib | None, tuple[Any, ...]]:
    """(fast, slow) of one record; slow is (record, problem, bib id, stamp, xml, item)."""
    fast = marc.decode_fast(raw)
    record, problem = marc.decode_record(raw)
    if record is None:
        return fast, (None, problem, None, None, None, None)
    bib_id = marc.bib_id_of(record)
    stamp = marc.stamp_of(record)
    try:
        xml = etree.tostring(marc.marcxml_element(record), encoding="unicode")
    except ValueError:
        xml = None
    item = marc.to_item(record, bib_id or "x", stamp or UNTIL)
    return fast, (record, problem, bib_id, stamp, xml, item)


def assert_same(raw: bytes) -> bool:
    """True when the fast path answered (and agreed); False when it stepped aside."""
    fast, (record, problem, bib_id, stamp, xml, item) = both_ways(raw)
    if fast is None:
        return False
    assert record is not None, f"fast path accepted a record pymarc refuses: {problem}"
    assert (fast.bib_id, fast.stamp, fast.xml) == (bib_id, stamp, xml)
    assert marc.fast_item(fast, bib_id or "x", stamp or UNTIL) == item
    return True


@pytest.mark.parametrize("oddity", [{"marc8_every": 7}, {"nul_every": 7}], ids=["MARC-8", "NUL"])
def test_a_catalogue_with_every_oddity_decodes_the_same_both_ways(oddity: dict[str, int]) -> None:
    every: dict[str, Any] = {"no_005_every": 11, "no_id_every": 13, "bad_utf8_every": 17, "invalid_every": 19, **oddity}
    catalogue = SimulatedCatalogue(bibs=1000, deleted_fraction=0.05, suppressed_fraction=0.03, seed=5, **every)
    bibs = [b for b in catalogue.bibs(catalogue.select(BibQuery(), 0, 10**6)) if not b.deleted]
    answered = 0
    for bib in bibs:
        raw = simmarc.export_record(bib)[0]
        took_fast = assert_same(raw)
        answered += took_fast
        nul = catalogue._every(catalogue.nul_every, bib.number)
        if bib.marc8 or ((bib.bad_utf8 or nul) and not bib.invalid):  # the invalid ones lack the title it hits
            assert not took_fast, f"bib {bib.id}: MARC-8, bad bytes and NUL are pymarc's to judge"
    assert answered >= 0.7 * len(bibs)  # the plain majority takes the fast path
    invalid = [b for b in bibs if b.invalid and not (b.marc8 or b.no_ids)]
    decoded = [marc.decode_fast(simmarc.export_record(b)[0]) for b in invalid]
    assert invalid and all(fast is not None and fast.problem == "MARC: no title (245 $a)" for fast in decoded)


def utf8_record(*fields: Field, leader: str = "00000nam a2200000 a 4500") -> bytes:
    record = pymarc.Record(force_utf8=True, leader=leader)
    for field in fields:
        record.add_field(field)
    return record.as_marc()


def data(tag: str, *pairs: str, ind: tuple[str, str] = (" ", " ")) -> Field:
    return Field(tag=tag, indicators=Indicators(*ind),
                 subfields=[Subfield(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)])


ID_907 = data("907", "a", ".b1234567x")
STAMP = Field(tag="005", data="20250102030405.0")


@pytest.mark.parametrize("fields", [
    pytest.param((ID_907, STAMP, data("245", "a", "Title")), id="907 but no 001"),
    pytest.param((Field(tag="001", data="   "), ID_907, data("245", "a", "T")), id="001 of spaces"),
    pytest.param((Field(tag="001", data="o1"), data("245", "c", "only a statement")), id="245 without a or b"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", " / ", "b", " : ")), id="245 of punctuation"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "Less <is> more & so", "b", "  spaced   out /")),
                 id="escapes and spaces"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", ""), data("245", "a", "second")), id="empty then second 245"),
    pytest.param((Field(tag="001", data="o1"), data("500"), data("245", "a", "T")), id="datafield without subfields"),
    pytest.param((Field(tag="001", data="o1"), Field(tag="005", data="20251399999999"), data("245", "a", "T")),
                 id="impossible 005"),
    pytest.param((Field(tag="001", data="o1"), Field(tag="005", data="2025"), data("245", "a", "T")), id="short 005"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "Tab\there")), id="tab"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "T"), data("945", "a", "Müller")), id="non-ASCII item"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "T", ind=("1", "\"")),), id="odd indicator"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "Ελληνική ποίηση 東京", "$", "x")), id="odd code"),
    pytest.param((Field(tag="001", data="b1000001"), data("907", "b", "x", "a", "nothing"), ID_907,
                  data("245", "a", "T")), id="second 907 holds the id"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "x\ufffdy")), id="replacement character"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "T", "", "", "$", "x")), id="odd code after an empty value"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "T"), data("500", "", "", "", "")), id="only empty values"),
    pytest.param((Field(tag="001", data="o1"), data("245", "a", "T", "", "")), id="trailing empty value"),
    pytest.param((Field(tag="001", data="o1\x1fx"), data("245", "a", "T")), id="delimiter in a control field"),
])
def test_hand_made_records_decode_the_same_both_ways(fields: tuple[Field, ...]) -> None:
    assert_same(utf8_record(*fields))


def test_the_fast_path_steps_aside_for_marc8_and_broken_structure() -> None:
    plain = utf8_record(Field(tag="001", data="o1"), data("245", "a", "T"))
    assert assert_same(plain)
    assert marc.decode_fast(plain[:9] + b" " + plain[10:]) is None  # MARC-8
    assert marc.decode_fast(plain[:12] + b"xxxxx" + plain[17:]) is None  # base address
    assert marc.decode_fast(plain[:-5]) is None  # shorter than its declared length
    assert marc.decode_fast(plain.replace(b"T\x1e", b"\xff\x1e")) is None  # not UTF-8
