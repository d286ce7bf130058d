"""Simple Dublin Core (``oai_dc``), the format every OAI-PMH repository must offer."""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import describe_tag, first_text

OAI_DC_NS = "http://www.openarchives.org/OAI/2.0/oai_dc/"
DC_NS = "http://purl.org/dc/elements/1.1/"
_ROOT = f"{{{OAI_DC_NS}}}dc"
_TITLE = f"{{{DC_NS}}}title"


class OaiDcFormat:
    """A record without a title is useless to the aggregation, so it is quarantined."""

    prefix = "oai_dc"
    namespace: str | None = OAI_DC_NS

    def validate(self, element: etree._Element) -> str | None:
        return self.check(element)[0]

    def check(self, element: etree._Element) -> tuple[str | None, str | None]:
        """(reason, title): validate and extract_title in one reading (the harvest's hot path)."""
        if element.tag != _ROOT:
            return f"oai_dc payload root is {describe_tag(element)}, expected <{_ROOT}>", None
        title = self.extract_title(element)
        if title is None:
            return "oai_dc payload has no non-empty dc:title", None
        return None, title

    def extract_title(self, element: etree._Element) -> str | None:
        return first_text(element.iterchildren(_TITLE))


OAI_DC = OaiDcFormat()
