"""The one XML parser configuration every partner response goes through.

Partner bodies are untrusted: they may be hostile (entity expansion, XXE), not XML at all
(HTML error pages, empty 200s), truncated, or carry characters XML 1.0 forbids (real servers emit control characters).
Each case gets its own exception with a one-line cause so the harvest can name it (I9).
Nothing is parsed with ``recover=True``: a silently repaired page loses records.

Size is bounded too (I5, I9): libxml2's own limits stay on (``huge_tree=False``: at most
256 levels of nesting, 10 MB per text node or attribute value), and a page with more
elements and attributes than :class:`XmlLimits` allows is refused before a tree is built
(lxml has no such limit, and its tree costs about 125 bytes per node).
"""

from __future__ import annotations

import codecs
import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Any, cast

from lxml import etree

__all__ = [
    "HostileXmlError",
    "MalformedXmlError",
    "NotXmlError",
    "ParsedXml",
    "XmlInputError",
    "XmlLimitError",
    "XmlLimits",
    "iter_elements",
    "parse_document",
    "parse_xml",
    "xml_limits",
]


class XmlInputError(Exception):
    """A body that cannot be turned into a trusted element tree; ``cause`` says why."""

    def __init__(self, cause: str):
        self.cause = " ".join(cause.split())
        super().__init__(self.cause)


class HostileXmlError(XmlInputError):
    """The document declares entities (billion laughs, XXE); refused before use."""


class NotXmlError(XmlInputError):
    """The body is empty, an HTML page or plain text: the server did not answer in XML."""


class MalformedXmlError(XmlInputError):
    """The body looks like XML but is not well-formed (truncated, undefined entity, ...)."""


class XmlLimitError(XmlInputError):
    """The document exceeds a size limit (nesting, node count, text or attribute length)."""


@dataclass(frozen=True, slots=True)
class XmlLimits:
    """How much tree one page may cost: about 250 MB of lxml tree at the default.

    ``max_nodes`` bounds the libxml2 nodes of a page, counted before parsing from its
    bytes: one per ``<`` (an element, or at most an end tag or comment) and two per
    ``=`` (an attribute keeps its value in a node of its own). A cheap upper bound that
    never under-counts; honest pages hold about one such node per 20 bytes.
    """

    max_nodes: int = 2_000_000


_LIMITS: ContextVar[XmlLimits] = ContextVar("xml_limits", default=XmlLimits())


@contextmanager
def xml_limits(limits: XmlLimits | None) -> Iterator[None]:
    """Parse with `limits` inside the block (a partner's own, from the registry)."""
    token = _LIMITS.set(limits or XmlLimits())
    try:
        yield
    finally:
        _LIMITS.reset(token)


@dataclass(frozen=True, slots=True)
class ParsedXml:
    """A parsed document plus whether invalid characters had to be stripped to get it."""

    root: etree._Element
    cleaned: bool = False
    removed_chars: int = 0


_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_HTML_START = re.compile(
    rb"^(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html)[\s>/]", re.S
)
_HTML_HINT = re.compile(rb"<html[\s>]")
_EXPANSION_ATTACK = re.compile(r"amplification|entity reference loop", re.I)
_PARSER_LIMIT = re.compile(r"XML_PARSE_HUGE|excessive depth|resource limit|too long|too large", re.I)
_ENCODING_DECL = re.compile(rb"^\s*<\?xml[^>]*?encoding\s*=\s*[\"']([A-Za-z0-9._:-]+)[\"']")
# Everything outside the XML 1.0 Char production.
_INVALID_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_CHAR_REF = re.compile(r"&#(?:x([0-9A-Fa-f]+)|([0-9]+));")
_SNIFF = 2048


def _new_parser() -> etree.XMLParser:
    # A fresh parser per call: lxml parsers must not be shared between threads.
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_blank_text=False,
        recover=False,
    )


def parse_xml(content: bytes) -> etree._Element:
    """Parse an untrusted body into its root element, or raise an XmlInputError."""
    return parse_document(content).root


def parse_document(content: bytes, limits: XmlLimits | None = None) -> ParsedXml:
    """Like parse_xml, but also reports whether invalid characters were stripped.

    The strict parse comes first; only when it fails and the body holds characters
    XML 1.0 forbids are they removed and the body parsed once more, so the caller can
    log and count the cleaned page instead of losing it. `limits` defaults to those set
    by :func:`xml_limits` (else :class:`XmlLimits`).
    """
    _refuse_non_xml(content)
    _refuse_entity_declarations(content)
    _refuse_too_many_nodes(content, limits or _LIMITS.get())
    try:
        root = etree.fromstring(content, _new_parser())
    except etree.XMLSyntaxError as exc:
        cleaned, removed = _strip_invalid_chars(content)
        if not removed:
            raise _syntax_error(content, exc) from None
        try:
            root = etree.fromstring(cleaned, _new_parser())
        except etree.XMLSyntaxError as exc2:
            if _PARSER_LIMIT.search(_lxml_message(exc2)):
                raise _limit_error(exc2) from None
            raise MalformedXmlError(
                f"not well-formed XML even after removing {removed} invalid XML 1.0 "
                f"character(s): {_lxml_message(exc2)}"
            ) from None
        return ParsedXml(_checked_root(root), cleaned=True, removed_chars=removed)
    return ParsedXml(_checked_root(root))


def iter_elements(stream: IO[bytes], tag: str) -> Iterator[etree._Element]:
    """Each ``tag`` element of a document of any size, as it ends (lxml's iterparse, with this
    module's parser settings: no entities resolved, no network, no DTD, libxml2's limits on).
    The caller clears each element it is done with, so memory stays bounded by one. A head
    that is not XML or declares entities is refused before anything is parsed; a document
    that breaks later raises where it breaks."""
    buffered = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(cast(Any, stream))
    head = buffered.peek(64 * 1024)[:64 * 1024]
    _refuse_non_xml(head)
    _refuse_entity_declarations(head)
    events = etree.iterparse(buffered, events=("end",), tag=tag, resolve_entities=False, no_network=True,
                             load_dtd=False, huge_tree=False, remove_blank_text=False, recover=False)
    try:
        for _, element in events:
            yield element
    except etree.XMLSyntaxError as exc:
        raise _syntax_error(head, exc) from None


def _refuse_non_xml(content: bytes) -> None:
    head = content[:_SNIFF]
    for bom in _BOMS:
        if head.startswith(bom):
            head = head[len(bom):]
            break
    head = head.lstrip()
    if not head:
        raise NotXmlError("empty response body (no XML at all)")
    if _HTML_START.match(head.lower()):
        raise NotXmlError(f"response is an HTML page, not XML: {_snippet(head)}")
    if not head.startswith((b"<", b"\x00<")):
        raise NotXmlError(f"response body is not XML (does not start with '<'): {_snippet(head)}")


def _refuse_entity_declarations(content: bytes) -> None:
    # Cheap byte scan before lxml sees anything; _checked_root re-checks the parsed
    # DTD for encodings (UTF-16) this scan cannot read.
    doctype = content.find(b"<!DOCTYPE")
    if doctype >= 0 and content.find(b"<!ENTITY", doctype) >= 0:
        raise HostileXmlError(
            "document type declaration declares entities (entity expansion / XXE risk); refused"
        )


def _refuse_too_many_nodes(content: bytes, limits: XmlLimits) -> None:
    # bytes.count runs at memory speed; building the tree first would cost ~125 bytes a node.
    nodes = content.count(b"<") + 2 * content.count(b"=")
    if nodes > limits.max_nodes:
        raise XmlLimitError(
            f"document would build up to {nodes:,} XML nodes (elements and attributes, counted "
            f"from its '<' and '=' characters), more than the limit of {limits.max_nodes:,} "
            "(options.http.max_xml_nodes); refused before parsing"
        )


def _limit_error(exc: etree.XMLSyntaxError) -> XmlLimitError:
    return XmlLimitError(
        f"document exceeds a parser safety limit (at most 256 levels of nesting, 10 MB per "
        f"text node or attribute value; huge_tree stays off): {_lxml_message(exc)}"
    )


def _checked_root(root: etree._Element) -> etree._Element:
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        names = ", ".join(sorted(str(e.name) for e in dtd.iterentities()))
        raise HostileXmlError(
            f"document type declaration declares entities ({names}); refused as entity "
            "expansion / XXE risk"
        )
    tag = root.tag
    if isinstance(tag, str) and etree.QName(tag).localname.lower() == "html":
        raise NotXmlError("response is an (X)HTML page, not a data document (root <html>)")
    return root


def _syntax_error(content: bytes, exc: etree.XMLSyntaxError) -> XmlInputError:
    message = _lxml_message(exc)
    if _PARSER_LIMIT.search(message) and not _EXPANSION_ATTACK.search(message):
        return _limit_error(exc)
    if _EXPANSION_ATTACK.search(message):
        # libxml2's own guard fired: an expansion attack the byte scan could not read.
        return HostileXmlError(f"entity expansion attack stopped by the parser: {message}")
    if _HTML_HINT.search(content[:_SNIFF].lower()):
        return NotXmlError(f"response looks like an HTML page and is not well-formed XML: {message}")
    return MalformedXmlError(f"not well-formed XML: {message}")


def _lxml_message(exc: etree.XMLSyntaxError) -> str:
    # exc.msg already carries "line L, column C"; str(exc) adds a "(<string>...)" suffix.
    return exc.msg or str(exc)


def _snippet(head: bytes) -> str:
    return repr(head[:60].decode("utf-8", "replace"))


def _declared_encoding(content: bytes) -> str:
    if content.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if content.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    match = _ENCODING_DECL.match(content)
    return match.group(1).decode("ascii") if match else "utf-8"


def _strip_invalid_chars(content: bytes) -> tuple[bytes, int]:
    """Remove characters (raw or as character references) outside XML 1.0's range.

    Returns the cleaned body and how many characters went; 0 means nothing to strip
    (or the body cannot be decoded, which cleaning would not fix).
    """
    encoding = _declared_encoding(content)
    try:
        text = content.decode(encoding)
    except (LookupError, UnicodeDecodeError):
        return content, 0
    text, raw_removed = _INVALID_CHARS.subn("", text)
    ref_removed = 0

    def drop_bad_ref(match: re.Match[str]) -> str:
        nonlocal ref_removed
        hex_digits, dec_digits = match.groups()
        value = int(hex_digits, 16) if hex_digits else int(dec_digits)
        if value > 0x10FFFF or _INVALID_CHARS.match(chr(value)) or 0xD800 <= value <= 0xDFFF:
            ref_removed += 1
            return ""
        return match.group(0)

    if "&#" in text:
        text = _CHAR_REF.sub(drop_bad_ref, text)
    removed = raw_removed + ref_removed
    if not removed:
        return content, 0
    return text.encode("utf-8" if encoding == "utf-8-sig" else encoding), removed
