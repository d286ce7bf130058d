"""Any metadata format without its own module (nsdl_dc, ddi, xoai, mods, ...).

Such payloads are stored as delivered: the only requirement is the single payload
element the OAI envelope already guarantees. A title is picked up when one is obvious;
without one the record lands untitled, with the ``generic.no_title`` warning.
"""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import default_verdict, first_text
from partner_harvest.formats.checks import Checked, Finding

_NO_TITLE = Finding("generic.no_title", "payload has no element named title with text")


class GenericFormat:
    """Accepts any single element; title = first descendant named ``title`` in any namespace."""

    namespace: str | None = None

    def __init__(self, prefix: str):
        self.prefix = prefix

    def check(self, element: etree._Element) -> Checked:
        title = self.extract_title(element)
        return Checked((_NO_TITLE,) if title is None else (), title)

    def validate(self, element: etree._Element) -> str | None:
        return default_verdict(self.check(element))

    def extract_title(self, element: etree._Element) -> str | None:
        return first_text(element.iter("{*}title"))

    def __repr__(self) -> str:
        return f"GenericFormat({self.prefix!r})"
