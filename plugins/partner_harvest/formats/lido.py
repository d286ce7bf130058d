"""LIDO (museum objects): the minimum a record needs to be shown in the aggregation.

The LIDO schema requires a lidoRecID and an objectWorkType; the aggregation needs only a
title to show the record (identity is the OAI identifier), so their absence warns.
"""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import default_verdict, describe_tag, first_text, text_of
from partner_harvest.formats.checks import Checked, Finding

LIDO_NS = "http://www.lido-schema.org"
_L = f"{{{LIDO_NS}}}"
_ROOT = f"{_L}lido"
_WRAP = f"{_L}lidoWrap"
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
    """Reads one lido:lido (also inside a one-record lido:lidoWrap): its title, and what it lacks."""

    prefix = "lido"
    namespace: str | None = LIDO_NS

    def check(self, element: etree._Element) -> Checked:
        record = _record(element)
        if record is None:
            return Checked((Finding("lido.wrong_root", f"lido payload root is {describe_tag(element)}, "
                                    f"expected <{_ROOT}>"),))
        findings: list[Finding] = []
        if first_text(record.iterchildren(_REC_ID)) is None:
            findings.append(Finding("lido.no_rec_id", "lido payload has no non-empty lido:lidoRecID"))
        title = self.extract_title(record)
        if record.find(_DESCRIPTIVE) is None:
            findings.append(Finding("lido.no_title", "lido payload has no lido:descriptiveMetadata"))
        elif title is None:
            findings.append(Finding("lido.no_title", "lido payload has no non-empty title (descriptiveMetadata/"
                                    "objectIdentificationWrap/titleWrap/titleSet/appellationValue)"))
        if first_text(record.iterfind(_WORK_TYPE_TERMS)) is None:
            findings.append(Finding("lido.no_work_type", "lido payload has no objectWorkType term (descriptiveMetadata/"
                                    "objectClassificationWrap/objectWorkTypeWrap/objectWorkType/term)"))
        return Checked(tuple(findings), title)

    def validate(self, element: etree._Element) -> str | None:
        return default_verdict(self.check(element))

    def extract_title(self, element: etree._Element) -> str | None:
        """The first preferred appellation if any is marked, else the first non-empty one."""
        record = _record(element)
        if record is None:
            return None
        fallback: str | None = None
        for value in record.iterfind(_APPELLATIONS):
            text = text_of(value)
            if not text:
                continue
            if any(value.get(attr) == "preferred" for attr in _PREF_ATTRS):
                return text
            if fallback is None:
                fallback = text
        return fallback


def _record(element: etree._Element) -> etree._Element | None:
    """The lido:lido, also when a partner wraps it in a one-record lido:lidoWrap."""
    if element.tag == _ROOT:
        return element
    if element.tag == _WRAP:
        children = element.findall(_ROOT)
        return children[0] if len(children) == 1 else None
    return None


LIDO = LidoFormat()
