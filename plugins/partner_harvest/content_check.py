"""The content check: are the partner's datestamps telling the truth? (no Airflow)

An incremental harvest trusts datestamps, and the weekly reconcile compares identifiers, so
a record edited upstream without a new datestamp would stay stale for ever. Each reconcile
therefore fetches a sample of the records it holds by identifier (``Adapter.fetch_records``:
OAI-PMH GetRecord, Sierra ``bibs?id=``, the IIIF object) and compares the partner's content
with what is held: first by ``content_hash``, and where the hashes differ on a canonical
form of both (XML: C14N 2.0 with surrounding whitespace stripped; JSON: sorted keys), so a
mere change of serialisation (namespace declarations, indentation) is no change.

A record whose content differs while its datestamp did not move is a *silent* change: the
partner's datestamps are unreliable (health page, status, an alert naming examples), and a
*content refresh* is due, a full harvest of the partner on its next incremental night that
lands every changed record (an equal datestamp observed later wins when the content differs,
I2). The sampled records that changed land with the reconcile's apply at once.
``options.content_check.refresh_every`` asks for a refresh every n-th reconcile whatever
the checks find; ``mode: off`` samples nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from lxml import etree

from partner_harvest.adapters import Adapter, StagingSink
from partner_harvest.records import Record, Tombstone
from partner_harvest.registry import ContentCheckOptions, Partner
from partner_harvest.store import content as sql
from partner_harvest.store.runs import RunRef
from partner_harvest.window import Window
from partner_harvest.xmlsafe import XmlInputError, parse_xml

log = logging.getLogger(__name__)
EXAMPLES = 5


@dataclass
class Findings:
    """What one check found: its figures go to ``harvest_runs`` and ``partner_content``."""

    sampled: int = 0
    same: int = 0
    silent: int = 0  # content changed, datestamp not moved
    restamped: int = 0  # content changed with a newer datestamp (a change the next night brings anyway)
    gone: int = 0  # deleted or vanished since the sweep
    requests: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)
    refresh: str | None = None  # why a content refresh is now due

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_size(held: int, options: ContentCheckOptions) -> int:
    """About ``share`` of what is held, at least ``floor`` (all of a smaller partner), at most ``cap``."""
    if options.mode == "off" or held <= 0:
        return 0
    return min(held, max(options.floor, min(options.cap, round(held * options.share))))


def canonical(metadata: str, set_specs: tuple[str, ...] = ()) -> str:
    """The content in a form where equal content is equal text: XML in canonical form (C14N
    2.0, text trimmed), JSON with sorted keys, anything else with its whitespace collapsed."""
    text = metadata.strip()
    body = " ".join(text.split())
    if text.startswith("<"):
        try:
            body = etree.tostring(parse_xml(text.encode("utf-8")), method="c14n2", strip_text=True).decode("utf-8")
        except (XmlInputError, ValueError, etree.LxmlError):
            pass
    elif text.startswith(("{", "[")):
        try:
            body = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            pass
    return body + "\x00" + "\x1f".join(sorted(set_specs))


def check(adapter: Adapter, conn: psycopg.Connection, partner: Partner, run: RunRef, window: Window,
          sink: StagingSink) -> Findings:
    """Fetch the sample, compare, stage the changed ones (into the reconcile's staging: its
    apply lands them), record the findings; returns them."""
    options = partner.options.content_check
    size = sample_size(sql.held_count(conn, partner.id), options)
    found = Findings()
    if size:
        before = adapter.responses
        for chunk in sql.sample(conn, partner.id, run.run_id, size, adapter.fetch_chunk):
            fetched = {item.identifier: item for item in adapter.fetch_records(window, [h.identifier for h in chunk])}
            sink.write_page([fetched[held.identifier] for held in chunk
                             if _compare(held, fetched.get(held.identifier), found)])
        found.requests = adapter.responses - before
    checks = sql.checks_done(conn, partner.id) + 1
    if found.silent:
        share = found.silent / found.sampled
        found.refresh = (f"content check of {run.run_id}: {found.silent} of {found.sampled} sampled records "
                         f"({share:.1%}) changed without a new datestamp")
    elif options.refresh_every and checks % options.refresh_every == 0:
        found.refresh = f"refresh_every {options.refresh_every}: reconcile {checks} ({run.run_id})"
    sql.record_check(conn, partner.id, run.run_id, run.channel, sampled=found.sampled, silent=found.silent,
                     requests=found.requests, examples=found.examples, refresh=found.refresh)
    if found.silent:
        log.warning("%s: DATESTAMPS UNRELIABLE: %s; examples: %s; a content refresh (full harvest) runs on the "
                    "next incremental night", partner.id, found.refresh,
                    ", ".join(e["identifier"] for e in found.examples))
    elif size:
        log.info("%s: content check: %d sampled records, %d unchanged, %d re-dated, %d gone (%d requests)%s",
                 partner.id, found.sampled, found.same, found.restamped, found.gone, found.requests,
                 f"; {found.refresh}: a content refresh is due" if found.refresh else "")
    return found


def _compare(held: sql.Held, item: Any, found: Findings) -> bool:
    """Count the verdict on one sampled record; True when its content changed (it is staged).
    A deletion is the sweep's to see, a rejected version the next harvest's: neither is staged."""
    found.sampled += 1
    if item is None or isinstance(item, Tombstone):
        found.gone += 1
        return False
    if not isinstance(item, Record):  # a rejected version: no verdict on content
        return False
    if item.content_hash == held.content_hash or canonical(item.metadata, item.set_specs) == canonical(
            held.metadata, held.set_specs):
        found.same += 1
        return False
    if item.datestamp > held.datestamp:
        found.restamped += 1
        return True
    found.silent += 1
    if len(found.examples) < EXAMPLES:
        found.examples.append({"identifier": held.identifier, "datestamp": held.datestamp.isoformat(),
                               "held_hash": held.content_hash[:12], "partner_hash": item.content_hash[:12]})
    return True
