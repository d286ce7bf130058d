"""Payload handling per metadata format: validate and extract, keyed by metadataPrefix.

Extension point: a new format is a module with an object that satisfies
:class:`MetadataFormat`, added to ``FORMATS`` below (or passed to ``register_format``).
"""

from __future__ import annotations

from partner_harvest.formats.base import MetadataFormat
from partner_harvest.formats.generic import GenericFormat
from partner_harvest.formats.lido import LIDO
from partner_harvest.formats.linked_art import LINKED_ART
from partner_harvest.formats.marc21 import MARC21
from partner_harvest.formats.oai_dc import OAI_DC

__all__ = ["FORMATS", "JSON_FORMATS", "GenericFormat", "MetadataFormat", "get_format", "register_format"]

FORMATS: dict[str, MetadataFormat] = {
    OAI_DC.prefix: OAI_DC,
    LIDO.prefix: LIDO,
    "marc21": MARC21,
    "marcxml": MARC21,
}


def register_format(fmt: MetadataFormat, *prefixes: str) -> None:
    """Make ``fmt`` handle its own prefix and any aliases (e.g. marc21 and marcxml)."""
    for prefix in prefixes or (fmt.prefix,):
        FORMATS[prefix] = fmt


def get_format(prefix: str) -> MetadataFormat:
    """The registered format for ``prefix``, else a permissive generic one."""
    return FORMATS.get(prefix) or GenericFormat(prefix)


# JSON descriptions (an IIIF Change Discovery object's seeAlso): read as documents, not elements.
JSON_FORMATS = {LINKED_ART.prefix: LINKED_ART}
