"""Simple Dublin Core (``oai_dc``), the format every OAI-PMH repository must offer.

Per the OAI-PMH oai_dc schema every element is optional and repeatable, in any order:
the only rule of the format is the root <oai_dc:dc>. The aggregation adds one: a record
is shown by its title, so one without a dc:title is rejected unless the partner's
registry turns ``oai_dc.no_title`` into a warning.
"""

from __future__ import annotations

from lxml import etree

from partner_harvest.formats.base import default_verdict, describe_tag, first_text
from partner_harvest.formats.checks import Checked, Finding

OAI_DC_NS = "http://www.openarchives.org/OAI/2.0/oai_dc/"
DC_NS = "http://purl.org/dc/elements/1.1/"
_ROOT = f"{{{OAI_DC_NS}}}dc"
DCTERMS_NS = "http://purl.org/dc/terms/"
_TITLE = f"{{{DC_NS}}}title"
_TERMS_TITLE = f"{{{DCTERMS_NS}}}title"
_NO_TITLE = Finding("oai_dc.no_title", "oai_dc payload has no non-empty dc:title")
_TERMS_ONLY = Finding("oai_dc.dcterms_title", "oai_dc payload has no dc:title; titled from dcterms:title")


class OaiDcFormat:
    prefix = "oai_dc"
    namespace: str | None = OAI_DC_NS

    def check(self, element: etree._Element) -> Checked:
        """The root and the title in one reading (the harvest's hot path)."""
        if element.tag != _ROOT:
            return Checked((Finding("oai_dc.wrong_root",
                                    f"oai_dc payload root is {describe_tag(element)}, expected <{_ROOT}>"),))
        title = self.extract_title(element)
        if title is not None:
            return Checked((), title)
        # Some aggregators' oai_dc carries DCMI Terms elements the schema does not allow; a
        # dcterms:title is still the record's title.
        title = first_text(element.iterchildren(_TERMS_TITLE))
        return Checked((_TERMS_ONLY,) if title is not None else (_NO_TITLE,), title)

    def validate(self, element: etree._Element) -> str | None:
        return default_verdict(self.check(element))

    def extract_title(self, element: etree._Element) -> str | None:
        return first_text(element.iterchildren(_TITLE))


OAI_DC = OaiDcFormat()
