"""OAI-PMH 2.0 responses turned into the harvest contract (records.py).

Protocol facts live here: the envelope, ``<error>`` codes, headers, tokens and
datestamps. Elements are found by Clark name, so the OAI namespace may be the default
or prefixed and comments, PIs and whitespace may sit anywhere. A bad record never
aborts its page: it becomes ``Rejected`` with the reason and its raw XML (I8).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Generic, TypeVar

from lxml import etree

from partner_harvest.formats import MetadataFormat, get_format
from partner_harvest.formats.base import checked_by
from partner_harvest.formats.checks import DEFAULT_POLICY, Policy
from partner_harvest.oai.errors import (
    NoRecordsMatch,
    OaiResponseError,
    protocol_error,
)
from partner_harvest.records import HarvestItem, Record, Rejected, Tombstone
from partner_harvest.xmlsafe import parse_document

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
DAY_GRANULARITY = "YYYY-MM-DD"
SECOND_GRANULARITY = "YYYY-MM-DDThh:mm:ssZ"
GRANULARITIES = (DAY_GRANULARITY, SECOND_GRANULARITY)
DELETED_RECORD_POLICIES = ("no", "persistent", "transient")
MISSING_IDENTIFIER = "(missing identifier)"

_O = f"{{{OAI_NS}}}"
_ROOT = f"{_O}OAI-PMH"
_RESPONSE_DATE = f"{_O}responseDate"
_ERROR = f"{_O}error"
_RECORD = f"{_O}record"
_HEADER = f"{_O}header"
_IDENTIFIER = f"{_O}identifier"
_DATESTAMP = f"{_O}datestamp"
_SET_SPEC = f"{_O}setSpec"
_METADATA = f"{_O}metadata"
_TOKEN = f"{_O}resumptionToken"
_ABSENT: str = "\x00absent"  # no such child (distinct from an empty one, which reads as None)
_VERBS = ("Identify", "ListMetadataFormats", "ListSets", "ListIdentifiers", "ListRecords", "GetRecord")

# A resumptionToken element as raw bytes: any namespace prefix, any attributes, empty or
# self-closing. Only plain character data is read (a CDATA section is not guessed at).
_TOKEN_MARKUP = re.compile(
    rb"<(?:[A-Za-z_][\w.-]*:)?resumptionToken(?:\s[^>]*)?(?:/>|>([^<]*)</(?:[A-Za-z_][\w.-]*:)?resumptionToken\s*>)"
)
_TOKEN_TAIL = 65_536  # the token closes the list element: it sits in the page's last bytes

_DATESTAMP_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:T(\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?\s*(Z|z|[+-]\d{2}(?::?\d{2})?)?)?"
)


# -- datestamps --------------------------------------------------------------------------


def parse_datestamp(text: str) -> datetime:
    """An OAI datestamp as an aware UTC datetime.

    Tolerates what real servers send besides the two spec forms: fractional seconds
    (DSpace writes ``.485Z``), explicit offsets, a missing ``Z`` (read as UTC, which
    the protocol mandates). Raises ValueError on anything else.
    """
    if (len(text) == 20 and text[19] == "Z" and text[10] == "T" and text[4] == "-" and text[7] == "-"
            and text[13] == ":" and text[16] == ":" and text.isascii()):
        try:  # the spec's own second form, by far the commonest: the fast C parser
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # e.g. hour 24: the general path below words the error
    match = _DATESTAMP_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an OAI-PMH datestamp: {text!r}")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    try:
        value = datetime(
            int(year), int(month), int(day),
            int(hour or 0), int(minute or 0), int(second or 0), micro,
            tzinfo=timezone.utc,
        )
    except ValueError as exc:
        raise ValueError(f"not an OAI-PMH datestamp: {text!r} ({exc})") from None
    if zone and zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
        value -= sign * offset
    return value


def format_datestamp(value: datetime, granularity: str) -> str:
    """Write ``value`` at the repository's granularity (day-only servers reject times).

    Refuses naive datetimes: a local time written as UTC shifts the window and skips records.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"refusing a naive datetime for an OAI datestamp: {value!r}")
    value = value.astimezone(timezone.utc)
    if granularity == DAY_GRANULARITY:
        return value.strftime("%Y-%m-%d")
    if granularity == SECOND_GRANULARITY:
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise ValueError(f"unknown OAI-PMH granularity: {granularity!r}")


# -- result shapes -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identify:
    """What the repository says about itself; ``response_date`` is its clock."""

    repository_name: str
    base_url: str
    protocol_version: str
    granularity: str
    deleted_record: str
    earliest_datestamp: datetime | None
    response_date: datetime


@dataclass(frozen=True, slots=True)
class MetadataFormatInfo:
    prefix: str
    schema: str | None
    namespace: str | None


@dataclass(frozen=True, slots=True)
class OaiSet:
    spec: str
    name: str | None


@dataclass(frozen=True, slots=True)
class OaiHeader:
    """A header as delivered; missing parts are None so the caller decides what to do."""

    identifier: str | None
    datestamp_text: str | None
    deleted: bool = False
    set_specs: tuple[str, ...] = ()

    @property
    def datestamp(self) -> datetime | None:
        """The parsed datestamp, or None when missing or unparseable."""
        if self.datestamp_text is None:
            return None
        try:
            return parse_datestamp(self.datestamp_text)
        except ValueError:
            return None


ListItem = HarvestItem | OaiHeader | OaiSet
ItemT = TypeVar("ItemT", bound=ListItem)


@dataclass(slots=True)
class ListPage(Generic[ItemT]):
    """One page of a list verb, its items of the verb's one kind (records, tombstones and
    rejects; headers; sets). ``token`` is None on the last page (absent or empty)."""

    response_date: datetime | None = None
    items: list[ItemT] = field(default_factory=list)
    token: str | None = None
    complete_list_size: int | None = None
    cursor: int | None = None
    expiration_date: str | None = None
    cleaned: bool = False


# -- public parsers ----------------------------------------------------------------------


def parse_identify(content: bytes) -> Identify:
    """Parse an Identify response; a bad earliestDatestamp degrades to None."""
    root, _, _ = _open(content)
    verb = _verb_element(root, "Identify")
    response_date = _response_date(root)
    if response_date is None:
        raise OaiResponseError("Identify response has no valid <responseDate>")
    granularity = _text(verb.find(f"{_O}granularity"))
    deleted = (_text(verb.find(f"{_O}deletedRecord")) or "").lower()
    return Identify(
        repository_name=_text(verb.find(f"{_O}repositoryName")) or "",
        base_url=_text(verb.find(f"{_O}baseURL")) or "",
        protocol_version=_text(verb.find(f"{_O}protocolVersion")) or "",
        # Day granularity is the one every repository must accept, so it is the safe default.
        granularity=granularity if granularity in GRANULARITIES else DAY_GRANULARITY,
        # Unknown policy: do not trust tombstones to be complete.
        deleted_record=deleted if deleted in DELETED_RECORD_POLICIES else "no",
        earliest_datestamp=_optional_datestamp(_text(verb.find(f"{_O}earliestDatestamp"))),
        response_date=response_date,
    )


def parse_metadata_formats(content: bytes) -> list[MetadataFormatInfo]:
    """Parse ListMetadataFormats; entries without a prefix are dropped."""
    root, _, _ = _open(content)
    verb = _verb_element(root, "ListMetadataFormats")
    formats = []
    for fmt in verb.iterchildren(f"{_O}metadataFormat"):
        prefix = _text(fmt.find(f"{_O}metadataPrefix"))
        if prefix:
            formats.append(
                MetadataFormatInfo(
                    prefix=prefix,
                    schema=_text(fmt.find(f"{_O}schema")),
                    namespace=_text(fmt.find(f"{_O}metadataNamespace")),
                )
            )
    return formats


def parse_list_sets(content: bytes) -> ListPage[OaiSet]:
    """Parse ListSets into a page of OaiSet items (same token rules as the other lists)."""
    root, cleaned, _ = _open(content)
    verb = _verb_element(root, "ListSets")
    page: ListPage[OaiSet] = _page(root, verb, cleaned)
    for node in verb.iterchildren(f"{_O}set"):
        spec = _text(node.find(f"{_O}setSpec"))
        if spec:
            page.items.append(OaiSet(spec, _text(node.find(f"{_O}setName"))))
    return page


def parse_list_identifiers(content: bytes) -> ListPage[OaiHeader]:
    """Parse ListIdentifiers into OaiHeader items; noRecordsMatch is an empty page."""
    page, element = _list_page(content, "ListIdentifiers")
    if element is not None:
        page.items.extend(_header(node) for node in element.iterchildren(_HEADER))
    return page


def parse_list_records(content: bytes, metadata_prefix: str,
                       policy: Policy = DEFAULT_POLICY) -> ListPage[HarvestItem]:
    """Parse ListRecords into Record / Tombstone / Rejected (validated under the partner's
    ``policy``); noRecordsMatch is an empty page."""
    page, element = _list_page(content, "ListRecords")
    if element is not None:
        fmt = get_format(metadata_prefix)
        page.items.extend(_record_item(node, metadata_prefix, fmt, policy) for node in element.iterchildren(_RECORD))
    return page


def parse_list_page(content: bytes, verb: str, metadata_prefix: str | None = None,
                    policy: Policy = DEFAULT_POLICY) -> ListPage[Any]:
    """A ListRecords or ListIdentifiers page, as `verb` says: its items are the verb's kind."""
    if verb == "ListRecords":
        return parse_list_records(content, metadata_prefix or "", policy)
    return parse_list_identifiers(content)


def _list_page(content: bytes, verb: str) -> tuple[ListPage[Any], etree._Element | None]:
    """A list page's envelope and token, and the verb's element (None: noRecordsMatch)."""
    root, cleaned, empty = _open(content, no_records_ok=True)
    if empty:
        return ListPage(response_date=_response_date(root), cleaned=cleaned), None
    element = _verb_element(root, verb)
    return _page(root, element, cleaned), element


def parse_get_record(content: bytes, metadata_prefix: str, policy: Policy = DEFAULT_POLICY) -> HarvestItem:
    """Parse GetRecord into a single Record, Tombstone or Rejected."""
    root, _, _ = _open(content)
    verb = _verb_element(root, "GetRecord")
    node = verb.find(_RECORD)
    if node is None:
        raise OaiResponseError("<GetRecord> holds no <record>")
    return _record_item(node, metadata_prefix, get_format(metadata_prefix), policy)


def guess_token(content: bytes) -> str | None:
    """The page's resumptionToken read off its raw bytes, before the page is parsed; None
    when there is none or the markup is unusual enough that a guess could mislead.

    Only a guess: it lets a pipelined chain ask for the next page while this one is parsed
    (oai/client.py), and the caller compares it with the parsed token. The document is
    not trusted here: nothing is resolved, entities are read as text. A guess is offered
    only when the page holds exactly one resumptionToken element in its markup (a second
    one, say in a comment, makes it ambiguous; the ``<request>`` echo's attribute of that
    name does not count), and never for CDATA or for encodings that are not
    ASCII-compatible (the name is then not found).
    """
    if _markup_mentions(content) != 2:  # one start tag and one end tag, nothing else
        return None
    matches = list(_TOKEN_MARKUP.finditer(content, max(0, len(content) - _TOKEN_TAIL)))
    raw = matches[0].group(1) if len(matches) == 1 else None
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = html.unescape(text).strip() if "&" in text else text.strip()
    return text or None


def _markup_mentions(content: bytes) -> int:
    """How often ``resumptionToken`` is a tag name (after ``<``, ``</`` or a prefix's ``:``),
    not an attribute or words in a record."""
    count = 0
    at = content.find(b"resumptionToken")
    while at != -1:
        if at and content[at - 1] in b"</:":
            count += 1
        at = content.find(b"resumptionToken", at + 15)
    return count


def error_codes(content: bytes) -> tuple[str, ...]:
    """The ``<error>`` codes of an OAI-PMH error response, () for anything else (never raises).

    Real servers send OAI error bodies under non-200 statuses (noRecordsMatch with 422,
    badResumptionToken with 400): the client reads such a body as the error it carries.
    """
    if b"error" not in content:
        return ()
    try:
        root = parse_document(content).root
    except Exception:  # not XML, hostile or over a limit: not an OAI error body either
        return ()
    if root.tag != _ROOT:
        return ()
    return tuple((node.get("code") or "").strip() for node in root.findall(_ERROR))


def response_verb(root: etree._Element) -> str | None:
    """The verb whose element the response carries, or None (an error or not OAI-PMH)."""
    for verb in _VERBS:
        if root.find(f"{_O}{verb}") is not None:
            return verb
    return None


# -- envelope ----------------------------------------------------------------------------


def _open(content: bytes, *, no_records_ok: bool = False) -> tuple[etree._Element, bool, bool]:
    """Parse safely, check the envelope and raise any ``<error>``.

    Returns (root, cleaned, empty); ``empty`` is True only for a noRecordsMatch the
    caller asked to treat as an empty list.
    """
    parsed = parse_document(content)
    root = parsed.root
    if root.tag != _ROOT:
        raise OaiResponseError(
            f"not an OAI-PMH response: root element is <{root.tag!s}>, expected <{_ROOT}>"
        )
    errors = root.findall(_ERROR)
    if not errors:
        return root, parsed.cleaned, False
    pairs = [(node.get("code"), _text(node) or "") for node in errors]
    real = [pair for pair in pairs if pair[0] != NoRecordsMatch.CODE]
    if not real and no_records_ok:
        return root, parsed.cleaned, True
    first = (real or pairs)[0]
    others = [pair for pair in pairs if pair is not first]
    raise protocol_error(first[0], first[1], (first, *others))


def _verb_element(root: etree._Element, verb: str) -> etree._Element:
    node = root.find(f"{_O}{verb}")
    if node is None:
        found = response_verb(root)
        children = ", ".join(
            f"<{etree.QName(child).localname}>" for child in root.iterchildren(etree.Element)
        )
        detail = f"it answers {found}" if found else f"its children are {children or 'none'}"
        raise OaiResponseError(f"OAI-PMH response has no <{verb}> element and no <error>; {detail}")
    return node


def _response_date(root: etree._Element) -> datetime | None:
    return _optional_datestamp(_text(root.find(_RESPONSE_DATE)))


def _page(root: etree._Element, verb: etree._Element, cleaned: bool) -> ListPage[Any]:
    page: ListPage[Any] = ListPage(response_date=_response_date(root), cleaned=cleaned)
    token = verb.find(_TOKEN)
    if token is not None:
        page.token = _text(token)
        page.complete_list_size = _optional_int(token.get("completeListSize"))
        page.cursor = _optional_int(token.get("cursor"))
        page.expiration_date = (token.get("expirationDate") or "").strip() or None
    return page


# -- records -----------------------------------------------------------------------------


def _header(node: etree._Element) -> OaiHeader:
    """The header's parts (the first identifier and datestamp count; set specs
    deduplicated in order)."""
    identifier, datestamp, specs = _header_parts(node)
    return OaiHeader(identifier=identifier, datestamp_text=datestamp, deleted=_is_deleted(node), set_specs=specs)


def _header_parts(node: etree._Element) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(identifier, datestamp text, set specs) in one pass over the header's children; no
    OaiHeader is built on the harvest's hot path."""
    identifier: str | None = _ABSENT
    datestamp: str | None = _ABSENT
    specs: list[str] = []
    for child in node:  # every child, comments too: a tag filter costs more than comparing tags
        tag = child.tag
        if tag == _SET_SPEC:
            spec = _text(child)
            if spec:
                specs.append(spec)
        elif tag == _IDENTIFIER:
            if identifier is _ABSENT:
                identifier = _text(child)
        elif tag == _DATESTAMP and datestamp is _ABSENT:
            datestamp = _text(child)
    return (
        None if identifier is _ABSENT else identifier,
        None if datestamp is _ABSENT else datestamp,
        tuple(dict.fromkeys(specs)) if len(specs) > 1 else tuple(specs),
    )


def _is_deleted(header: etree._Element) -> bool:
    status = header.get("status")
    return status is not None and status.strip() == "deleted"


def _record_item(node: etree._Element, prefix: str, fmt: MetadataFormat, policy: Policy = DEFAULT_POLICY) -> HarvestItem:
    header_node = metadata = None
    for child in node:  # the first of each counts
        tag = child.tag
        if tag == _HEADER:
            if header_node is None:
                header_node = child
        elif tag == _METADATA and metadata is None:
            metadata = child
    if header_node is None:
        return _reject(node, None, "record has no <header>", None, prefix)
    identifier, datestamp_text, set_specs = _header_parts(header_node)
    deleted = _is_deleted(header_node)
    datestamp = _optional_datestamp(datestamp_text)
    if identifier is None or datestamp is None:
        problems = []
        if identifier is None:
            problems.append("no <identifier>")
        if datestamp_text is None:
            problems.append("no <datestamp>")
        elif datestamp is None:
            problems.append(f"unparseable <datestamp> {datestamp_text!r}")
        kind = "deleted header" if deleted else "header"
        return _reject(node, identifier, f"{kind}: {'; '.join(problems)}", datestamp, prefix)
    if deleted:
        return Tombstone(identifier, datestamp)

    if metadata is None:
        return _reject(node, identifier, "live record has no <metadata>", datestamp, prefix)
    payloads = list(metadata.iterchildren(etree.Element))
    if len(payloads) != 1:
        return _reject(
            node, identifier,
            f"<metadata> must hold exactly one payload element, found {len(payloads)}",
            datestamp, prefix,
        )
    payload = payloads[0]
    try:
        checked = checked_by(fmt, payload)
        rejected, warnings = policy.judge(checked.findings)
        reason = rejected.message if rejected else None
        if reason is None and checked.repair is not None:
            checked.repair()  # e.g. a rebuilt MARC leader; a reject keeps its bytes as delivered
    except Exception as exc:  # a format bug must not take the page down (I8)
        reason = f"{fmt.prefix} validation crashed: {type(exc).__name__}: {exc}"
    if reason is not None:
        return _reject(node, identifier, reason, datestamp, prefix)
    return Record(
        identifier=identifier,
        datestamp=datestamp,
        metadata_prefix=prefix,
        metadata=etree.tostring(payload, encoding="unicode", with_tail=False),
        set_specs=set_specs,
        title=checked.title,
        warnings=warnings,
    )


def _reject(
    node: etree._Element,
    identifier: str | None,
    reason: str,
    datestamp: datetime | None,
    prefix: str,
) -> Rejected:
    return Rejected(
        identifier=identifier or MISSING_IDENTIFIER,
        reason=reason,
        raw=etree.tostring(node, encoding="unicode", with_tail=False),
        datestamp=datestamp,
        metadata_prefix=prefix,
    )


# -- small readers -----------------------------------------------------------------------


def _text(node: etree._Element | None) -> str | None:
    """Stripped text of an element (children's text included), None when empty/absent."""
    if node is None:
        return None
    text = node.text if len(node) == 0 else "".join(node.itertext())
    text = (text or "").strip()
    return text or None


def _optional_int(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def _optional_datestamp(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_datestamp(text)
    except ValueError:
        return None
