"""LIDO (museum objects): the minimum a record needs to be shown in the aggregation."""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import describe_tag, first_text, text_of

LIDO_NS = "http://www.lido-schema.org"
_L = f"{{{LIDO_NS}}}"
_ROOT = f"{_L}lido"
_REC_ID = f"{_L}lidoRecID"
_DESCRIPTIVE = f"{_L}descriptiveMetadata"
# ElementPath strings in Clark notation: compiled once by lxml and cached.
_APPELLATIONS = (
    f"{_DESCRIPTIVE}/{_L}objectIdentificationWrap/{_L}titleWrap/{_L}titleSet/{_L}appellationValue"
)
_WORK_TYPE_TERMS = (
    f"{_DESCRIPTIVE}/{_L}objectClassificationWrap/{_L}objectWorkTypeWrap/{_L}objectWorkType/{_L}term"
)
_PREF_ATTRS = (f"{_L}pref", "pref")


class LidoFormat:
    """Requires record id, descriptive metadata, a title and an object/work type."""

    prefix = "lido"
    namespace: str | None = LIDO_NS

    def validate(self, element: etree._Element) -> str | None:
        if element.tag != _ROOT:
            return f"lido payload root is {describe_tag(element)}, expected <{_ROOT}>"
        if first_text(element.iterchildren(_REC_ID)) is None:
            return "lido payload has no non-empty lido:lidoRecID"
        if element.find(_DESCRIPTIVE) is None:
            return "lido payload has no lido:descriptiveMetadata"
        if self.extract_title(element) is None:
            return (
                "lido payload has no non-empty title (descriptiveMetadata/objectIdentificationWrap"
                "/titleWrap/titleSet/appellationValue)"
            )
        if first_text(element.iterfind(_WORK_TYPE_TERMS)) is None:
            return (
                "lido payload has no objectWorkType term (descriptiveMetadata/"
                "objectClassificationWrap/objectWorkTypeWrap/objectWorkType/term)"
            )
        return None

    def extract_title(self, element: etree._Element) -> str | None:
        """The first preferred appellation if any is marked, else the first non-empty one."""
        fallback: str | None = None
        for value in element.iterfind(_APPELLATIONS):
            text = text_of(value)
            if not text:
                continue
            if any(value.get(attr) == "preferred" for attr in _PREF_ATTRS):
                return text
            if fallback is None:
                fallback = text
        return fallback


LIDO = LidoFormat()
