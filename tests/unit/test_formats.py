"""Per-format payload validation and title extraction."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from lxml import etree

from partner_harvest import formats
from partner_harvest.formats import FORMATS, GenericFormat, MetadataFormat, get_format, register_format
from partner_harvest.formats.base import checked_by

DC = 'xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" xmlns:dc="http://purl.org/dc/elements/1.1/"'
LIDO = 'xmlns:lido="http://www.lido-schema.org"'


def el(xml: str) -> etree._Element:
    return etree.fromstring(xml.encode("utf-8"))


def lido(body: str) -> etree._Element:
    return el(f"<lido:lido {LIDO}>{body}</lido:lido>")


LIDO_WORK_TYPE = (
    "<lido:objectClassificationWrap><lido:objectWorkTypeWrap><lido:objectWorkType>"
    "<lido:term>{term}</lido:term></lido:objectWorkType></lido:objectWorkTypeWrap>"
    "</lido:objectClassificationWrap>"
)
LIDO_TITLES = (
    "<lido:objectIdentificationWrap><lido:titleWrap>{sets}</lido:titleWrap>"
    "</lido:objectIdentificationWrap>"
)


def lido_record(*, rec_id: str = "R-1", term: str = "painting", titles: str | None = None) -> etree._Element:
    if titles is None:
        titles = "<lido:titleSet><lido:appellationValue>A title</lido:appellationValue></lido:titleSet>"
    return lido(
        f"<lido:lidoRecID>{rec_id}</lido:lidoRecID><lido:descriptiveMetadata>"
        f"{LIDO_WORK_TYPE.format(term=term)}{LIDO_TITLES.format(sets=titles)}"
        "</lido:descriptiveMetadata>"
    )


# -- registry ----------------------------------------------------------------------------


def test_registry_knows_oai_dc_and_lido_and_falls_back_to_generic() -> None:
    assert get_format("oai_dc").prefix == "oai_dc"
    assert get_format("lido").namespace == "http://www.lido-schema.org"
    generic = get_format("nsdl_dc")
    assert isinstance(generic, GenericFormat) and generic.prefix == "nsdl_dc"
    for prefix in ("oai_dc", "lido", "ddi"):
        assert isinstance(get_format(prefix), MetadataFormat)


def test_register_format_with_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "FORMATS", dict(FORMATS))

    class Marc:
        prefix = "marc21"
        namespace = "http://www.loc.gov/MARC21/slim"

        def validate(self, element: etree._Element) -> str | None:
            return None

        def extract_title(self, element: etree._Element) -> str | None:
            return "t"

    marc = Marc()
    register_format(marc, "marc21", "marcxml")
    assert formats.get_format("marcxml") is marc and formats.get_format("marc21") is marc


# -- oai_dc ------------------------------------------------------------------------------


def test_oai_dc_valid_and_title_is_first_non_empty_normalised() -> None:
    fmt = get_format("oai_dc")
    payload = el(
        f"<oai_dc:dc {DC}><dc:title>  </dc:title><dc:title>\n  Two\n   lines </dc:title>"
        "<dc:title>Third</dc:title></oai_dc:dc>"
    )
    assert fmt.validate(payload) is None
    assert fmt.extract_title(payload) == "Two lines"


def test_oai_dc_title_ignores_comments() -> None:
    fmt = get_format("oai_dc")
    payload = el(f"<oai_dc:dc {DC}><dc:title>Half<!-- note -->way</dc:title></oai_dc:dc>")
    assert fmt.extract_title(payload) == "Halfway"


@pytest.mark.parametrize(
    ("xml", "fragment"),
    [
        (f"<oai_dc:dc {DC}><dc:creator>x</dc:creator></oai_dc:dc>", "no non-empty dc:title"),
        (f"<oai_dc:dc {DC}><dc:title/><dc:title> </dc:title></oai_dc:dc>", "no non-empty dc:title"),
        (f"<dc {DC}><dc:title>Wrong root namespace</dc:title></dc>", "payload root is <dc>"),
        (
            f'<oai_dc:dc {DC} xmlns:t="urn:other"><t:title>Other namespace</t:title></oai_dc:dc>',
            "no non-empty dc:title",
        ),
        ('<mods xmlns="http://www.loc.gov/mods/v3"/>', "{http://www.loc.gov/mods/v3}mods"),
    ],
)
def test_oai_dc_invalid(xml: str, fragment: str) -> None:
    reason = get_format("oai_dc").validate(el(xml))
    assert reason is not None and fragment in reason and "\n" not in reason


# -- lido --------------------------------------------------------------------------------


def test_lido_valid_record() -> None:
    fmt = get_format("lido")
    record = lido_record()
    assert fmt.validate(record) is None
    assert fmt.extract_title(record) == "A title"


def test_lido_prefers_the_preferred_appellation() -> None:
    titles = (
        "<lido:titleSet><lido:appellationValue lido:pref=\"alternative\">Alt</lido:appellationValue></lido:titleSet>"
        "<lido:titleSet><lido:appellationValue lido:pref=\"preferred\"> Main\n title </lido:appellationValue>"
        "</lido:titleSet>"
    )
    assert get_format("lido").extract_title(lido_record(titles=titles)) == "Main title"


def test_lido_unqualified_pref_attribute_is_honoured() -> None:
    titles = (
        "<lido:titleSet><lido:appellationValue>First</lido:appellationValue>"
        '<lido:appellationValue pref="preferred">Chosen</lido:appellationValue></lido:titleSet>'
    )
    assert get_format("lido").extract_title(lido_record(titles=titles)) == "Chosen"


def test_lido_without_preference_takes_first_non_empty() -> None:
    titles = (
        "<lido:titleSet><lido:appellationValue> </lido:appellationValue></lido:titleSet>"
        "<lido:titleSet><lido:appellationValue>Second</lido:appellationValue></lido:titleSet>"
    )
    assert get_format("lido").extract_title(lido_record(titles=titles)) == "Second"


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        (lambda: lido("<lido:lidoRecID>R-1</lido:lidoRecID>"), "descriptiveMetadata"),
        (lambda: lido_record(titles=""), "title"),
        (
            lambda: lido_record(
                titles="<lido:titleSet><lido:appellationValue/></lido:titleSet>"
            ),
            "title",
        ),
        (lambda: el(f"<lido:lidoWrap {LIDO}/>"), "lidoWrap"),
        (lambda: el("<lido><lidoRecID>no namespace</lidoRecID></lido>"), "payload root is <lido>"),
    ],
)
def test_lido_invalid(record: Callable[[], etree._Element], fragment: str) -> None:
    reason = get_format("lido").validate(record())
    assert reason is not None and fragment in reason and "\n" not in reason


def test_lido_work_type_needs_a_term_not_just_the_wrapper() -> None:
    record = lido(
        "<lido:lidoRecID>R</lido:lidoRecID><lido:descriptiveMetadata>"
        "<lido:objectClassificationWrap><lido:objectWorkTypeWrap><lido:objectWorkType>"
        "<lido:conceptID>http://vocab.example/1</lido:conceptID>"
        "</lido:objectWorkType></lido:objectWorkTypeWrap></lido:objectClassificationWrap>"
        + LIDO_TITLES.format(sets="<lido:titleSet><lido:appellationValue>T</lido:appellationValue></lido:titleSet>")
        + "</lido:descriptiveMetadata>"
    )
    checked = checked_by(get_format("lido"), record)
    assert [f.check for f in checked.findings] == ["lido.no_work_type"] and "objectWorkType" in checked.findings[0].message


@pytest.mark.parametrize(
    ("record", "check"),
    [(lambda: lido_record(rec_id="  "), "lido.no_rec_id"), (lambda: lido_record(term=""), "lido.no_work_type")],
)
def test_lido_without_what_only_the_schema_needs_lands_with_a_warning(record: Callable[[], etree._Element],
                                                                       check: str) -> None:
    """The LIDO schema requires lidoRecID and objectWorkType; the aggregation needs neither
    (identity is the OAI identifier, a record is shown by its title): a warning, not a reject."""
    element = record()
    checked = checked_by(get_format("lido"), element)
    assert get_format("lido").validate(element) is None
    assert [f.check for f in checked.findings] == [check] and checked.title


def test_a_one_record_lido_wrap_is_read_as_its_record() -> None:
    wrapped = el(f"<lido:lidoWrap {LIDO}>" + etree.tostring(lido_record()).decode() + "</lido:lidoWrap>")
    checked = checked_by(get_format("lido"), wrapped)
    assert checked.findings == () and checked.title == get_format("lido").extract_title(lido_record())


# -- generic -----------------------------------------------------------------------------


def test_generic_accepts_any_element_and_finds_a_title_in_any_namespace() -> None:
    fmt = get_format("mods")
    payload = el(
        '<mods xmlns="http://www.loc.gov/mods/v3"><titleInfo><title> </title>'
        "<title>  The   MODS title </title></titleInfo></mods>"
    )
    assert fmt.validate(payload) is None
    assert fmt.extract_title(payload) == "The MODS title"


def test_generic_title_without_namespace_and_none_when_absent() -> None:
    fmt = get_format("custom")
    assert fmt.extract_title(el("<rec><meta><title>Plain</title></meta></rec>")) == "Plain"
    assert fmt.extract_title(el("<rec><titl>not a title</titl></rec>")) is None


def test_generic_nsdl_dc_title() -> None:
    payload = el(
        '<nsdl_dc:nsdl_dc xmlns:nsdl_dc="http://ns.nsdl.org/nsdl_dc_v1.02/" '
        'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier>x</dc:identifier>'
        "<dc:title>Molecule</dc:title></nsdl_dc:nsdl_dc>"
    )
    assert get_format("nsdl_dc").extract_title(payload) == "Molecule"
