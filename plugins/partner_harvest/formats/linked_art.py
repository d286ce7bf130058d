"""Linked Art JSON-LD (museum objects, as the Getty and the Rijksmuseum publish them).

A Linked Art record is one JSON object: ``@context`` (the Linked Art context), ``id``,
``type`` (HumanMadeObject, ...), ``_label`` and names in ``identified_by``. Nothing in the
model requires a name, so the aggregation's own need (a title to show) is the only reject
a partner may turn into a warning; a body that is not a JSON object cannot be stored as a
record at all. Identity comes from the activity stream's object id, never from the payload.
"""

from __future__ import annotations

import json
from typing import Any

from partner_harvest.formats.base import normalise_space
from partner_harvest.formats.checks import Checked, Finding

LINKED_ART_CONTEXT = "linked.art/ns/v1/linked-art.json"
PRIMARY_NAME = "300404670"  # AAT 'preferred terms' (primary name), the Linked Art convention
MAX_DEPTH = 64  # a body nested deeper than this is refused before it is walked


class NotAJsonRecord(ValueError):
    """The payload is not one JSON object (unparseable, another JSON value, too deep)."""


def load(body: bytes | str) -> dict[str, Any]:
    """The record's JSON object, or NotAJsonRecord naming why not."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise NotAJsonRecord(f"not JSON: {type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(document, dict):
        raise NotAJsonRecord(f"a JSON {type(document).__name__}, not an object")
    if _depth(document) > MAX_DEPTH:
        raise NotAJsonRecord(f"nested deeper than {MAX_DEPTH} levels")
    return document


def _depth(value: Any) -> int:
    depth, level = 0, [value]
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        nxt: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                nxt.extend(item.values())
            elif isinstance(item, list):
                nxt.extend(item)
        level = nxt
    return depth


class LinkedArtFormat:
    """Reads one Linked Art record: its title, and what it lacks."""

    prefix = "linked_art"

    def check_document(self, document: dict[str, Any]) -> Checked:
        findings: list[Finding] = []
        if not _mentions_context(document.get("@context")):
            findings.append(Finding("linked_art.no_context", "linked_art payload's @context does not name the "
                                    f"Linked Art context ({LINKED_ART_CONTEXT})"))
        title = self.extract_title(document)
        if title is None:
            findings.append(Finding("linked_art.no_title", "linked_art payload has no name (identified_by Name "
                                    "content) and no _label"))
        return Checked(tuple(findings), title)

    def extract_title(self, document: dict[str, Any]) -> str | None:
        """The primary name (classified_as AAT 300404670), else the first name, else ``_label``."""
        first: str | None = None
        for name in _list(document.get("identified_by")):
            if not isinstance(name, dict) or name.get("type") != "Name":
                continue
            content = name.get("content")
            text = normalise_space(content) if isinstance(content, str) else ""
            if not text:
                continue
            if any(isinstance(c, dict) and str(c.get("id", "")).rstrip("/").endswith(PRIMARY_NAME)
                   for c in _list(name.get("classified_as"))):
                return text
            first = first or text
        if first is not None:
            return first
        label = document.get("_label")
        return normalise_space(label) or None if isinstance(label, str) else None


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _mentions_context(value: Any) -> bool:
    return any(isinstance(c, str) and LINKED_ART_CONTEXT in c for c in _list(value))


LINKED_ART = LinkedArtFormat()
