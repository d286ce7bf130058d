"""The single parser configuration: hostile, non-XML, broken and dirty bodies (I9; real servers emit control characters)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from partner_harvest.xmlsafe import (
    HostileXmlError,
    MalformedXmlError,
    NotXmlError,
    XmlInputError,
    XmlLimitError,
    XmlLimits,
    parse_document,
    parse_xml,
    xml_limits,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oai"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def xxe_document(target: Path, encoding: str = "UTF-8") -> str:
    return (
        f'<?xml version="1.0" encoding="{encoding}"?>\n'
        f'<!DOCTYPE r [<!ENTITY secret SYSTEM "{target.as_uri()}">]>\n'
        "<r><v>&secret;</v></r>"
    )


# -- hostile documents -------------------------------------------------------------------


def test_billion_laughs_is_refused() -> None:
    with pytest.raises(HostileXmlError) as info:
        parse_xml(fixture("billion_laughs.xml"))
    assert "entit" in info.value.cause


def test_billion_laughs_in_utf16_is_refused_too() -> None:
    body = fixture("billion_laughs.xml").decode("utf-8")
    body = body.replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="UTF-16"?>')
    with pytest.raises(HostileXmlError):
        parse_xml(body.encode("utf-16"))


def test_xxe_is_refused_and_nothing_is_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    with pytest.raises(HostileXmlError) as info:
        parse_xml(xxe_document(secret).encode("utf-8"))
    assert "TOP-SECRET" not in str(info.value)


def test_xxe_in_utf16_passes_the_byte_scan_but_is_refused_after_parsing(tmp_path: Path) -> None:
    """The byte scan cannot see UTF-16; the parsed DTD check still refuses, unexpanded."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    body = xxe_document(secret, "UTF-16").encode("utf-16")
    assert b"<!ENTITY" not in body
    with pytest.raises(HostileXmlError) as info:
        parse_xml(body)
    assert "secret" in info.value.cause
    assert "TOP-SECRET" not in str(info.value)


def test_xxe_fixture_is_refused() -> None:
    with pytest.raises(HostileXmlError):
        parse_xml(fixture("xxe_external_entity.xml"))


def test_doctype_without_entities_is_accepted_and_not_fetched() -> None:
    root = parse_xml(fixture("doctype_without_entities.xml"))
    assert etree.QName(root).localname == "OAI-PMH"


# -- not XML at all ----------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"   \n\t ", b"\xef\xbb\xbf", b"\xef\xbb\xbf  \n"])
def test_empty_bodies_are_not_xml(body: bytes) -> None:
    with pytest.raises(NotXmlError) as info:
        parse_xml(body)
    assert "empty" in info.value.cause


def test_empty_fixture_is_not_xml() -> None:
    with pytest.raises(NotXmlError):
        parse_xml(fixture("empty.xml"))


@pytest.mark.parametrize("name", ["html_error_page.xml", "html_no_doctype.xml"])
def test_html_pages_are_not_xml(name: str) -> None:
    with pytest.raises(NotXmlError) as info:
        parse_xml(fixture(name))
    assert "HTML" in info.value.cause


def test_wellformed_xhtml_is_not_a_data_document() -> None:
    body = b'<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body/></html>'
    with pytest.raises(NotXmlError, match="HTML"):
        parse_xml(body)


def test_html_after_an_xml_declaration_is_not_xml() -> None:
    with pytest.raises(NotXmlError, match="HTML"):
        parse_xml(b'<?xml version="1.0"?>\n<!DOCTYPE html>\n<html><body><p>oops</html>')


def test_plain_text_body_is_not_xml() -> None:
    with pytest.raises(NotXmlError) as info:
        parse_xml(fixture("not_xml_text.xml"))
    assert "Service Temporarily Unavailable" in info.value.cause


# -- malformed ---------------------------------------------------------------------------


def test_truncated_body_is_malformed_with_line_and_column() -> None:
    with pytest.raises(MalformedXmlError) as info:
        parse_xml(fixture("broken_truncated.xml"))
    cause = info.value.cause
    assert "line" in cause and "column" in cause
    assert "\n" not in str(info.value)


def test_undefined_entity_is_malformed_and_named() -> None:
    with pytest.raises(MalformedXmlError) as info:
        parse_xml(fixture("identify_undefined_entity.xml"))
    assert "nbsp" in info.value.cause


def test_mismatched_wrapper_is_malformed() -> None:
    with pytest.raises(MalformedXmlError, match="mismatch"):
        parse_xml(fixture("identify_bogus_unclosed.xml"))


def test_all_input_errors_share_a_base_with_a_cause() -> None:
    for body in (b"", b"<a><b></a>", b"<html><body>x</body></html>"):
        with pytest.raises(XmlInputError) as info:
            parse_xml(body)
        assert info.value.cause
        assert str(info.value) == info.value.cause


def test_recover_is_never_used() -> None:
    """A repaired page would silently lose the records after the damage."""
    with pytest.raises(MalformedXmlError):
        parse_xml(b"<list><item>1</item><item>2</list>")


# -- invalid XML characters --------------------------------------------------------------


def test_invalid_characters_are_stripped_and_flagged() -> None:
    parsed = parse_document(fixture("control_chars.xml"))
    assert parsed.cleaned is True
    assert parsed.removed_chars == 4  # \x0b, \x1a, &#11; and U+FFFE
    text = "".join(parsed.root.itertext())
    assert "Vertical" in text and "tab in a title" in text
    assert "\x0b" not in text and "\x1a" not in text and "\ufffe" not in text
    assert "España" in text


def test_clean_documents_are_not_flagged() -> None:
    parsed = parse_document(fixture("list_records_page1.xml"))
    assert parsed.cleaned is False and parsed.removed_chars == 0


def test_a_valid_character_reference_is_kept() -> None:
    parsed = parse_document(b"<a>tab&#9;here &#x41; and \x0b</a>")
    assert parsed.cleaned
    assert parsed.root.text == "tab\there A and "


def test_cleaning_in_a_latin1_document_keeps_the_encoding() -> None:
    body = '<?xml version="1.0" encoding="ISO-8859-1"?><a>caf\xe9\x1a</a>'.encode("latin-1")
    parsed = parse_document(body)
    assert parsed.cleaned and parsed.root.text == "café"


def test_still_broken_after_cleaning_raises() -> None:
    with pytest.raises(MalformedXmlError) as info:
        parse_document(fixture("control_chars_truncated.xml"))
    assert "after removing 1 invalid" in info.value.cause


def test_other_errors_are_not_retried() -> None:
    with pytest.raises(MalformedXmlError) as info:
        parse_document(b"<a><b></a>")
    assert "after removing" not in info.value.cause


# -- size limits: refused with a clear cause, before memory is spent --------------


def test_nesting_deeper_than_libxml2_allows_is_a_limit_error() -> None:
    depth = 10_000
    with pytest.raises(XmlLimitError, match="Excessive depth.*256"):
        parse_xml(b"<r>" + b"<d>" * depth + b"</d>" * depth + b"</r>")


def test_nesting_within_the_limit_parses() -> None:
    depth = 200
    root = parse_xml(b"<r>" + b"<d>" * depth + b"</d>" * depth + b"</r>")
    assert len(root) == 1


@pytest.mark.parametrize("body", [
    b'<r a="' + b"x" * 11_000_000 + b'"/>',  # one huge attribute value
    b"<r>" + b"x" * 11_000_000 + b"</r>",  # one huge text node
], ids=["attribute-value", "text-node"])
def test_values_past_libxml2s_10_mb_are_a_limit_error(body: bytes) -> None:
    with pytest.raises(XmlLimitError, match="safety limit"):
        parse_xml(body)


def test_millions_of_elements_are_refused_before_parsing() -> None:
    body = b"<r>" + b"<w/>" * 2_100_000 + b"</r>"
    with pytest.raises(XmlLimitError) as info:
        parse_xml(body)
    assert "2,100,002 XML nodes" in info.value.cause and "limit of 2,000,000" in info.value.cause


def test_attributes_count_twice() -> None:
    tag = b"<w " + b" ".join(b'a%d=""' % i for i in range(1000)) + b"/>"
    with pytest.raises(XmlLimitError, match="limit of 2,000,000"):
        parse_xml(b"<r>" + tag * 1001 + b"</r>")  # 1,001,000 attributes


def test_limits_can_be_given_or_set_for_a_block() -> None:
    body = b"<r>" + b"<w/>" * 50 + b"</r>"
    assert len(parse_xml(body)) == 50
    with pytest.raises(XmlLimitError, match="limit of 10 "):
        parse_document(body, XmlLimits(max_nodes=10))
    with xml_limits(XmlLimits(max_nodes=10)):
        with pytest.raises(XmlLimitError):
            parse_xml(body)
    assert len(parse_xml(body)) == 50  # the block's limit ends with it


def test_huge_tree_stays_off() -> None:
    from partner_harvest.xmlsafe import _new_parser

    parser = _new_parser()
    with pytest.raises(etree.XMLSyntaxError):
        etree.fromstring(b"<r>" + b"<d>" * 300 + b"</d>" * 300 + b"</r>", parser)
