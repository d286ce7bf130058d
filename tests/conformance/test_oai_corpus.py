"""Every recorded real OAI-PMH response in the corpus parses, or fails with a typed error.

The corpus is part of the project: ``tests/fixtures/realworld/oai/<implementation>/``, each
file byte-identical to its source (``tests/fixtures/realworld/SOURCES.md``). Any ``*.xml``
added there is picked up by the generic test, and so is every response inside a recorded
cassette (``.yaml``, vcrpy) or nock fixture (``.json``); the tables below pin the facts
known for the files SOURCES.md describes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
from lxml import etree

from include.simulators.replay import load_recording
from partner_harvest.oai import parse
from partner_harvest.oai.errors import OaiProtocolError, OaiResponseError
from partner_harvest.records import Record, Rejected, Tombstone
from partner_harvest.xmlsafe import MalformedXmlError, NotXmlError, XmlInputError, parse_xml
from tests.support.records import as_record

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "oai"
FILES = sorted(CORPUS.rglob("*.xml"))
RECORDED = sorted(p for p in CORPUS.rglob("*") if p.suffix in (".yaml", ".json"))
UTC = timezone.utc
OAI = f"{{{parse.OAI_NS}}}"


@dataclass
class Outcome:
    verb: str | None
    result: object = None
    error: Exception | None = None
    expected_error_code: str | None = None


def request_info(content: bytes) -> tuple[str | None, str | None, str | None]:
    """(verb element present, request verb, request metadataPrefix), or Nones if unparseable."""
    try:
        root = parse_xml(content)
    except XmlInputError:
        return None, None, None
    request = root.find(f"{OAI}request")
    error = root.find(f"{OAI}error")
    verb = parse.response_verb(root)
    request_verb = request.get("verb") if request is not None else None
    prefix = request.get("metadataPrefix") if request is not None else None
    if error is not None:
        return None, request_verb, prefix
    return verb, request_verb, prefix


def run(path: Path) -> Outcome:
    return run_bytes(path.read_bytes())


def run_bytes(content: bytes, asked_prefix: str | None = None) -> Outcome:
    """Dispatch on the verb element present (else the request's verb, else Identify)."""
    verb, request_verb, prefix = request_info(content)
    chosen = verb or request_verb or "Identify"
    prefix = prefix or asked_prefix or "unknown"
    parsers = {
        "Identify": parse.parse_identify,
        "ListMetadataFormats": parse.parse_metadata_formats,
        "ListSets": parse.parse_list_sets,
        "ListIdentifiers": parse.parse_list_identifiers,
        "ListRecords": lambda c: parse.parse_list_records(c, prefix),
        "GetRecord": lambda c: parse.parse_get_record(c, prefix),
    }
    outcome = Outcome(verb=chosen)
    try:
        error_el = parse_xml(content).find(f"{OAI}error")
    except XmlInputError:
        error_el = None
    if error_el is not None:
        outcome.expected_error_code = error_el.get("code")
    try:
        outcome.result = parsers[chosen](content)
    except (OaiProtocolError, OaiResponseError, XmlInputError) as exc:
        outcome.error = exc
    return outcome


def counts(items: list) -> dict[str, int]:
    return dict(Counter(type(item).__name__ for item in items))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_every_corpus_file_parses_or_fails_with_a_typed_error(path: Path) -> None:
    check_outcome(run(path))


def recorded_responses() -> list[tuple[str, bytes, str | None]]:
    """(id, body, prefix asked) of every OAI-PMH body inside a cassette or nock fixture."""
    found = []
    for path in RECORDED:
        for n, exchange in enumerate(load_recording(path)):
            if exchange.body.lstrip()[:1] == b"<":
                found.append((f"{path.relative_to(CORPUS)}#{n}", exchange.body, exchange.params.get("metadataPrefix")))
    return found


@pytest.mark.parametrize(("name", "body", "prefix"), recorded_responses(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_recorded_response_parses_or_fails_with_a_typed_error(name: str, body: bytes, prefix: str | None) -> None:
    check_outcome(run_bytes(body, prefix))


def check_outcome(outcome: Outcome) -> None:
    if outcome.error is not None:
        error = outcome.error
        assert "\n" not in str(error) and str(error)
        if isinstance(error, OaiProtocolError):
            assert outcome.expected_error_code is not None
            assert error.code == outcome.expected_error_code
            assert error.code in str(error)
        elif isinstance(error, XmlInputError):
            assert error.cause
        return
    result = outcome.result
    if outcome.verb == "Identify":
        assert isinstance(result, parse.Identify)
        assert result.granularity in parse.GRANULARITIES
        assert result.response_date.tzinfo is not None
    elif outcome.verb == "ListMetadataFormats":
        assert isinstance(result, list) and result and all(isinstance(f, parse.MetadataFormatInfo) for f in result)
    elif outcome.verb == "GetRecord":
        assert isinstance(result, (Record, Tombstone, Rejected))
    else:
        assert isinstance(result, parse.ListPage)
        kinds = {
            "ListSets": (parse.OaiSet,),
            "ListIdentifiers": (parse.OaiHeader,),
            "ListRecords": (Record, Tombstone, Rejected),
        }[outcome.verb or ""]
        assert all(isinstance(item, kinds) for item in result.items)
        for item in result.items:
            if isinstance(item, Record):
                assert item.datestamp.tzinfo is not None
                etree.fromstring(item.metadata.encode("utf-8"))  # payload is standalone XML


# -- known facts per file ----------------------------------------------------------------

# file -> (verb, expected): expected is a dict of item counts, an error class + code, or a
# callable check for the odd ones.
EXPECTED_LISTS = {
    "spec-examples/ListRecords.xml": ("ListRecords", {"Tombstone": 1, "Record": 1}),
    "spec-examples/ListRecords4.xml": ("ListRecords", {"Rejected": 1, "Record": 1}),
    "spec-examples/ListIdentifiers.xml": ("ListIdentifiers", {"OaiHeader": 2}),
    "spec-examples/ListIdentifiers2.xml": ("ListIdentifiers", {"OaiHeader": 2}),
    "spec-examples/ListSets.xml": ("ListSets", {"OaiSet": 131}),
    "dspace/eur-dspace-2003_ListSets-hierarchical.xml": ("ListSets", {"OaiSet": 10}),
    "dspace/eur-dspace-2003_ListIdentifiers.xml": ("ListIdentifiers", {"OaiHeader": 16}),
    "dspace/eur-dspace-2003_ListRecords.xml": ("ListRecords", {"Record": 16}),
    "dspace/eur-dspace-2004_ListRecords-252KB.xml": ("ListRecords", {"Record": 79, "Tombstone": 2}),
    "nsdl/nsdl_ListIdentifiers_page1.xml": ("ListIdentifiers", {"OaiHeader": 200}),
    "nsdl/nsdl_ListIdentifiers_page2.xml": ("ListIdentifiers", {"OaiHeader": 200}),
    "nsdl/nsdl_ListIdentifiers_page3.xml": ("ListIdentifiers", {"OaiHeader": 200}),
    "nsdl/nsdl_ListIdentifiers_page4.xml": ("ListIdentifiers", {"OaiHeader": 133}),
    "nsdl/nsdl_ListRecords_nsdl_dc-544KB.xml": ("ListRecords", {"Record": 162}),
    "gallica/bnf_ListRecords-prefixed-namespace.xml": ("ListRecords", {"Record": 1}),
}

EXPECTED_ERRORS = {
    "spec-examples/badArgument.xml": "badArgument",
    "spec-examples/badResumptionToken.xml": "badResumptionToken",
    "spec-examples/cannotDisseminateFormat.xml": "cannotDisseminateFormat",
    "spec-examples/idDoesNotExist.xml": "idDoesNotExist",
    "spec-examples/noSetHierarchy.xml": "noSetHierarchy",
    "spec-examples/undefinedError.xml": "undefinedError",
    "nsdl/nsdl_badVerb.xml": "badVerb",
    "bepress/wustl-bepress_idDoesNotExist.xml": "idDoesNotExist",
    "ukds/ukds_cannotDisseminateFormat.xml": "cannotDisseminateFormat",
}


def corpus_file(relative: str) -> Path:
    path = CORPUS / relative
    if not path.is_file():
        pytest.skip(f"{relative} not in this corpus")
    return path


@pytest.mark.parametrize(("relative", "expected"), sorted(EXPECTED_LISTS.items()))
def test_list_item_counts(relative: str, expected: tuple[str, dict[str, int]]) -> None:
    verb, item_counts = expected
    outcome = run(corpus_file(relative))
    assert outcome.error is None, outcome.error
    assert outcome.verb == verb
    assert isinstance(outcome.result, parse.ListPage) and counts(outcome.result.items) == item_counts


@pytest.mark.parametrize(("relative", "code"), sorted(EXPECTED_ERRORS.items()))
def test_error_envelopes(relative: str, code: str) -> None:
    outcome = run(corpus_file(relative))
    assert isinstance(outcome.error, OaiProtocolError)
    assert outcome.error.code == code


def test_no_records_match_is_an_empty_list() -> None:
    outcome = run(corpus_file("spec-examples/noRecordsMatch.xml"))
    assert outcome.error is None
    assert isinstance(outcome.result, parse.ListPage)
    assert outcome.result.items == [] and outcome.result.token is None


def test_undefined_error_code_keeps_the_base_class() -> None:
    outcome = run(corpus_file("spec-examples/undefinedError.xml"))
    assert type(outcome.error) is OaiProtocolError
    assert str(outcome.error) == "undefinedError: (no message)"


def test_id_does_not_exist_message_is_one_line() -> None:
    outcome = run(corpus_file("spec-examples/idDoesNotExist.xml"))
    assert str(outcome.error) == (
        "idDoesNotExist: oai:lcoa1.loc.gov:loc.rbc/rbpe.00000111 has the structure of a valid "
        "LOC identifier, but it maps to no known item"
    )


def test_bad_verb_message_decodes_the_character_reference() -> None:
    outcome = run(corpus_file("nsdl/nsdl_badVerb.xml"))
    assert "The verb 'NotExist' is illegal" in str(outcome.error)


def test_nsdl_tokens_and_the_empty_last_token() -> None:
    pages = [
        parse.parse_list_identifiers(corpus_file(f"nsdl/nsdl_ListIdentifiers_page{n}.xml").read_bytes())
        for n in (1, 2, 3, 4)
    ]
    assert [p.token for p in pages] == [
        "0/200/733/nsdl_dc/null/2012-07-26/null",
        "200/400/733/nsdl_dc/null/2012-07-26/null",
        "400/600/733/nsdl_dc/null/2012-07-26/null",
        None,
    ]
    assert [p.cursor for p in pages] == [0, 200, 400, 600]
    assert all(p.complete_list_size == 733 for p in pages)
    assert all(p.expiration_date == "2099-01-01T01:30:28Z" for p in pages)
    assert sum(len(p.items) for p in pages) == 733


def test_bnf_prefixed_namespace_payload_is_self_contained() -> None:
    content = corpus_file("gallica/bnf_ListRecords-prefixed-namespace.xml").read_bytes()
    assert not content.lstrip().startswith(b"<?xml")
    page = parse.parse_list_records(content, "oai_dc")
    (item,) = page.items
    record = as_record(item)
    assert record.identifier == "oai:bnf.fr:gallica/ark:/12148/bpt6k5440618t"
    assert record.datestamp == datetime(2010, 6, 9, tzinfo=UTC)
    assert record.set_specs == ("gallica:theme:8:80", "gallica:typedoc:periodiques:fascicules")
    assert record.title == "Le Poème. Publication mensuelle"
    assert 'xmlns:dc="http://purl.org/dc/elements/1.1/"' in record.metadata
    payload = etree.fromstring(record.metadata.encode("utf-8"))
    assert payload.findtext("{http://purl.org/dc/elements/1.1/}format") == "application/pdf"
    assert page.token == "1!53691!20513471!2505879!100!2402263!oai_dc"
    assert page.complete_list_size == 2402263 and page.cursor == 0
    assert page.expiration_date == "2015-07-29T20:57:07Z"


def test_sickle_list_records_token_and_tombstone() -> None:
    page = parse.parse_list_records(corpus_file("spec-examples/ListRecords.xml").read_bytes(), "oai_dc")
    assert page.token == "ListRecords2.xml" and page.complete_list_size == 8 and page.cursor == 0
    assert page.items[0] == Tombstone("oai:test.example.com:1585310", datetime(2011, 7, 18, 16, 31, tzinfo=UTC))
    assert as_record(page.items[1]).title == "Sample Title"


def test_sickle_list_records4_deleted_header_without_identifier_is_rejected() -> None:
    page = parse.parse_list_records(corpus_file("spec-examples/ListRecords4.xml").read_bytes(), "oai_dc")
    rejected, record = page.items
    assert isinstance(rejected, Rejected)
    assert rejected.identifier == parse.MISSING_IDENTIFIER
    assert "deleted header" in rejected.reason and "no <identifier>" in rejected.reason
    assert "Missing identifier" in rejected.raw
    assert record.identifier == "oai:test.example.com:1585322"


def test_sickle_list_identifiers_second_page_has_no_token() -> None:
    first = parse.parse_list_identifiers(corpus_file("spec-examples/ListIdentifiers.xml").read_bytes())
    second = parse.parse_list_identifiers(corpus_file("spec-examples/ListIdentifiers2.xml").read_bytes())
    assert first.token == "ListIdentifiers2.xml" and first.complete_list_size == 4
    assert second.token is None and second.complete_list_size is None
    assert [h.deleted for h in second.items] == [False, True]


def test_sickle_broken_is_not_xml() -> None:
    with pytest.raises(NotXmlError, match="broken xml"):
        parse.parse_list_records(corpus_file("spec-examples/ListRecordsBroken.xml").read_bytes(), "oai_dc")


def test_sickle_utf8_creator_survives() -> None:
    record = as_record(parse.parse_get_record(corpus_file("spec-examples/GetRecord_utf8test.xml").read_bytes(), "oai_dc"))
    assert "某人" in record.metadata and record.title == "Sample Title"


def test_sickle_metadata_formats() -> None:
    formats = parse.parse_metadata_formats(corpus_file("spec-examples/ListMetadataFormats.xml").read_bytes())
    prefixes = [f.prefix for f in formats]
    assert prefixes[:3] == ["epicur", "xMetaDissPlus", "oai_dc"] and "mods" in prefixes


def test_pyoai_hierarchical_set_specs() -> None:
    page = parse.parse_list_sets(corpus_file("dspace/eur-dspace-2003_ListSets-hierarchical.xml").read_bytes())
    assert [s.spec for s in page.items][:2] == ["3", "3:5"]


def test_pyoai_252kb_page() -> None:
    page = parse.parse_list_records(
        corpus_file("dspace/eur-dspace-2004_ListRecords-252KB.xml").read_bytes(), "oai_dc"
    )
    assert len(page.items) == 81 and page.token is None
    assert all(item.title for item in page.items if isinstance(item, Record))


def test_pyoai_deleted_record_with_duplicate_set_spec() -> None:
    content = corpus_file("dspace/eur-dspace-2004_GetRecord-deleted-dup-setSpec.xml").read_bytes()
    assert parse.parse_get_record(content, "oai_dc") == Tombstone(
        "hdl:1765/1160", datetime(2004, 2, 16, 13, 29, 54, tzinfo=UTC)
    )
    assert content.count(b"<setSpec>1:1</setSpec>") == 2


def test_pyoai_identify_2003() -> None:
    info = parse.parse_identify(corpus_file("dspace/eur-dspace-2003_Identify.xml").read_bytes())
    assert info.granularity == parse.SECOND_GRANULARITY and info.deleted_record == "no"
    assert info.earliest_datestamp == datetime(2001, 1, 1, tzinfo=UTC)
    assert info.response_date == datetime(2003, 4, 30, 16, 8, 1, tzinfo=UTC)


def test_broken_identify_bad_earliest_datestamp_degrades() -> None:
    content = corpus_file("dspace/eur-dspace-2006_Identify-BROKEN-bad-earliestDatestamp.xml").read_bytes()
    info = parse.parse_identify(content)
    assert info.earliest_datestamp is None
    assert info.repository_name == "DSpace at Erasmus"
    assert info.deleted_record == "persistent"


def test_broken_identify_bogus_wrapper_is_malformed() -> None:
    content = corpus_file("dspace/eur-dspace-2006_Identify-BROKEN-bogus-wrapper.xml").read_bytes()
    with pytest.raises(MalformedXmlError, match="bogus"):
        parse.parse_identify(content)


def test_broken_identify_undefined_entity_is_malformed() -> None:
    content = corpus_file("dspace/eur-dspace-2006_Identify-BROKEN-undefined-entity.xml").read_bytes()
    with pytest.raises(MalformedXmlError, match="Entity 'bogus' not defined"):
        parse.parse_identify(content)


def test_nsdl_identify_with_blank_lines() -> None:
    info = parse.parse_identify(corpus_file("nsdl/nsdl_Identify.xml").read_bytes())
    assert info.repository_name == "National Science Digital Library"
    assert info.granularity == parse.SECOND_GRANULARITY


def test_nsdl_records_carry_their_namespaces() -> None:
    page = parse.parse_list_records(
        corpus_file("nsdl/nsdl_ListRecords_nsdl_dc-544KB.xml").read_bytes(), "nsdl_dc"
    )
    record = as_record(page.items[0])
    assert record.title == "Molecular Structure of Dinitrophenol"
    # xsi is declared only on the envelope but used inside the payload.
    assert 'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"' in record.metadata
    etree.fromstring(record.metadata.encode("utf-8"))


def test_cessda_deleted_with_stylesheet_pi() -> None:
    item = parse.parse_get_record(corpus_file("ukds/ukds_GetRecord-deleted.xml").read_bytes(), "ddi")
    assert item == Tombstone("1031", datetime(2017, 5, 2, 8, 31, 32, tzinfo=UTC))


def test_cessda_ddi_payloads_are_generic_records() -> None:
    ukds = parse.parse_get_record(corpus_file("ukds/ukds_GetRecord_ddi25.xml").read_bytes(), "ddi")
    assert isinstance(ukds, Record) and ukds.metadata.startswith("<codeBook")
    fsd = as_record(parse.parse_get_record(corpus_file("kuha2/fsd_GetRecord_oai_ddi25.xml").read_bytes(), "oai_ddi25"))
    assert "data_kind:Kvantitatiivinen" in fsd.set_specs and "openaire_data" in fsd.set_specs
    missing = parse.parse_get_record(
        corpus_file("kuha2/fsd_GetRecord-request-missing-prefix.xml").read_bytes(), "oai_ddi25"
    )
    assert isinstance(missing, Record)
    assert missing.set_specs == ("language:fi", "language:en", "study_groups:laku")


def test_oarepo_nested_xoai_metadata() -> None:
    record = parse.parse_get_record(corpus_file("dspace/cuni-dspace_GetRecord_xoai.xml").read_bytes(), "xoai")
    assert isinstance(record, Record)
    payload = etree.fromstring(record.metadata.encode("utf-8"))
    assert payload.tag == "{http://www.lyncode.com/xoai}metadata"
    assert "Vosolsobě, Stanislav" in record.metadata
    assert record.set_specs == ("com_20.500.11956_1902", "col_20.500.11956_1940", "nusl_set")


LIST_FILES = [p for p in FILES if run(p).verb in ("ListRecords", "ListIdentifiers", "ListSets")]


@pytest.mark.parametrize("path", LIST_FILES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_the_token_guessed_from_raw_bytes_is_the_parsed_token_or_none(path: Path) -> None:
    """A pipelined chain asks for the next page on the token read off the raw bytes
    (oai/client.py). On real responses the guess must never be a different token: a
    wrong guess costs the partner a wasted request."""
    outcome = run(path)
    guess = parse.guess_token(path.read_bytes())
    if outcome.error is not None:
        assert guess is None or isinstance(outcome.error, XmlInputError)
        return
    assert isinstance(outcome.result, parse.ListPage) and guess in (None, outcome.result.token)


def test_real_tokens_are_guessed_not_skipped() -> None:
    """The guess is worth having: on the corpus pages that carry a token it finds it."""
    pages = [(p, run(p).result) for p in LIST_FILES if run(p).error is None]
    carrying = [(p, page.token) for p, page in pages if isinstance(page, parse.ListPage) and page.token]
    assert carrying, "the corpus holds list pages with tokens"
    assert [parse.guess_token(p.read_bytes()) for p, _ in carrying] == [token for _, token in carrying]
