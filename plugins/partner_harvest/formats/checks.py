"""The named validation checks, what each does by default, and a partner's overrides.

A check finds one thing about a payload. Its default is ``reject`` when the aggregation
cannot store, identify or show the record (it goes to quarantine, I8) and ``warn`` when
the record is odd but usable (it lands and carries the warning). Identity comes from the
protocol (the OAI identifier, the Sierra id), never from the payload, so nothing about a
payload's own identifiers rejects it. No check is stricter than the format's standard.

Names are stable: they are stored with the records (``records.warnings``), counted per
run (``harvest_runs.warnings``) and written in the registry (``options.validation``).
The table in ``docs/operator/validation.md`` is generated from :data:`CHECKS`
(``scripts/gen_docs.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["reject", "warn"]
REJECT: Action = "reject"
WARN: Action = "warn"


@dataclass(frozen=True)
class Check:
    """One rule: its stable name, default action, and why (the operator's documentation)."""

    name: str
    default: Action
    finds: str  # what the check finds, one line
    why: str  # why the default is what it is
    overridable: bool = True  # False: what cannot be stored or read at all, whatever the registry says


@dataclass(frozen=True, slots=True)
class Finding:
    """One check that fired on one record, with its one-line message."""

    check: str
    message: str


@dataclass(frozen=True, slots=True)
class Checked:
    """A format's reading of a payload: what fired, the title, and a repair to apply if it lands.

    The repair (e.g. a rebuilt leader) runs only on a record that lands, so a quarantined
    record keeps its payload exactly as delivered.
    """

    findings: tuple[Finding, ...] = ()
    title: str | None = None
    repair: Callable[[], None] | None = None


_CHECK_LIST = (
    # -- MARC 21 (OAI-PMH marc21/marcxml payloads, and every Sierra bib) --------------------
    Check("marc.not_a_record", REJECT,
          "the payload is not one MARCXML <record> (nor a <collection> holding exactly one)",
          "there is no MARC record to store or show"),
    Check("marc.leader_rebuilt", WARN,
          "the leader is missing, empty or not 24 characters long: it is rebuilt (the positions it has are "
          "kept where they hold a plausible code; record length and base address are zeros; 20-23 are 4500)",
          "the leader's computed positions mean nothing outside ISO 2709 and the record's content is intact; "
          "MARCXML's schema makes a leader 24 characters, blanks included, so a 24-character leader is never "
          "touched, whatever its blanks"),
    Check("marc.no_001", WARN,
          "no control number (001), or an empty one",
          "the record is identified by the protocol (OAI identifier, Sierra id), not by its 001"),
    Check("marc.no_title", REJECT,
          "no title in 245 (subfields a and b; k, n, p and f when a and b are absent)",
          "the aggregation shows records by their title; a partner whose records lack one can turn this "
          "into a warning and land them untitled"),
    # -- Simple Dublin Core (oai_dc) ------------------------------------------------------
    Check("oai_dc.wrong_root", REJECT,
          "the payload's root is not <oai_dc:dc>",
          "the payload is not Dublin Core: it cannot be read as such"),
    Check("oai_dc.no_title", REJECT,
          "no non-empty dc:title (every oai_dc element is optional and repeatable: nothing else is required)",
          "the aggregation shows records by their title; a partner can turn this into a warning"),
    Check("oai_dc.dcterms_title", WARN,
          "no dc:title, but a dcterms:title (DCMI Terms, which the oai_dc schema does not allow) is the title",
          "the title is there, in the wrong namespace: the record can be shown"),
    # -- LIDO (museum objects) -------------------------------------------------------------
    Check("lido.wrong_root", REJECT,
          "the payload's root is not <lido:lido> (nor a <lido:lidoWrap> holding exactly one)",
          "the payload is not a LIDO record: it cannot be read as such"),
    Check("lido.no_title", REJECT,
          "no non-empty title (descriptiveMetadata/objectIdentificationWrap/titleWrap/titleSet/appellationValue)",
          "the aggregation shows records by their title; a partner can turn this into a warning"),
    Check("lido.no_rec_id", WARN,
          "no non-empty lido:lidoRecID (required by the LIDO schema)",
          "the record is identified by its OAI identifier, not by its lidoRecID"),
    Check("lido.no_work_type", WARN,
          "no objectWorkType term (required by the LIDO schema)",
          "a record without a work type can still be stored and shown by its title"),
    # -- Linked Art JSON-LD (IIIF Change Discovery descriptions) -----------------------------
    Check("linked_art.no_title", REJECT,
          "no name (identified_by Name with content) and no _label",
          "the aggregation shows records by their title; a partner can turn this into a warning"),
    Check("linked_art.no_context", WARN,
          "the @context does not name the Linked Art context (linked.art/ns/v1/linked-art.json)",
          "the record is still a JSON-LD description the aggregation can store and show"),
    # -- any other format ------------------------------------------------------------------
    Check("generic.no_title", WARN,
          "no element named title (in any namespace) with text, in a format without its own rules",
          "the format's title field is unknown here; the record is stored as delivered, untitled"),
    # -- Sierra ----------------------------------------------------------------------------
    Check("sierra.suppressed", WARN,
          "the bib is suppressed in the catalogue (not public), with options.sierra.suppressed: flag",
          "the partner's choice is options.sierra.suppressed (purge, flag or keep), not a validation override",
          overridable=False),
    # -- never overridable: what cannot be read, identified or stored -----------------------
    Check("oai.bad_record", REJECT,
          "an OAI record without a header, identifier or parseable datestamp, without metadata, or with "
          "other than one payload element",
          "the record cannot be identified or ordered, or holds no payload", overridable=False),
    Check("marc.unreadable", REJECT,
          "an ISO 2709 or MARC-in-JSON record that cannot be decoded (structure, character set, no bib id)",
          "there is nothing readable to store; the raw bytes are kept, escaped", overridable=False),
    Check("json.unreadable", REJECT,
          "a JSON description (Linked Art) that is not one JSON object: unparseable, another JSON value, "
          "or nested deeper than 64 levels",
          "there is nothing readable to store; the raw body is kept", overridable=False),
    Check("format.invalid", REJECT,
          "a metadata format registered without named checks (only validate) rejected the payload",
          "that format's own rule; it names no check a registry could override", overridable=False),
    Check("store.unstorable", REJECT,
          "a NUL character or a lone surrogate, an identifier over 1,000 bytes, or a payload over the "
          "partner's options.limits.max_record_bytes",
          "PostgreSQL cannot hold it (or the partner's limit forbids it); the size limit is set in "
          "options.limits", overridable=False),
)

CHECKS: dict[str, Check] = {check.name: check for check in _CHECK_LIST}


class UnknownCheck(ValueError):
    """A registry names a check that does not exist, or one that cannot be overridden."""


def check_overrides(overrides: Mapping[str, str]) -> None:
    """Refuse unknown check names, checks that cannot be overridden, and actions other than reject/warn."""
    for name, action in overrides.items():
        check = CHECKS.get(name)
        if check is None:
            raise UnknownCheck(f"unknown validation check {name!r}; known checks: {', '.join(sorted(CHECKS))}")
        if action not in (REJECT, WARN):
            raise UnknownCheck(f"validation check {name!r}: action must be reject or warn, got {action!r}")
        if not check.overridable:
            raise UnknownCheck(f"validation check {name!r} cannot be overridden: {check.why}")


@dataclass(frozen=True)
class Policy:
    """The action of every check for one partner: the defaults, with its registry overrides."""

    overrides: Mapping[str, Action] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", dict(self.overrides))
        check_overrides(self.overrides)

    def action(self, name: str) -> Action:
        return self.overrides.get(name) or CHECKS[name].default

    def judge(self, findings: Iterable[Finding]) -> tuple[Finding | None, tuple[Finding, ...]]:
        """(the first finding whose action is reject, or None; the warnings when none is)."""
        if not findings:
            return None, ()
        findings = tuple(findings)
        for finding in findings:
            if self.action(finding.check) == REJECT:
                return finding, ()
        return None, findings


DEFAULT_POLICY = Policy()


def policy_of(overrides: Mapping[str, Action]) -> Policy:
    """The partner's policy from its registry overrides (``options.validation``)."""
    return Policy(overrides) if overrides else DEFAULT_POLICY


def warnings_json(warnings: tuple[Finding, ...]) -> dict[str, str] | None:
    """How a record's warnings are stored (``records.warnings``): {check name: message}, or NULL."""
    if not warnings:
        return None
    stored: dict[str, str] = {}
    for finding in warnings:
        stored.setdefault(finding.check, finding.message)
    return stored


TABLE_START = "<!-- checks table: generated from formats/checks.py, do not edit by hand -->"
TABLE_END = "<!-- end of checks table -->"


def checks_table() -> str:
    """The operator's table of every check (docs/operator/validation.md), one row each."""
    rows = ["| Check | Default | Finds | Why this default | Override |", "|---|---|---|---|---|"]
    for check in _CHECK_LIST:
        override = "reject or warn" if check.overridable else "never (not overridable)"
        cells = (f"`{check.name}`", f"**{check.default}**", check.finds, check.why, override)
        rows.append("| " + " | ".join(cell.replace("|", "\\|").replace("<", "&lt;") for cell in cells) + " |")
    return "\n".join(rows)


def with_table(document: str) -> str:
    """``document`` with the text between the table's markers replaced by :func:`checks_table`."""
    head, start, rest = document.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"the document lacks the markers {TABLE_START!r} ... {TABLE_END!r}")
    return f"{head}{TABLE_START}\n{checks_table()}\n{TABLE_END}{tail}"
