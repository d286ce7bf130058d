"""MARC 21 as MARCXML (``marc21`` / ``marcxml``): a leader, a control number, a 245 title.

Sierra bibs are converted to MARCXML before they land, so OAI-PMH ``marcxml`` payloads and
Sierra records are validated by the same rules.
"""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import normalise_space

MARC_NS = "http://www.loc.gov/MARC21/slim"
_RECORD = f"{{{MARC_NS}}}record"
_LEADER = f"{{{MARC_NS}}}leader"
_CONTROL = f"{{{MARC_NS}}}controlfield"
_DATA = f"{{{MARC_NS}}}datafield"
_SUB = f"{{{MARC_NS}}}subfield"


def _record(element: etree._Element) -> etree._Element | None:
    """The <record>, also when a partner wraps it in a one-record <collection>."""
    if element.tag == _RECORD:
        return element
    children = element.findall(_RECORD)
    return children[0] if len(children) == 1 else None


def _title(record: etree._Element) -> str | None:
    for field in record.iterchildren(_DATA):
        if field.get("tag") == "245":
            parts = [normalise_space(sf.text or "") for sf in field.iterchildren(_SUB) if sf.get("code") in ("a", "b")]
            title = normalise_space(" ".join(p for p in parts if p)).rstrip(" /:;,.")
            return title or None
    return None


class Marc21Format:
    prefix = "marc21"
    namespace = MARC_NS

    def validate(self, element: etree._Element) -> str | None:
        record = _record(element)
        if record is None:
            return f"MARCXML: expected one {{{MARC_NS}}}record, got <{etree.QName(element).localname}>"
        leader = record.find(_LEADER)
        if leader is None or len((leader.text or "").strip()) != 24:
            return "MARC: missing or malformed leader (24 characters expected)"
        control = [f for f in record.iterchildren(_CONTROL) if f.get("tag") == "001" and (f.text or "").strip()]
        if not control:
            return "MARC: no control number (001)"
        if _title(record) is None:
            return "MARC: no title (245 $a)"
        return None

    def extract_title(self, element: etree._Element) -> str | None:
        record = _record(element)
        return _title(record) if record is not None else None


MARC21 = Marc21Format()
