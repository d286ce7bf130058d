"""OAI-PMH response parsing: envelope, errors, tokens, headers and per-record quarantine."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest
from lxml import etree

from partner_harvest.oai import parse
from partner_harvest.oai.errors import (
    BadArgument,
    BadResumptionToken,
    BadVerb,
    CannotDisseminateFormat,
    IdDoesNotExist,
    NoMetadataFormats,
    NoRecordsMatch,
    NoSetHierarchy,
    OaiError,
    OaiProtocolError,
    OaiResponseError,
)
from partner_harvest.records import Record, Rejected, Tombstone
from partner_harvest.xmlsafe import HostileXmlError, MalformedXmlError, NotXmlError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oai"
UTC = timezone.utc


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


T = TypeVar("T")


def of(kind: type[T], items: Iterable[object]) -> list[T]:
    """`items`, each of which must be a `kind` (a list page holds one kind per verb)."""
    found = list(items)
    assert all(isinstance(item, kind) for item in found), found
    return [item for item in found if isinstance(item, kind)]


def by_id(items: Iterable[Any]) -> dict[str, Any]:
    return {item.identifier: item for item in items}


# -- datestamps --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2004-02-16", datetime(2004, 2, 16, tzinfo=UTC)),
        ("2004-02-16T13:29:54Z", datetime(2004, 2, 16, 13, 29, 54, tzinfo=UTC)),
        ("2022-05-09T08:21:47.485Z", datetime(2022, 5, 9, 8, 21, 47, 485000, tzinfo=UTC)),
        ("2022-05-09T08:21:47.123456789Z", datetime(2022, 5, 9, 8, 21, 47, 123456, tzinfo=UTC)),
        ("2022-05-09T08:21:47+00:00", datetime(2022, 5, 9, 8, 21, 47, tzinfo=UTC)),
        ("2022-05-09T10:21:47+02:00", datetime(2022, 5, 9, 8, 21, 47, tzinfo=UTC)),
        ("2022-05-09T03:21:47-0500", datetime(2022, 5, 9, 8, 21, 47, tzinfo=UTC)),
        ("  2022-05-09T08:21:47Z\n", datetime(2022, 5, 9, 8, 21, 47, tzinfo=UTC)),
        ("2022-05-09T08:21:47", datetime(2022, 5, 9, 8, 21, 47, tzinfo=UTC)),
    ],
)
def test_parse_datestamp_accepts_real_world_forms(text: str, expected: datetime) -> None:
    value = parse.parse_datestamp(text)
    assert value == expected
    assert value.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text",
    ["aaaa-bb-cc", "", "2002-06-01T03:020:00Z", "2024-13-01", "2024-02-30", "20240101", "2024-01-01 junk"],
)
def test_parse_datestamp_rejects_junk(text: str) -> None:
    with pytest.raises(ValueError):
        parse.parse_datestamp(text)


def test_format_datestamp_both_granularities() -> None:
    value = datetime(2024, 3, 5, 6, 7, 8, 999999, tzinfo=UTC)
    assert parse.format_datestamp(value, "YYYY-MM-DD") == "2024-03-05"
    assert parse.format_datestamp(value, "YYYY-MM-DDThh:mm:ssZ") == "2024-03-05T06:07:08Z"


def test_format_datestamp_converts_to_utc_and_refuses_naive() -> None:
    cet = timezone(timedelta(hours=1))
    assert parse.format_datestamp(datetime(2024, 1, 1, 0, 30, tzinfo=cet), parse.DAY_GRANULARITY) == "2023-12-31"
    with pytest.raises(ValueError, match="naive"):
        parse.format_datestamp(datetime(2024, 1, 1), parse.SECOND_GRANULARITY)
    with pytest.raises(ValueError, match="granularity"):
        parse.format_datestamp(datetime(2024, 1, 1, tzinfo=UTC), "YYYY")


def test_format_then_parse_round_trips() -> None:
    value = datetime(2024, 3, 5, 6, 7, 8, tzinfo=UTC)
    assert parse.parse_datestamp(parse.format_datestamp(value, parse.SECOND_GRANULARITY)) == value


# -- Identify / ListMetadataFormats / ListSets --------------------------------------------


def test_identify_with_pis_and_comments() -> None:
    info = parse.parse_identify(fixture("identify.xml"))
    assert info.repository_name == "Example City Museum\n      Collections"
    assert info.base_url == "https://collections.example.org/oai"
    assert info.protocol_version == "2.0"
    assert info.granularity == "YYYY-MM-DDThh:mm:ssZ"
    assert info.deleted_record == "persistent"
    assert info.earliest_datestamp == datetime(2009, 11, 2, 8, tzinfo=UTC)
    assert info.response_date == datetime(2024, 3, 5, 6, 30, 12, tzinfo=UTC)


def test_identify_defaults_when_fields_are_missing() -> None:
    info = parse.parse_identify(fixture("identify_minimal.xml"))
    assert info.granularity == parse.DAY_GRANULARITY
    assert info.deleted_record == "no"
    assert info.earliest_datestamp == datetime(2001, 5, 17, tzinfo=UTC)
    assert info.response_date == datetime(2024, 3, 5, 6, 30, 12, 734000, tzinfo=UTC)


def test_identify_bad_earliest_datestamp_degrades_to_none() -> None:
    info = parse.parse_identify(fixture("identify_bad_earliest.xml"))
    assert info.earliest_datestamp is None
    assert info.deleted_record == "transient"
    assert info.repository_name == "Example University Repository"


def test_identify_bogus_wrapper_is_not_an_oai_response() -> None:
    with pytest.raises(OaiResponseError) as info:
        parse.parse_identify(fixture("identify_bogus_wrapper.xml"))
    assert "<Identify>" in str(info.value) and "wrapper" in str(info.value)


def test_identify_unclosed_wrapper_is_malformed() -> None:
    with pytest.raises(MalformedXmlError):
        parse.parse_identify(fixture("identify_bogus_unclosed.xml"))


def test_identify_undefined_entity_is_malformed() -> None:
    with pytest.raises(MalformedXmlError, match="nbsp"):
        parse.parse_identify(fixture("identify_undefined_entity.xml"))


def test_identify_without_response_date_is_refused() -> None:
    body = fixture("identify.xml").replace(b"<responseDate>2024-03-05T06:30:12Z</responseDate>", b"")
    with pytest.raises(OaiResponseError, match="responseDate"):
        parse.parse_identify(body)


def test_hostile_identify_is_refused() -> None:
    with pytest.raises(HostileXmlError):
        parse.parse_identify(fixture("billion_laughs.xml"))


def test_wrong_root_is_not_an_oai_response() -> None:
    with pytest.raises(OaiResponseError, match="root element is <response>"):
        parse.parse_identify(fixture("not_oai_root.xml"))


def test_oai_root_in_no_namespace_is_not_accepted() -> None:
    with pytest.raises(OaiResponseError, match="OAI-PMH"):
        parse.parse_identify(b"<OAI-PMH><responseDate>2024-01-01</responseDate><Identify/></OAI-PMH>")


def test_answer_to_a_different_verb_is_named() -> None:
    with pytest.raises(OaiResponseError, match="answers ListIdentifiers"):
        parse.parse_list_records(fixture("list_identifiers_page1.xml"), "oai_dc")


def test_metadata_formats() -> None:
    formats = parse.parse_metadata_formats(fixture("list_metadata_formats.xml"))
    assert [f.prefix for f in formats] == ["oai_dc", "lido", "marcxml"]
    assert formats[1].namespace == "http://www.lido-schema.org"
    assert formats[2].namespace is None


def test_list_sets_with_hierarchy_and_token() -> None:
    page = parse.parse_list_sets(fixture("list_sets.xml"))
    assert [(s.spec, s.name) for s in of(parse.OaiSet, page.items)] == [
        ("paintings", "Paintings"),
        ("paintings:dutch", "Dutch paintings"),
        ("prints", None),
    ]
    assert page.token == "sets-page-2" and page.complete_list_size == 5


# -- error envelopes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "code", "message"),
    [
        ("error_badArgument.xml", BadArgument, "badArgument", "Illegal date in 'until'"),
        ("error_badResumptionToken.xml", BadResumptionToken, "badResumptionToken", "has expired"),
        ("error_cannotDisseminateFormat.xml", CannotDisseminateFormat, "cannotDisseminateFormat", "'lido'"),
        ("error_idDoesNotExist.xml", IdDoesNotExist, "idDoesNotExist", "is not known to this repository"),
        ("error_noSetHierarchy.xml", NoSetHierarchy, "noSetHierarchy", "does not support sets"),
        ("error_badVerb.xml", BadVerb, "badVerb", "'ListEverything' is illegal"),
        ("error_noMetadataFormats.xml", NoMetadataFormats, "noMetadataFormats", "No formats"),
        ("error_nonstandard_code.xml", OaiProtocolError, "noDataForResultSet", "is gone"),
        ("error_self_closing.xml", BadArgument, "badArgument", "(no message)"),
    ],
)
def test_error_envelopes_raise_typed_one_line_errors(
    name: str, cls: type[OaiProtocolError], code: str, message: str
) -> None:
    for call in (
        lambda c: parse.parse_list_records(c, "oai_dc"),
        parse.parse_list_identifiers,
        parse.parse_identify,
        parse.parse_metadata_formats,
        parse.parse_list_sets,
        lambda c: parse.parse_get_record(c, "oai_dc"),
    ):
        with pytest.raises(OaiProtocolError) as info:
            call(fixture(name))
        error = info.value
        assert type(error) is cls
        assert error.code == code
        text = str(error)
        assert "\n" not in text and code in text and message in text


def test_error_without_code() -> None:
    with pytest.raises(OaiProtocolError) as info:
        parse.parse_list_records(fixture("error_without_code.xml"), "oai_dc")
    assert type(info.value) is OaiProtocolError
    assert info.value.code is None
    assert str(info.value) == "(no error code): Internal problem, please retry later"


def test_no_records_match_is_an_empty_page_for_lists() -> None:
    for page in (
        parse.parse_list_records(fixture("error_noRecordsMatch.xml"), "oai_dc"),
        parse.parse_list_identifiers(fixture("error_noRecordsMatch.xml")),
    ):
        assert page.items == [] and page.token is None
        assert page.response_date == datetime(2024, 3, 5, 8, tzinfo=UTC)


def test_no_records_match_raises_where_emptiness_means_nothing() -> None:
    with pytest.raises(NoRecordsMatch):
        parse.parse_get_record(fixture("error_noRecordsMatch.xml"), "oai_dc")


def test_a_real_error_next_to_no_records_match_wins() -> None:
    with pytest.raises(BadArgument) as info:
        parse.parse_list_records(fixture("error_multiple.xml"), "oai_dc")
    assert info.value.errors[1][0] == "noRecordsMatch"
    assert "also: noRecordsMatch" in str(info.value)


def test_protocol_and_response_errors_share_a_base() -> None:
    assert issubclass(OaiProtocolError, OaiError) and issubclass(OaiResponseError, OaiError)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("empty.xml", NotXmlError),
        ("html_error_page.xml", NotXmlError),
        ("not_xml_text.xml", NotXmlError),
        ("broken_truncated.xml", MalformedXmlError),
        ("xxe_external_entity.xml", HostileXmlError),
    ],
)
def test_unusable_bodies_raise_xml_input_errors(name: str, cls: type) -> None:
    with pytest.raises(cls):
        parse.parse_list_records(fixture(name), "oai_dc")


# -- resumption tokens -------------------------------------------------------------------


def test_token_with_attributes_and_special_characters() -> None:
    page = parse.parse_list_records(fixture("list_records_page1.xml"), "oai_dc")
    assert page.token == "rt/oai_dc/2024-03-01+00:00/200!b64=="
    assert page.complete_list_size == 1203
    assert page.cursor == 0
    assert page.expiration_date == "2024-03-05T07:40:00Z"
    assert page.response_date == datetime(2024, 3, 5, 6, 40, tzinfo=UTC)


def test_absent_token_means_last_page() -> None:
    page = parse.parse_list_identifiers(fixture("list_identifiers_no_token.xml"))
    assert page.token is None and page.complete_list_size is None and page.cursor is None
    assert len(page.items) == 1


def test_empty_token_with_attributes_means_last_page_but_keeps_counts() -> None:
    page = parse.parse_list_identifiers(fixture("list_identifiers_last_empty_token.xml"))
    assert page.token is None
    assert page.complete_list_size == 5
    assert page.cursor == 3
    assert page.expiration_date == "2099-12-31T23:59:59Z"
    assert [h.identifier for h in of(parse.OaiHeader, page.items)] == [
        "oai:collections.example.org:obj-4",
        "oai:collections.example.org:obj-5",
    ]


def test_whitespace_token_is_none_and_junk_counts_are_ignored() -> None:
    page = parse.parse_list_identifiers(fixture("list_identifiers_whitespace_token.xml"))
    assert page.token is None
    assert page.cursor == 7
    assert page.complete_list_size is None


def test_token_text_with_slashes_survives() -> None:
    page = parse.parse_list_identifiers(fixture("list_identifiers_page1.xml"))
    assert page.token == "0/3/5/oai_dc/null/2024-01-01/null"


# -- ListIdentifiers headers -------------------------------------------------------------


def test_list_identifiers_headers() -> None:
    page = parse.parse_list_identifiers(fixture("list_identifiers_page1.xml"))
    first, deleted, broken = of(parse.OaiHeader, page.items)
    assert first == parse.OaiHeader(
        "oai:collections.example.org:obj-1", "2024-01-03T12:00:00Z", False, ("prints",)
    )
    assert first.datestamp == datetime(2024, 1, 3, 12, tzinfo=UTC)
    assert deleted.deleted and deleted.identifier == "oai:collections.example.org:obj-2"
    assert broken.deleted and broken.identifier is None and broken.datestamp_text is None
    assert broken.datestamp is None


# -- ListRecords -------------------------------------------------------------------------


def test_list_records_page() -> None:
    page = parse.parse_list_records(fixture("list_records_page1.xml"), "oai_dc")
    assert [type(i) for i in page.items] == [Tombstone, Record, Record]
    gone, (harbour, lemons) = page.items[0], of(Record, page.items[1:])
    assert gone == Tombstone("oai:collections.example.org:obj-17", datetime(2024, 3, 2, 9, 15, tzinfo=UTC))
    assert harbour.identifier == "oai:collections.example.org:obj-18"
    assert harbour.datestamp == datetime(2024, 3, 2, 10, tzinfo=UTC)
    assert harbour.metadata_prefix == "oai_dc"
    assert harbour.set_specs == ("paintings", "paintings:dutch")
    assert harbour.title == "View of a Harbour at Dusk"
    assert lemons.title == "Still Life with Lemons"
    assert lemons.set_specs == ()
    assert page.cleaned is False


def test_record_metadata_is_the_standalone_payload() -> None:
    page = parse.parse_list_records(fixture("list_records_page1.xml"), "oai_dc")
    record, other = of(Record, page.items[1:])
    payload = etree.fromstring(record.metadata.encode("utf-8"))
    assert payload.tag == "{http://www.openarchives.org/OAI/2.0/oai_dc/}dc"
    assert record.metadata.startswith("<oai_dc:dc")
    assert record.metadata.endswith("</oai_dc:dc>")  # no tail whitespace, no <about>
    assert "provenance" not in other.metadata


def test_prefixed_oai_namespace_and_dc_declared_only_on_root() -> None:
    page = parse.parse_list_records(fixture("list_records_prefixed_ns.xml"), "oai_dc")
    record, _ = of(Record, page.items)
    assert record.identifier == "oai:library.example.fr:doc/ark:/99999/x1"
    assert record.datestamp == datetime(2023, 11, 19, tzinfo=UTC)
    assert record.title == "Carte de la région, 1788"
    assert 'xmlns:dc="http://purl.org/dc/elements/1.1/"' in record.metadata
    assert 'xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"' in record.metadata
    payload = etree.fromstring(record.metadata.encode("utf-8"))  # self-contained
    assert payload.find("{http://purl.org/dc/elements/1.1/}title") is not None
    assert page.token == "7!1200!88!oai_dc" and page.complete_list_size == 40211


def test_millisecond_and_offset_datestamps() -> None:
    page = parse.parse_list_records(fixture("list_records_milliseconds.xml"), "oai_dc")
    record, gone = page.items
    assert isinstance(record, Record) and record.datestamp == datetime(2022, 5, 9, 8, 21, 47, 485000, tzinfo=UTC)
    assert gone == Tombstone("oai:dspace.example.ac.uk:10023/502", datetime(2022, 5, 9, 8, 21, 47, tzinfo=UTC))
    assert page.response_date == datetime(2022, 5, 10, 11, 14, 3, 118000, tzinfo=UTC)


def test_bad_records_are_rejected_and_the_page_survives() -> None:
    page = parse.parse_list_records(fixture("list_records_mixed_bad.xml"), "oai_dc")
    kinds = [type(i).__name__ for i in page.items]
    assert len(page.items) == 12, "no record may disappear silently"
    assert kinds[0] == "Record" and kinds[-1] == "Record"
    assert kinds[1:-1] == ["Rejected"] * 10
    assert page.token is None and page.complete_list_size == 12

    rejected = [i for i in page.items if isinstance(i, Rejected)]
    reasons = {r.identifier + " | " + r.reason for r in rejected}
    expected_fragments = [
        ("(missing identifier)", "header: no <identifier>"),
        ("oai:collections.example.org:bad-date", "unparseable <datestamp> '2024-13-45T99:00:00Z'"),
        ("oai:collections.example.org:no-metadata", "live record has no <metadata>"),
        ("oai:collections.example.org:empty-metadata", "exactly one payload element, found 0"),
        ("oai:collections.example.org:two-payloads", "exactly one payload element, found 2"),
        ("oai:collections.example.org:no-title", "no non-empty dc:title"),
        ("oai:collections.example.org:wrong-root", "{http://www.loc.gov/mods/v3}mods"),
        ("oai:collections.example.org:gone-no-date", "deleted header: no <datestamp>"),
        ("(missing identifier)", "deleted header: no <identifier>; no <datestamp>"),
        ("(missing identifier)", "record has no <header>"),
    ]
    for identifier, fragment in expected_fragments:
        assert any(r.startswith(identifier + " | ") and fragment in r for r in reasons), fragment

    for item in rejected:
        assert item.metadata_prefix == "oai_dc"
        assert item.raw.startswith("<record") and item.raw.endswith("</record>")
        etree.fromstring(item.raw.encode("utf-8"))  # raw is re-parseable for quarantine review
        assert "\n" not in item.reason

    lost_id = next(r for r in rejected if "no <identifier>" in r.reason and not r.reason.startswith("deleted"))
    assert lost_id.datestamp == datetime(2024, 3, 1, 0, 0, 2, tzinfo=UTC)
    assert "Lost its identifier" in lost_id.raw
    no_title = next(r for r in rejected if r.identifier.endswith("no-title"))
    assert no_title.datestamp == datetime(2024, 3, 1, 0, 0, 7, tzinfo=UTC)


def test_deleted_header_without_identifier_is_rejected_not_dropped() -> None:
    page = parse.parse_list_records(fixture("list_records_mixed_bad.xml"), "oai_dc")
    tombstone_like = [i for i in page.items if isinstance(i, Rejected) and i.reason.startswith("deleted")]
    assert len(tombstone_like) == 2
    assert not any(isinstance(i, Tombstone) for i in page.items)


def test_invalid_characters_are_cleaned_and_the_page_flagged() -> None:
    page = parse.parse_list_records(fixture("control_chars.xml"), "oai_dc")
    assert page.cleaned is True
    first, second = of(Record, page.items)
    assert first.title == "Verticaltab in a title"
    assert second.title == "Non-character in España"
    assert page.token == "ctl-page-2"


def test_lido_records_are_validated_per_record() -> None:
    page = parse.parse_list_records(fixture("list_records_lido.xml"), "lido")
    items = by_id(page.items)
    good = items["oai:museum.example.de:lido/1001"]
    assert isinstance(good, Record) and good.title == "Hafen am Abend"
    assert good.metadata_prefix == "lido"
    assert 'xmlns:lido="http://www.lido-schema.org"' in good.metadata
    assert "title" in items["oai:museum.example.de:lido/1002"].reason
    # what only the LIDO schema requires lands, with its warning (identity is the OAI identifier)
    assert [w.check for w in items["oai:museum.example.de:lido/1003"].warnings] == ["lido.no_work_type"]
    assert "title" in items["oai:museum.example.de:lido/1004"].reason  # no lidoRecID either: the title decides
    assert isinstance(items["oai:museum.example.de:lido/0999"], Tombstone)


def test_unknown_prefix_uses_the_generic_format() -> None:
    record = parse.parse_get_record(fixture("get_record_ddi.xml"), "oai_ddi25")
    assert isinstance(record, Record)
    assert record.set_specs == ("language:en", "data_kind:Quantitative", "openaire_data")
    assert record.metadata.startswith("<codeBook")
    assert 'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"' in record.metadata
    assert record.title is None  # DDI's element is <titl>, not <title>


def test_a_crashing_format_rejects_the_record_not_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest import formats

    class Exploding:
        prefix = "boom"
        namespace = None

        def validate(self, element: etree._Element) -> str | None:
            raise RuntimeError("validator bug")

        def extract_title(self, element: etree._Element) -> str | None:
            return None

    monkeypatch.setitem(formats.FORMATS, "boom", Exploding())
    page = parse.parse_list_records(fixture("list_records_page1.xml"), "boom")
    assert [type(i) for i in page.items] == [Tombstone, Rejected, Rejected]
    assert "validator bug" in of(Rejected, page.items[1:])[0].reason


# -- GetRecord ---------------------------------------------------------------------------


def test_get_record_nested_xoai_metadata() -> None:
    record = parse.parse_get_record(fixture("get_record_xoai_nested.xml"), "xoai")
    assert isinstance(record, Record)
    payload = etree.fromstring(record.metadata.encode("utf-8"))
    assert payload.tag == "{http://www.lyncode.com/xoai}metadata"
    assert len(payload) == 2
    assert "Vliv světla na růst rostlin" in record.metadata
    assert record.identifier == "oai:dspace.example.cz:123/456"


def test_get_record_deleted_with_stylesheet_and_duplicate_sets() -> None:
    item = parse.parse_get_record(fixture("get_record_deleted.xml"), "ddi")
    assert item == Tombstone("4711", datetime(2019, 12, 24, 18, tzinfo=UTC))


def test_get_record_without_record_is_a_response_error() -> None:
    body = (
        b'<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/">'
        b"<responseDate>2024-01-01T00:00:00Z</responseDate><GetRecord/></OAI-PMH>"
    )
    with pytest.raises(OaiResponseError, match="no <record>"):
        parse.parse_get_record(body, "oai_dc")


# -- speed -------------------------------------------------------------------------------


def big_page(n: int) -> bytes:
    record = (
        "<record><header><identifier>oai:example.org:{i}</identifier>"
        "<datestamp>2024-01-01T00:00:{s:02d}Z</datestamp><setSpec>a</setSpec><setSpec>b</setSpec></header>"
        '<metadata><oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
        'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Title {i}</dc:title>'
        "<dc:creator>Someone</dc:creator><dc:description>{d}</dc:description>"
        "<dc:subject>x</dc:subject><dc:subject>y</dc:subject><dc:date>2001</dc:date>"
        "</oai_dc:dc></metadata></record>"
    )
    body = "".join(record.format(i=i, s=i % 60, d="lorem ipsum " * 40) for i in range(n))
    return (
        '<?xml version="1.0" encoding="UTF-8"?><OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/">'
        "<responseDate>2024-01-02T00:00:00Z</responseDate><request verb=\"ListRecords\">x</request>"
        f"<ListRecords>{body}<resumptionToken cursor=\"0\">next</resumptionToken></ListRecords></OAI-PMH>"
    ).encode()


def test_a_500_record_page_parses_every_record() -> None:
    """Speed is measured in benchmarks/; here only that a big page comes out whole."""
    page = parse.parse_list_records(big_page(500), "oai_dc")
    records = of(Record, page.items)
    assert len(records) == 500 and [i.identifier for i in records[:2]] == ["oai:example.org:0", "oai:example.org:1"]


# -- the token guessed from raw bytes (pipelining asks for the next page on it) -----------

_ECHO = b'<request verb="ListRecords" resumptionToken="prev!1">http://x/oai</request>'


@pytest.mark.parametrize(("body", "expected"), [
    (b'<ListRecords><record/><resumptionToken completeListSize="5" cursor="0">abc!1/x+y</resumptionToken>'
     b'</ListRecords></OAI-PMH>', "abc!1/x+y"),
    (b'<oai:resumptionToken a="1">\n  t&amp;k&#x21;\n</oai:resumptionToken>', "t&k!"),  # prefix, padding, refs
    (b"<resumptionToken cursor='0'/>", None),  # the last page
    (b"<resumptionToken></resumptionToken>", None),
    (b"<resumptionToken><![CDATA[tok]]></resumptionToken>", None),  # CDATA: not guessed at
    (b"<resumptionToken>a</resumptionToken><!-- <resumptionToken>b</resumptionToken> -->", None),  # ambiguous
    (b"<resumptionTokenX>a</resumptionTokenX>", None),
    (b"<description>on resumptionToken handling</description>", None),
    (b"<resumptionToken>\xff\xfe</resumptionToken>", None),  # not UTF-8
    ("<resumptionToken>a</resumptionToken>".encode("utf-16"), None),
])
def test_guess_token_reads_one_plain_token_element_or_gives_up(body: bytes, expected: str | None) -> None:
    assert parse.guess_token(_ECHO + body) == expected


def test_guess_token_ignores_the_request_echo_and_words_in_records() -> None:
    body = (_ECHO + b"<ListRecords><record><metadata>resumptionToken resumptionToken</metadata></record>"
            b"<resumptionToken>next</resumptionToken></ListRecords>")
    assert parse.guess_token(body) == "next"
