"""The contract a metadata format fulfils, and small helpers the formats share."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from lxml import etree


@runtime_checkable
class MetadataFormat(Protocol):
    """Checks and reads one payload element (the single child of OAI ``<metadata>``).

    ``validate`` returns None when the payload may be stored, else a one-line reason
    that goes to quarantine with the raw record (I8).
    """

    prefix: str
    namespace: str | None

    def validate(self, element: etree._Element) -> str | None: ...

    def extract_title(self, element: etree._Element) -> str | None: ...


def normalise_space(text: str) -> str:
    """Collapse runs of whitespace: titles arrive indented and line-wrapped."""
    return " ".join(text.split())


def text_of(element: etree._Element) -> str:
    """All text below ``element`` (comments and PIs excluded), whitespace-normalised."""
    return normalise_space("".join(element.itertext()))


def first_text(elements: object) -> str | None:
    """The first non-empty normalised text among ``elements``, or None."""
    for element in elements:  # type: ignore[attr-defined]
        text = text_of(element)
        if text:
            return text
    return None


def describe_tag(element: etree._Element) -> str:
    """``<{ns}local>`` for reasons, so a wrong namespace is visible at a glance."""
    return f"<{element.tag}>"
