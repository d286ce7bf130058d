"""Validation rejects only what the aggregation cannot use.

Each rule is held to its standard: a MARCXML leader is 24 characters, blanks included; the
protocol identifies a record, so a MARC record without a 001 lands; an empty or short
leader is rebuilt and lands with a warning. Real records (tests/fixtures/realworld/validation,
see SOURCES.md there) are judged alongside hand-made ones.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pymarc
import pytest
from lxml import etree

from partner_harvest.formats import get_format
from partner_harvest.formats.base import checked_by
from partner_harvest.formats.checks import CHECKS, DEFAULT_POLICY, Policy, UnknownCheck, policy_of
from partner_harvest.formats.marc21 import DEFAULT_LEADER, rebuild_leader
from partner_harvest.oai import parse
from partner_harvest.records import HarvestItem, Record, Rejected
from partner_harvest.sierra import marc

REALWORLD = Path(__file__).parents[1] / "fixtures" / "realworld" / "validation"
STAMP = datetime(2024, 5, 1, tzinfo=timezone.utc)
MARC_NS = "http://www.loc.gov/MARC21/slim"
# Leaders as real ILS OAI servers send them: record length and base address left blank.
BLANK_LEADERS = ("     nam a22     uu 4500", "     nam a22     7a 4500", "          22        4500",
                 "     cam a2200000 a 4500", "01120cam a22003610      ")


def oai_page(payload: str, identifier: str = "oai:cat.example.org:1") -> bytes:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/">
  <responseDate>2024-05-01T00:00:00Z</responseDate>
  <request verb="ListRecords" metadataPrefix="marc21">https://cat.example.org/oai</request>
  <ListRecords>
    <record>
      <header><identifier>{identifier}</identifier><datestamp>2024-04-30T10:00:00Z</datestamp></header>
      <metadata>{payload}</metadata>
    </record>
  </ListRecords>
</OAI-PMH>""".encode()


def marcxml(leader: str | None = "01120cam a22003610  4500", control: str | None = "ocm123",
            title: str | None = "A title") -> str:
    parts = [f'<record xmlns="{MARC_NS}">']
    if leader is not None:
        parts.append(f"<leader>{leader}</leader>")
    if control is not None:
        parts.append(f'<controlfield tag="001">{control}</controlfield>')
    parts.append('<controlfield tag="008">830304s1982    xr a         u0|0 | cze  </controlfield>')
    if title is not None:
        parts.append(f'<datafield tag="245" ind1="1" ind2="0"><subfield code="a">{title} /</subfield>'
                     '<subfield code="c">someone.</subfield></datafield>')
    parts.append("</record>")
    return "".join(parts)


def only(page: parse.ListPage[HarvestItem]) -> Record | Rejected:
    [item] = page.items
    assert isinstance(item, (Record, Rejected)), item
    return item


# -- MARCXML through OAI-PMH ---------------------------------------------------------------


@pytest.mark.parametrize("leader", BLANK_LEADERS)
def test_a_24_character_leader_with_blank_positions_is_valid(leader: str) -> None:
    """Defect: formats/marc21.py stripped the leader before measuring it, so valid leaders whose
    positions 00-04 (or 20-23) are blanks were quarantined "missing or malformed leader"."""
    item = only(parse.parse_list_records(oai_page(marcxml(leader=leader)), "marc21"))
    assert isinstance(item, Record), item
    assert item.warnings == ()
    assert f"<leader>{leader}</leader>" in item.metadata  # stored as delivered


def test_a_marc_record_without_001_lands_with_a_warning() -> None:
    """Defect: a record without a control number was quarantined, although the OAI identifier
    identifies it."""
    item = only(parse.parse_list_records(oai_page(marcxml(control=None)), "marc21"))
    assert isinstance(item, Record), item
    assert item.identifier == "oai:cat.example.org:1" and item.title == "A title"
    assert [(w.check, w.message) for w in item.warnings] == [("marc.no_001", "MARC: no control number (001)")]


@pytest.mark.parametrize(("leader", "rebuilt"), [
    (None, DEFAULT_LEADER),
    ("", DEFAULT_LEADER),
    ("00000nam", "00000nam a2200000uu 4500"),  # cut short: the positions it has are kept
    ("00000cjm  22000001a", "00000cjm  22000001a 4500"),
    ("\n   01120cam a22003610  4500\n  ", "00000cam a22000000  4500"),  # indented: the 24 characters inside
])
def test_an_empty_or_short_leader_is_rebuilt_and_lands_with_a_warning(leader: str | None, rebuilt: str) -> None:
    item = only(parse.parse_list_records(oai_page(marcxml(leader=leader)), "marc21"))
    assert isinstance(item, Record), item
    assert [w.check for w in item.warnings] == ["marc.leader_rebuilt"]
    assert repr(rebuilt) in item.warnings[0].message
    stored = etree.fromstring(item.metadata)
    assert stored.findtext(f"{{{MARC_NS}}}leader") == rebuilt
    assert stored[0].tag == f"{{{MARC_NS}}}leader"  # a missing leader is inserted where MARCXML puts it


def test_a_quarantined_record_keeps_its_leader_as_delivered() -> None:
    """The rebuild runs only on a record that lands: the quarantine shows what the partner sent."""
    item = only(parse.parse_list_records(oai_page(marcxml(leader="nam", title=None)), "marc21"))
    assert isinstance(item, Rejected) and item.reason == "MARC: no title (245 $a)"
    assert "<leader>nam</leader>" in item.raw


def test_rebuild_keeps_plausible_code_positions_only() -> None:
    assert rebuild_leader("99999nzm\x07a2299999uu 9999") == "00000nzm a2200000uu 4500"
    assert all(len(rebuild_leader(text)) == 24 for text in ("", "x", "y" * 30, "é" * 10))


def test_a_245_without_a_or_b_takes_its_archival_or_part_title() -> None:
    record = etree.fromstring(
        f'<record xmlns="{MARC_NS}"><leader>{DEFAULT_LEADER}</leader><datafield tag="245" ind1="0" ind2="0">'
        '<subfield code="k">Papers,</subfield><subfield code="f">1900-1950.</subfield></datafield></record>')
    assert checked_by(get_format("marc21"), record).title == "Papers, 1900-1950"


# -- the partner's policy ----------------------------------------------------------------


def test_a_partner_can_turn_a_warning_into_a_reject_and_back() -> None:
    page = oai_page(marcxml(control=None))
    strict = Policy({"marc.no_001": "reject"})
    item = only(parse.parse_list_records(page, "marc21", strict))
    assert isinstance(item, Rejected) and item.reason == "MARC: no control number (001)"
    untitled = oai_page(marcxml(title=None))
    lenient = Policy({"marc.no_title": "warn"})
    item = only(parse.parse_list_records(untitled, "marc21", lenient))
    assert isinstance(item, Record) and item.title is None and [w.check for w in item.warnings] == ["marc.no_title"]


def test_an_oai_dc_record_without_a_title_can_be_let_in() -> None:
    payload = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
               'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier>x</dc:identifier></oai_dc:dc>')
    assert isinstance(only(parse.parse_list_records(oai_page(payload), "oai_dc")), Rejected)
    item = only(parse.parse_list_records(oai_page(payload), "oai_dc", Policy({"oai_dc.no_title": "warn"})))
    assert isinstance(item, Record) and [w.check for w in item.warnings] == ["oai_dc.no_title"]


def test_unknown_or_fixed_checks_are_refused_with_a_clear_message() -> None:
    with pytest.raises(UnknownCheck, match=r"unknown validation check 'marc.no_01'; known checks: .*marc\.no_001"):
        Policy({"marc.no_01": "warn"})
    with pytest.raises(UnknownCheck, match="cannot be overridden"):
        Policy({"store.unstorable": "warn"})
    with pytest.raises(UnknownCheck, match="must be reject or warn"):
        Policy({"marc.no_001": "ignore"})  # type: ignore[dict-item]  # the wrong action the test is about
    assert policy_of({}) is DEFAULT_POLICY and policy_of({"marc.no_001": "reject"}).action("marc.no_001") == "reject"


def test_every_check_has_a_stable_dotted_name_and_a_reason() -> None:
    for name, check in CHECKS.items():
        assert name == check.name and "." in name and check.default in ("reject", "warn")
        assert check.finds and check.why and "\n" not in check.finds


# -- Sierra: MARC-in-JSON and ISO 2709 ---------------------------------------------------


def sierra_bibs() -> list[dict]:
    return json.loads((REALWORLD / "dcb-service" / "bibs-slice-0-9.json").read_text())["entries"]


def test_real_sierra_bibs_without_001_or_with_an_empty_leader_land() -> None:
    """Defect: of the ten real MARC-in-JSON bibs, those without a 001 were quarantined and those
    with an empty leader failed to read (pymarc refuses it). Now only the one without a 245 is held."""
    items = {}
    for entry in sierra_bibs():
        items[entry["id"]] = marc.to_item(marc.from_marc_json(entry["marc"]), entry["id"], STAMP)
    rejected = {bib_id: item.reason for bib_id, item in items.items() if isinstance(item, Rejected)}
    assert rejected == {"1000001": "MARC: no title (245 $a)"}
    warned = {bib_id: sorted(w.check for w in item.warnings) for bib_id, item in items.items()
              if isinstance(item, Record) and item.warnings}
    assert warned == {"1000002": ["marc.no_001"], "1000003": ["marc.no_001"], "1000007": ["marc.no_001"],
                      "1000010": ["marc.leader_rebuilt"], "1000012": ["marc.leader_rebuilt"]}
    rebuilt = items["1000010"]
    assert isinstance(rebuilt, Record)
    leader = etree.fromstring(rebuilt.metadata).findtext(f"{{{MARC_NS}}}leader")
    assert leader == DEFAULT_LEADER


def iso2709(leader: str, fields: list[pymarc.Field]) -> bytes:
    record = pymarc.Record(leader=leader, force_utf8=True)
    record.add_field(*fields)
    return record.as_marc()


@pytest.mark.parametrize("leader", ["00000nam a2200000   4500", "00000nam a2200000       "])
@pytest.mark.parametrize("with_001", [True, False])
def test_the_fast_path_and_pymarc_agree_on_warned_records(leader: str, with_001: bool) -> None:
    """Defect (both paths): a leader whose 20-23 are blanks was "malformed"; now it lands, and a bib
    without 001 lands with the same warning whichever path decoded it."""
    fields = [pymarc.Field(tag="001", data="ocm1")] if with_001 else []
    fields += [pymarc.Field(tag="245", indicators=pymarc.Indicators("1", "0"), subfields=[pymarc.Subfield("a", "T /")]),
               pymarc.Field(tag="907", indicators=pymarc.Indicators(" ", " "), subfields=[pymarc.Subfield("a", ".b10000011")])]
    raw = iso2709(leader, fields)
    raw = raw[:20] + leader[20:].encode() + raw[24:]  # pymarc writes 4500 there; a partner may not
    assert raw[:24].decode()[17:] == leader[17:]
    fast = marc.decode_fast(raw)
    assert fast is not None
    record, problem = marc.decode_record(raw)
    assert problem is None and record is not None
    slow = marc.to_item(record, "1000001", STAMP)
    assert marc.fast_item(fast, "1000001", STAMP) == slow
    assert isinstance(slow, Record) and [w.check for w in slow.warnings] == ([] if with_001 else ["marc.no_001"])
    strict = Policy({"marc.no_001": "reject"})
    assert marc.fast_item(fast, "1000001", STAMP, strict) == marc.to_item(record, "1000001", STAMP, strict)


def test_the_registry_policy_reaches_both_adapters() -> None:
    """options.validation is what the adapters judge by: the OAI client parses pages with it,
    the Sierra adapter converts bibs with it."""
    from partner_harvest.oai.harvester import OaiAdapter
    from partner_harvest.sierra.harvester import SierraAdapter
    from tests.support.partners import oai_partner, sierra_partner

    options = {"validation": {"marc.no_001": "reject"}}

    class Client:
        validation = DEFAULT_POLICY

    oai = OaiAdapter(oai_partner("m", options=options), Client())  # type: ignore[arg-type]
    assert oai.client.validation.action("marc.no_001") == "reject"
    sierra = SierraAdapter(sierra_partner("s", options=options), Client())  # type: ignore[arg-type]
    assert sierra.validation.action("marc.no_001") == "reject"
    assert SierraAdapter(sierra_partner("s"), Client()).validation is DEFAULT_POLICY  # type: ignore[arg-type]


def test_the_committed_schema_refuses_an_unknown_check() -> None:
    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "include" / "partners.schema.json").read_text(encoding="utf-8"))
    entry: dict[str, Any] = {"id": "m", "protocol": "oai-pmh", "conn_id": "c",
                             "options": {"validation": {"marc.no_001": "reject"}}}
    jsonschema.validate({"partners": [entry]}, schema)
    entry["options"]["validation"] = {"marc.no_01": "reject"}
    with pytest.raises(jsonschema.ValidationError, match="marc.no_01"):
        jsonschema.validate({"partners": [entry]}, schema)


def test_an_oai_dc_record_titled_in_dcterms_lands_with_a_warning() -> None:
    """Seen from an aggregator's OAI server: oai_dc payloads whose title is dcterms:title."""
    payload = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
               'xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:dcterms="http://purl.org/dc/terms/">'
               '<dcterms:title>lizards</dcterms:title></oai_dc:dc>')
    item = only(parse.parse_list_records(oai_page(payload), "oai_dc"))
    assert isinstance(item, Record) and item.title == "lizards"
    assert [w.check for w in item.warnings] == ["oai_dc.dcterms_title"]
