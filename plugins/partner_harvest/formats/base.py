"""The contract a metadata format fulfils, and small helpers the formats share."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from lxml import etree

from partner_harvest.formats.checks import DEFAULT_POLICY, Checked, Finding


@runtime_checkable
class MetadataFormat(Protocol):
    """Checks and reads one payload element (the single child of OAI ``<metadata>``).

    ``validate`` returns None when the payload may be stored, else a one-line reason
    that goes to quarantine with the raw record (I8). The built-in formats also offer
    ``check(element) -> Checked``: the named checks that fired (formats/checks.py), the
    title, and a repair to run if the record lands; the partner's policy then decides which
    findings reject and which only warn (``validate`` is the default policy's verdict).
    """

    @property
    def prefix(self) -> str: ...

    @property
    def namespace(self) -> str | None: ...

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
    return f"<{element.tag!s}>"


def default_verdict(checked: Checked) -> str | None:
    """The reason a payload is rejected under the default policy, or None (``validate``)."""
    rejected, _ = DEFAULT_POLICY.judge(checked.findings)
    return rejected.message if rejected else None


def checked_by(fmt: MetadataFormat, element: etree._Element) -> Checked:
    """The format's ``check``, or for a format with only ``validate`` its reason as the
    (never overridable) ``format.invalid`` finding."""
    check = getattr(fmt, "check", None)
    if check is not None:
        return check(element)
    reason = fmt.validate(element)
    if reason is not None:
        return Checked((Finding("format.invalid", reason),))
    return Checked((), fmt.extract_title(element))
