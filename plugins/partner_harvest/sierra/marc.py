"""Turning Sierra MARC (ISO 2709 from the export, MARC-in-JSON from the API) into Records.

Every bib lands as MARCXML (prefix ``marc21``) and is judged by the same checks as an
OAI-PMH ``marcxml`` payload (formats/checks.py): what the partner's policy rejects goes to
quarantine with its reason, what it only warns about lands with its warnings.

Character sets: leader/09 "a" is UTF-8 and is decoded strictly; blank is MARC-8 and is
converted with pymarc's MARC-8 decoder (leader/09 then says "a", as the text now is).
Nothing is stored with replacement characters: an undecodable record is quarantined
with its raw bytes escaped.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pymarc
from lxml import etree

from partner_harvest.formats.checks import DEFAULT_POLICY, Finding, Policy
from partner_harvest.formats.marc21 import LEADER_LENGTH, MARC21, NO_001, NO_TITLE, leader_finding, rebuild_leader, title_of_245
from partner_harvest.records import Record, Rejected

PREFIX = "marc21"
MARC_NS = "http://www.loc.gov/MARC21/slim"
EXPORT_ONLY_TAGS = frozenset({"907", "945", "998"})  # Sierra-internal and item fields
_TAG_RECORD, _TAG_LEADER = f"{{{MARC_NS}}}record", f"{{{MARC_NS}}}leader"
_TAG_CONTROL, _TAG_DATA, _TAG_SUB = f"{{{MARC_NS}}}controlfield", f"{{{MARC_NS}}}datafield", f"{{{MARC_NS}}}subfield"
_ID_IN_907 = re.compile(r"^\.?b(\d+)[\dx]$", re.IGNORECASE)  # .b1000001x: number + check digit


def bib_id_of(record: pymarc.Record) -> str | None:
    """Sierra's bib id: 907 $a ``.b1000001x`` in exports, else the digits of 001."""
    for field in record.get_fields("907"):
        for value in field.get_subfields("a"):
            match = _ID_IN_907.match(value.strip())
            if match:
                return match.group(1)
    control = record.get("001")  # pymarc 5: record["001"] raises KeyError when absent
    if control is not None and control.data:
        digits = re.sub(r"\D", "", control.data)
        return digits or None
    return None


def stamp_of(record: pymarc.Record) -> datetime | None:
    """The 005 "date and time of latest transaction", when the record carries one."""
    field = record.get("005")
    if field is None or not field.data:
        return None
    try:
        return datetime.strptime(field.data[:14], "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def to_item(record: pymarc.Record, bib_id: str, datestamp: datetime,
            policy: Policy = DEFAULT_POLICY) -> Record | Rejected:
    """Check the bib and serialise it as MARCXML: a Record (with its warnings) or a Rejected,
    as the partner's ``policy`` says."""
    try:
        element = marcxml_element(record)
    except (ValueError, TypeError) as exc:  # e.g. control characters lxml refuses
        return Rejected(bib_id, f"MARC: cannot serialise ({type(exc).__name__}: {exc})", str(record)[:200000], datestamp, PREFIX)
    text = etree.tostring(element, encoding="unicode")
    checked = MARC21.check(element)
    rebuilt = leader_finding(_leader_text(record))
    rejected, warnings = policy.judge((rebuilt, *checked.findings) if rebuilt else checked.findings)
    if rejected:
        return Rejected(bib_id, rejected.message, text, datestamp, PREFIX)
    return Record(bib_id, datestamp, PREFIX, text, (), checked.title, warnings)


def _leader_text(record: pymarc.Record) -> str:
    return str(record.leader or "")


def marcxml_element(record: pymarc.Record) -> etree._Element:
    """The bib as a MARCXML <record>, built with lxml (pymarc's writer is ~5x slower).

    Export-only fields (907, 945 items, 998) are dropped and the leader's computed
    positions (record length, base address) zeroed, so a bib reads the same whether it
    came from the export or from the API's ``marc`` field: a re-seen version is a no-op.
    A leader that is not 24 characters (Sierra's API serves empty ones) is rebuilt
    (formats/marc21.py); :func:`to_item` says so with a ``marc.leader_rebuilt`` warning.
    """
    root = etree.Element(_TAG_RECORD, nsmap={None: MARC_NS})
    leader = _leader_text(record)
    if len(leader) == LEADER_LENGTH:
        leader = "00000" + leader[5:12] + "00000" + leader[17:]
    else:
        leader = rebuild_leader(leader)
    etree.SubElement(root, _TAG_LEADER).text = leader
    for field in record.fields:
        if field.tag in EXPORT_ONLY_TAGS:
            continue
        if field.is_control_field():
            node = etree.SubElement(root, _TAG_CONTROL, tag=field.tag)
            node.text = field.data
            continue
        node = etree.SubElement(root, _TAG_DATA, tag=field.tag, ind1=field.indicator1 or " ", ind2=field.indicator2 or " ")
        for subfield in field.subfields:
            etree.SubElement(node, _TAG_SUB, code=subfield.code).text = subfield.value
    return root


# -- the UTF-8 fast path ---------------------------------------------------------------
#
# pymarc builds a Field object per field and a Subfield per value; lxml then builds an
# element per node: together ~85% of a full load's CPU. A UTF-8 record (leader/09 "a")
# whose bytes are plain (strict UTF-8, no control characters, simple tags, indicators
# and codes) is decoded straight from its directory into the same MARCXML text. Anything
# else returns None and takes the pymarc path, which says why a record is bad: the fast
# path never judges, so quarantine reasons and MARC-8 conversion stay pymarc's.

_PLAIN_ATTR = re.compile(r"[0-9A-Za-z ]+")
_PLAIN_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
# pymarc/lxml decide records with U+0000-U+001F or U+FFFD-U+FFFF; written as the complement of
# what is plain, which the regex engine scans about twice as fast as the three-item class
_NEEDS_CARE = re.compile("[^\x20-\ufffc\U00010000-\U0010ffff]")
_DIRECTORY = re.compile(r"(?:[0-9A-Za-z ]{3}[0-9]{9})*")  # entries: a plain tag, length and offset digits
_ENTRY = re.compile(r"([0-9A-Za-z ]{3})([0-9]{4})([0-9]{5})")
_ODD_CODE = re.compile("\x1f[^\x1f0-9A-Za-z ]")  # a subfield whose code pymarc/lxml must judge
_XML_HEAD = f'<record xmlns="{MARC_NS}"><leader>'


@dataclass(frozen=True, slots=True)
class FastBib:
    """A UTF-8 export record decoded without pymarc: what the harvest needs of it."""

    bib_id: str | None  # as bib_id_of
    stamp: datetime | None  # as stamp_of
    xml: str  # as etree.tostring(marcxml_element(record))
    findings: tuple[Finding, ...]  # as the marc21 format's check() of that MARCXML
    title: str | None  # as its extract_title()

    @property
    def problem(self) -> str | None:
        """The reason the bib is rejected under the default policy (the marc21 format's validate())."""
        rejected, _ = DEFAULT_POLICY.judge(self.findings)
        return rejected.message if rejected else None


def _text(value: str) -> str:
    if "&" in value:
        value = value.replace("&", "&amp;")
    if "<" in value:
        value = value.replace("<", "&lt;")
    if ">" in value:
        value = value.replace(">", "&gt;")
    return value


def decode_fast(raw: bytes) -> FastBib | None:
    """The bib of a plain UTF-8 ISO 2709 record, or None: then :func:`decode_record` decides."""
    try:
        return _decode_fast(raw)
    except (ValueError, IndexError):  # UnicodeDecodeError included
        return None


def _decode_fast(raw: bytes) -> FastBib | None:
    if len(raw) < 25 or raw[9] != 0x61:  # leader/09 "a"
        return None
    leader = raw[:24].decode("ascii")
    base_text = leader[12:17]
    if not base_text.isdigit() or not leader[:5].isdigit():
        return None
    base = int(base_text)
    if base <= 24 or base >= len(raw) or len(raw) < int(leader[:5]):
        return None
    directory = raw[24:base - 1].decode("ascii")
    if len(directory) % 12 or not _DIRECTORY.fullmatch(directory):
        return None
    parts = [_XML_HEAD, "00000", leader[5:12], "00000", leader[17:], "</leader>"]
    id_907: str | None = None
    control_001: str | None = None
    stamp_005: str | None = None
    seen_001 = seen_005 = has_001 = seen_245 = False
    title: str | None = None
    plain = _PLAIN_CHARS
    odd_code = _ODD_CODE.search
    for tag, length, offset in _ENTRY.findall(directory):
        begin = base + int(offset)
        # Whole-field decoding equals pymarc's per-value decoding: 0x1F never occurs inside
        # a UTF-8 sequence, so the values of a valid field are valid and the same.
        text = raw[begin:begin + int(length) - 1].decode("utf-8")
        if tag < "010" and tag.isdigit():
            if tag == "001" and not seen_001:
                seen_001, control_001 = True, text
            elif tag == "005" and not seen_005:
                seen_005, stamp_005 = True, text
            if tag == "001" and text.strip():
                has_001 = True
            parts += ('<controlfield tag="', tag, '">', _text(text), "</controlfield>")
            continue
        if tag in EXPORT_ONLY_TAGS:  # dropped, but pymarc reads them: odd ones are its call
            if not text.isascii() or (text.find("\x1f") if "\x1f" in text else len(text)) != 2:
                return None
            if tag == "907" and id_907 is None:
                id_907 = _id_in_907(text)
            continue
        if tag == "245" and not seen_245:
            seen_245, title = True, _title_245(text)
        if "&" in text or "<" in text or ">" in text:
            text = _text(text)
        indicators, _, subfields = text.partition("\x1f")
        if len(indicators) != 2 or indicators[0] not in plain or indicators[1] not in plain or odd_code(text, 2):
            return None
        parts += ('<datafield tag="', tag, '" ind1="', indicators[0], '" ind2="', indicators[1], '"')
        # every non-empty value starts with a plain code (checked above); empty ones are skipped
        body = "".join(['<subfield code="' + value[0] + '">' + value[1:] + "</subfield>"
                        for value in subfields.split("\x1f") if value])
        parts += (">", body, "</datafield>") if body else ("/>",)
    parts.append("</record>")
    xml = "".join(parts)
    if _NEEDS_CARE.search(xml):
        return None
    bib_id = id_907
    if bib_id is None and control_001:
        bib_id = re.sub(r"\D", "", control_001) or None
    # The marc21 format's checks (formats/marc21.py), on the values instead of a reparse;
    # tests/unit/test_sierra_marc_fast.py holds both to the same answers. An ISO 2709 leader
    # is always 24 characters (its digits were checked above): it is never rebuilt here.
    findings = (() if has_001 else (NO_001,)) + (() if title is not None else (NO_TITLE,))
    return FastBib(bib_id, _stamp(stamp_005), xml, findings, title)


def _title_245(text: str) -> str | None:
    """The marc21 format's title of a 245 field's text (formats/marc21.title_of_245)."""
    return title_of_245([(value[:1], value[1:]) for value in text.split("\x1f")[1:]])


def _id_in_907(text: str) -> str | None:
    """bib_id_of's 907 $a rule on one (ASCII) field's text."""
    for value in text.split("\x1f")[1:]:
        if value[:1] == "a":
            match = _ID_IN_907.match(value[1:].strip())
            if match:
                return match.group(1)
    return None


def _stamp(text: str | None) -> datetime | None:
    """As :func:`stamp_of` on the 005 text, without strptime when it is 14 plain digits."""
    if not text:
        return None
    head = text[:14]
    if len(head) == 14 and head.isascii() and head.isdigit():
        try:
            return datetime(int(head[:4]), int(head[4:6]), int(head[6:8]), int(head[8:10]),
                            int(head[10:12]), int(head[12:14]), tzinfo=timezone.utc)
        except ValueError:
            pass
    try:
        return datetime.strptime(head, "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def fast_item(bib: FastBib, bib_id: str, datestamp: datetime, policy: Policy = DEFAULT_POLICY) -> Record | Rejected:
    """:func:`to_item` of a bib the fast path decoded (same payload, same verdict, same warnings)."""
    rejected, warnings = policy.judge(bib.findings)
    if rejected:
        return Rejected(bib_id, rejected.message, bib.xml, datestamp, PREFIX)
    return Record(bib_id, datestamp, PREFIX, bib.xml, (), bib.title, warnings)


def split_iso2709(data: bytes) -> Iterator[tuple[bytes, str | None]]:
    """Each record's raw bytes by its declared length; an unreadable tail yields (tail, why)."""
    position = 0
    while position < len(data):
        if len(data) - position < 5 or not data[position:position + 5].isdigit():
            yield data[position:], "MARC: unreadable record length"
            return
        length = int(data[position:position + 5])
        yield data[position:position + length], None
        position += max(length, 1)


def decode_record(raw: bytes) -> tuple[pymarc.Record | None, str | None]:
    """One ISO 2709 record in its declared character set, or (None, why)."""
    coding = chr(raw[9]) if len(raw) > 9 else ""
    if coding not in ("a", " "):
        return None, f"MARC: unknown character coding scheme {coding!r} in leader/09"
    complaints = io.StringIO()
    try:
        # pymarc's MARC-8 decoder turns a byte it cannot map into a space and only says so
        # on stderr: listen there (harvest tasks are single-threaded), so a damaged record is
        # quarantined instead of stored with a silent blank.
        with contextlib.redirect_stderr(complaints):
            record = pymarc.Record(raw, to_unicode=True, force_utf8=False, utf8_handling="strict",
                                   hide_utf8_warnings=coding == "a")
    except UnicodeDecodeError as exc:
        charset = "UTF-8 (leader/09 'a')" if coding == "a" else "MARC-8 (leader/09 blank)"
        return None, f"MARC: invalid {charset} at byte {exc.start} of a field: {exc.reason}"
    except Exception as exc:
        return None, f"MARC: unreadable record ({type(exc).__name__}: {exc})"
    if complaints.getvalue().strip():
        first = complaints.getvalue().strip().splitlines()[0]
        return None, f"MARC: invalid MARC-8 (leader/09 blank): {first}"
    if any("\ufffd" in value for value in _texts(record)):
        return None, "MARC: undecodable characters (U+FFFD) after character set conversion"
    if coding == " ":
        record.leader = pymarc.Leader(str(record.leader)[:9] + "a" + str(record.leader)[10:])
    return record, None


def _texts(record: pymarc.Record) -> Iterator[str]:
    for field in record.fields:
        if field.is_control_field():
            yield field.data or ""
        else:
            for subfield in field.subfields:
                yield subfield.value


def escape_raw(raw: bytes) -> str:
    """Raw bytes as storable text: valid UTF-8 stays readable, anything else shows as \\xNN."""
    return raw.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")[:200000]


def from_marc_json(data: dict[str, Any] | str) -> pymarc.Record:
    """A MARC-in-JSON object (the ``marc`` field of a bib, or ``bibs/{id}/marc``).

    pymarc refuses a leader that is not 24 characters, and Sierra serves empty ones: such a
    record is read with a stand-in and keeps its leader as delivered (a plain string, ``""``
    when absent), for :func:`marcxml_element` to rebuild and :func:`to_item` to warn about.
    """
    obj = json.loads(data) if isinstance(data, str) else data
    delivered: str | None = None
    if isinstance(obj, dict):
        leader = obj.get("leader")
        if not isinstance(leader, str) or len(leader) != LEADER_LENGTH:
            delivered = "" if leader is None else str(leader)
            obj = {**obj, "leader": rebuild_leader(delivered)}
    records = list(pymarc.JSONReader(json.dumps(obj)))
    if len(records) != 1:
        raise ValueError(f"expected one MARC-in-JSON record, got {len(records)}")
    record = records[0]
    if delivered is not None:
        record.leader = delivered  # type: ignore[assignment]  # rebuilt when serialised
    return record
