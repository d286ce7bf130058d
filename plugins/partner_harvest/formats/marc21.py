"""MARC 21 as MARCXML (``marc21`` / ``marcxml``): one record, a leader, a 245 title.

Sierra bibs are converted to MARCXML before they land, so OAI-PMH ``marcxml`` payloads and
Sierra records are judged by the same checks (formats/checks.py). A leader is 24
characters, blanks included (MARCXML's schema preserves its whitespace); one that is
missing or of another length is rebuilt, with a warning. The 001 is not needed: the
protocol identifies the record.
"""

from __future__ import annotations

from collections.abc import Callable

from lxml import etree

from partner_harvest.formats.base import default_verdict, normalise_space
from partner_harvest.formats.checks import Checked, Finding

MARC_NS = "http://www.loc.gov/MARC21/slim"
_RECORD = f"{{{MARC_NS}}}record"
_LEADER = f"{{{MARC_NS}}}leader"
_CONTROL = f"{{{MARC_NS}}}controlfield"
_DATA = f"{{{MARC_NS}}}datafield"
_SUB = f"{{{MARC_NS}}}subfield"

LEADER_LENGTH = 24
# What a rebuilt leader holds where the delivered one has nothing plausible: a new ("n")
# monograph ("m") of language material ("a") in UCS ("a", MARCXML is Unicode), encoding
# level and cataloguing form unknown ("u"). Record length and base address (00-04, 12-16) are
# zeros, as for every Sierra bib: they describe ISO 2709 bytes, not the record.
DEFAULT_LEADER = "00000nam a2200000uu 4500"
_FIXED = {**{i: "0" for i in (*range(5), *range(12, 17))}, 10: "2", 11: "2", 20: "4", 21: "5", 22: "0", 23: "0"}
TITLE_CODES = ("a", "b")
FALLBACK_TITLE_CODES = ("k", "n", "p", "f")  # archival and part titles, when 245 has no $a/$b text


def rebuild_leader(text: str) -> str:
    """A valid 24-character leader from a missing, empty, short or long one.

    The delivered positions are read from the start (a 24-character text with whitespace
    around it is taken as that text); each code position keeps its character when it is an
    ASCII letter, digit or blank, else takes the default's.
    """
    source = text.strip() if len(text.strip()) == LEADER_LENGTH else text
    chars = []
    for position, default in enumerate(DEFAULT_LEADER):
        if position in _FIXED:
            chars.append(_FIXED[position])
            continue
        given = source[position] if position < len(source) else ""
        chars.append(given if given and given.isascii() and (given.isalnum() or given == " ") else default)
    return "".join(chars)


def leader_finding(text: str | None) -> Finding | None:
    """The ``marc.leader_rebuilt`` finding for a leader text (None: the element is missing)."""
    if text is not None and len(text) == LEADER_LENGTH:
        return None
    shown = "missing" if text is None else "empty" if not text else f"{len(text)} characters"
    return Finding("marc.leader_rebuilt",
                   f"MARC: leader {shown} (24 characters expected): rebuilt as {rebuild_leader(text or '')!r}")


NO_001 = Finding("marc.no_001", "MARC: no control number (001)")
NO_TITLE = Finding("marc.no_title", "MARC: no title (245 $a)")


def title_of_245(values: list[tuple[str, str]]) -> str | None:
    """The title of a 245 field's (code, value) pairs: $a and $b, else $k $n $p $f; spaces
    normalised, end punctuation cut (ISBD's " /", " :" ...)."""
    for codes in (TITLE_CODES, FALLBACK_TITLE_CODES):
        parts = [normalise_space(value) for code, value in values if code in codes]
        title = normalise_space(" ".join(p for p in parts if p)).rstrip(" /:;,.")
        if title:
            return title
    return None


def _record(element: etree._Element) -> etree._Element | None:
    """The <record>, also when a partner wraps it in a one-record <collection>."""
    if element.tag == _RECORD:
        return element
    children = element.findall(_RECORD)
    return children[0] if len(children) == 1 else None


def _title(record: etree._Element) -> str | None:
    for field in record.iterchildren(_DATA):
        if field.get("tag") == "245":
            return title_of_245([(sf.get("code") or "", sf.text or "") for sf in field.iterchildren(_SUB)])
    return None


def _has_001(record: etree._Element) -> bool:
    return any(f.get("tag") == "001" and (f.text or "").strip() for f in record.iterchildren(_CONTROL))


class Marc21Format:
    prefix = "marc21"
    namespace = MARC_NS

    def check(self, element: etree._Element) -> Checked:
        record = _record(element)
        if record is None:
            return Checked((Finding("marc.not_a_record", f"MARCXML: expected one {{{MARC_NS}}}record, "
                                    f"got <{etree.QName(element).localname}>"),))
        findings: list[Finding] = []
        leader = record.find(_LEADER)
        rebuilt = leader_finding(None if leader is None else (leader.text or ""))
        repair = None
        if rebuilt is not None:
            findings.append(rebuilt)
            repair = _leader_repair(record, leader)
        if not _has_001(record):
            findings.append(NO_001)
        title = _title(record)
        if title is None:
            findings.append(NO_TITLE)
        return Checked(tuple(findings), title, repair)

    def validate(self, element: etree._Element) -> str | None:
        return default_verdict(self.check(element))

    def extract_title(self, element: etree._Element) -> str | None:
        record = _record(element)
        return _title(record) if record is not None else None


def _leader_repair(record: etree._Element, leader: etree._Element | None) -> Callable[[], None]:
    """Writes the rebuilt leader into the payload (a new first child when there was none)."""
    def repair() -> None:
        node = leader
        if node is None:
            node = etree.Element(_LEADER)
            node.tail, node.text = record.text, None
            record.insert(0, node)
        node.text = rebuild_leader(node.text or "")
    return repair


MARC21 = Marc21Format()
