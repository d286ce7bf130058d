"""Each XML defence on its own (I9): a test per layer that fails when only that layer is
switched off, the others staying on (tests/INVARIANTS.md lists the mutations).

Layers, in the order a body meets them: the byte scan for entity declarations; the
parser configuration (no entity resolution, no DTD loading, no network); the check of
the parsed DTD; libxml2's own amplification guard, reported as hostile. The hostile
tests in test_xmlsafe.py are refused by several layers at once, so they cannot tell
which one is missing.

Whether the parser opens an external file is observed with a named pipe: a writer thread
blocks opening it until someone reads it, so "was it opened?" has a definite answer once
the parse returns, without sleeping or timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from partner_harvest.xmlsafe import HostileXmlError, MalformedXmlError, NotXmlError, XmlInputError, parse_xml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oai"


class Tripwire:
    """A FIFO that records whether anything opened it for reading."""

    def __init__(self, directory: Path, content: str) -> None:
        self.path = directory / "tripwire"
        os.mkfifo(self.path)
        self.opened = threading.Event()
        self._content = content
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            with open(self.path, "w") as pipe:  # blocks until a reader opens the FIFO
                self.opened.set()
                pipe.write(self._content)
        except OSError:
            pass

    def was_opened(self) -> bool:
        """Whether a reader came; afterwards releases the writer (opening it ourselves)."""
        opened = self.opened.is_set()
        if not opened:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._thread.join()
            os.close(fd)
        self._thread.join()
        return opened


def parse_outcome(parse: Callable[[], object]) -> object:
    try:
        return parse()
    except XmlInputError as exc:
        return exc


def test_the_parser_never_reads_an_external_entity(tmp_path: Path) -> None:
    """UTF-16 hides the declaration from the byte scan; the after-parse check refuses the
    document, but only after parsing: by then a resolving parser has read the file."""
    wire = Tripwire(tmp_path, "TOP-SECRET")
    body = (
        '<?xml version="1.0" encoding="UTF-16"?>\n'
        f'<!DOCTYPE r [<!ENTITY secret SYSTEM "{wire.path.as_uri()}">]>\n'
        "<r><v>&secret;</v></r>"
    ).encode("utf-16")
    outcome = parse_outcome(lambda: parse_xml(body))
    assert not wire.was_opened(), "the parser opened the external entity's file"
    assert isinstance(outcome, HostileXmlError)


def test_the_parser_never_loads_an_external_dtd(tmp_path: Path) -> None:
    """An external DTD subset declares no entity the scans could see; it is never fetched."""
    wire = Tripwire(tmp_path, "<!ELEMENT r EMPTY>")
    body = f'<?xml version="1.0"?>\n<!DOCTYPE r SYSTEM "{wire.path.as_uri()}">\n<r/>'.encode()
    outcome = parse_outcome(lambda: parse_xml(body))
    assert not wire.was_opened(), "the parser loaded the external DTD"
    assert getattr(outcome, "tag", None) == "r"


def test_the_byte_scan_refuses_before_the_parser_runs() -> None:
    """A hostile DTD in a body that is also cut off: only a scan that runs before the parser
    can call it hostile (the parser would first stumble over the truncation)."""
    body = (FIXTURES / "billion_laughs.xml").read_bytes()
    truncated = body[: body.index(b"<Identify>") + len(b"<Identify><repos")]
    with pytest.raises(HostileXmlError):
        parse_xml(truncated)
    xxe = b'<?xml version="1.0"?>\n<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/hostname">]>\n<r><v>&x;</v'
    with pytest.raises(HostileXmlError):
        parse_xml(xxe)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_the_after_parse_check_refuses_what_the_byte_scan_cannot_read(encoding: str) -> None:
    """An internal entity in UTF-16: invisible to the byte scan, harmless to the parser
    configuration, so only the check of the parsed DTD stands between it and the tree."""
    declaration = "" if encoding == "utf-16" else '<?xml version="1.0" encoding="UTF-16"?>'
    text = f'{declaration}<!DOCTYPE r [<!ENTITY greeting "hello">]><r>&greeting;</r>'
    body = text.encode(encoding) if encoding == "utf-16" else ("\ufeff" + text).encode(encoding)
    assert b"<!ENTITY" not in body
    with pytest.raises(HostileXmlError, match="greeting"):
        parse_xml(body)


def test_an_expansion_stopped_by_libxml2_is_named_hostile() -> None:
    """Billion laughs in UTF-16 passes the byte scan; libxml2 stops the amplification while
    parsing, and the error must say attack, not just "malformed"."""
    text = (FIXTURES / "billion_laughs.xml").read_text(encoding="utf-8")
    body = text.replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="UTF-16"?>').encode("utf-16")
    with pytest.raises(HostileXmlError, match="expansion") as info:
        parse_xml(body)
    assert not isinstance(info.value, MalformedXmlError)


@pytest.mark.parametrize("body", [
    b"<!DOCTYPE html>\n<title>503</title>\n<body><h1>Service Unavailable</h1></body>",
    b"<!doctype html><body><p>Maintenance until 6:00</p></body>",
])
def test_the_html_sniff_names_pages_without_an_html_element(body: bytes) -> None:
    """HTML5 may omit <html>: neither the parse-error hint nor the root check sees such a
    page, only the sniff of the body's start does (the second one is even well-formed)."""
    with pytest.raises(NotXmlError, match="HTML"):
        parse_xml(body)
