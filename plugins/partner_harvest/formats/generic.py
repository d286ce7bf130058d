"""Any metadata format without its own module (nsdl_dc, ddi, xoai, mods, ...).

Such payloads are stored as delivered: the only requirement is the single payload
element the OAI envelope already guarantees. A title is picked up when one is obvious.
"""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import first_text


class GenericFormat:
    """Accepts any single element; title = first descendant named ``title`` in any namespace."""

    namespace: str | None = None

    def __init__(self, prefix: str):
        self.prefix = prefix

    def validate(self, element: etree._Element) -> str | None:
        if not isinstance(element.tag, str):
            return "payload is not an element"
        return None

    def extract_title(self, element: etree._Element) -> str | None:
        return first_text(element.iter("{*}title"))

    def __repr__(self) -> str:
        return f"GenericFormat({self.prefix!r})"
