"""The readiness probes of a Sierra ILS REST API (readiness.py; declared in sierra/spec.py).

What a harvest relies on: an access token for the Connection's client key and secret and the
server's clock (its ``Date`` header freezes every window), the change poll (``GET bibs`` by
``updatedDate`` with the partner's fields, MARC included), the separate deletion poll (by
``deletedDate`` day) and the ``bibs/marc`` export of the full load, over a small range. The
sample's bibs go through the partner's validation as the harvest reads them (a bib listed
without MARC is a deletion; a suppressed one as ``options.sierra.suppressed`` says). About
eight requests.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any, cast

from partner_harvest.errors import ConfigurationError, HarvestError
from partner_harvest.readiness import Probe, listed, one_line
from partner_harvest.records import HarvestItem, Rejected, Tombstone
from partner_harvest.sierra import marc
from partner_harvest.sierra.client import EXPORT_FAILED, RateLimited, SierraServerError
from partner_harvest.sierra.export import decode_block
from partner_harvest.sierra.harvester import DELETION_FIELDS, NO_MARC, SierraAdapter, sierra_timestamp

SAMPLE = 20  # bibs of the change and deletion polls
EXPORT_SAMPLE = 5  # ids of the export block
DAYS = (30, 365)  # the change poll's windows, back from the server's clock, until one lists a bib
READ_ROLE = "Bibs_Read"


def check(probe: Probe) -> None:
    adapter = cast(SierraAdapter, probe.adapter)
    clock = _token(probe, adapter)
    if clock is None:
        return
    entries = _change_poll(probe, adapter, clock)
    _deletion_poll(probe, adapter, clock)
    if entries is not None:
        _export(probe, adapter, clock, entries)


def _token(probe: Probe, adapter: SierraAdapter) -> datetime | None:
    """An access token (POST token), its roles and the server's clock (GET info/token)."""
    client = adapter.client
    try:
        response = client.request("GET", "/info/token")
    except ConfigurationError as exc:
        probe.fail("credentials", one_line(exc.cause), "the Connection's login is the API client key and its "
                   "password the client secret (Sierra Admin App, API Keys)", "credentials-refused")
        return None
    except HarvestError as exc:
        probe.fail("token", one_line(exc.cause), "the Connection's host must be the API's base URL, before "
                   "/v6/... (https://catalogue.example/iii/sierra-api)", "token-failed")
        return None
    assert response is not None
    header = response.headers.get("Date")
    try:
        clock = parsedate_to_datetime(header).astimezone(timezone.utc) if header else None
    except (TypeError, ValueError):
        clock = None
    if clock is None:
        probe.fail("clock", f"GET info/token carries no usable Date header ({header!r})", "the harvest freezes its "
                   "window on the server's Date header: the API (or a proxy in front) must send it", "no-date-header")
        return None
    try:
        info: Any = response.json()
    except ValueError:
        info = {}
    roles = [str(role.get("name")) for role in info.get("roles") or [] if isinstance(role, dict)] \
        if isinstance(info, dict) else []
    lifetime = info.get("expiresIn") if isinstance(info, dict) else None
    probe.ok("token", f"the API issued an access token (expires in {lifetime} s); roles {listed(roles) or 'unsaid'}; "
             f"server clock {sierra_timestamp(clock)}")
    if roles and READ_ROLE not in roles:
        probe.warn("permissions", f"the key's roles are {listed(roles)}, without {READ_ROLE}",
                   f"the API key needs {READ_ROLE} (Sierra Admin App, API Keys)", "no-bibs-read")
    return clock


def _change_poll(probe: Probe, adapter: SierraAdapter, clock: datetime) -> list[dict[str, Any]] | None:
    """The latest changed bibs, with the harvest's fields; None when the poll failed."""
    body: dict[str, Any] | None = None
    days = DAYS[0]
    for days in DAYS:
        params = {"deleted": "false", "updatedDate": f"[{sierra_timestamp(clock - timedelta(days=days))},"
                  f"{sierra_timestamp(clock)}]", "fields": ",".join(adapter.fields), "id": "[0,]", "limit": SAMPLE}
        try:
            body = adapter.client.get_json("/bibs", params, empty_ok=True)
        except RateLimited as exc:
            probe.warn("change poll", f"rate limited: {one_line(exc.cause)}", "the harvest waits as the server "
                       "says; run the check again later", "rate-limited")
            return None
        except HarvestError as exc:
            probe.fail("change poll", f"GET bibs by updatedDate: {one_line(exc.cause)}", "the change poll must "
                       f"answer GET bibs?updatedDate=[..]&fields={','.join(adapter.fields)}", "change-poll-failed")
            return None
        if body and body.get("entries"):
            break
    entries = [e for e in (body or {}).get("entries") or [] if isinstance(e, dict)]
    if not entries:
        probe.info("change poll", f"answers; no bib changed in the last {days} days: no sample to read")
        return []
    items = [adapter._entry_to_item(entry, clock) for entry in entries]
    no_marc = [i.identifier for i in items if isinstance(i, Tombstone) and i.reason == NO_MARC]
    suppressed = sum(1 for e in entries if e.get("suppressed") is True)
    probe.ok("change poll", f"GET bibs by updatedDate (the last {days} days) lists {len(entries)} bibs with the "
             f"fields {','.join(adapter.fields)}")
    if no_marc:
        text = (f"{len(no_marc)} of the {len(entries)} bibs are listed without their MARC ({listed(no_marc)}): the "
                "harvest takes each for deleted in Sierra and removes it (reason no_marc)")
        fix = ("if these bibs are not deleted, the API must serve fields=marc (Sierra API v5 or later, a key allowed "
               "to read MARC)")
        if len(no_marc) == len(items):
            probe.fail("MARC", text, fix, "no-marc")
        else:
            probe.warn("MARC", text, fix, "no-marc")
    if suppressed:
        policy = adapter.suppressed
        what = {"purge": "not held (a bib that becomes suppressed is deleted)", "flag": "held, flagged",
                "keep": "held as any bib"}[policy]
        probe.info("suppressed", f"{suppressed} of the {len(entries)} bibs are suppressed: with "
                   f"options.sierra.suppressed={policy} they are {what}")
    probe.validated([i for i in items if not isinstance(i, Tombstone)], "the changed bibs")
    return entries


def _deletion_poll(probe: Probe, adapter: SierraAdapter, clock: datetime) -> None:
    start = (clock - timedelta(days=DAYS[0])).date()
    params = {"deleted": "true", "deletedDate": f"[{start.isoformat()},{clock.date().isoformat()}]",
              "fields": DELETION_FIELDS, "id": "[0,]", "limit": SAMPLE}
    try:
        body = adapter.client.get_json("/bibs", params, empty_ok=True)
    except RateLimited as exc:
        probe.warn("deletion poll", f"rate limited: {one_line(exc.cause)}", "the harvest waits as the server says; "
                   "run the check again later", "rate-limited")
        return
    except HarvestError as exc:
        probe.fail("deletion poll", f"GET bibs by deletedDate: {one_line(exc.cause)}", "the deletion poll must "
                   "answer GET bibs?deleted=true&deletedDate=[day,day]: without it deleted bibs stay held until the "
                   "weekly reconcile", "deletion-poll-failed")
        return
    entries = (body or {}).get("entries") or []
    unusable = [adapter._tombstone(e, str(e.get("id", ""))) for e in entries if isinstance(e, dict)]
    bad = [i for i in unusable if isinstance(i, Rejected)]
    if bad:
        probe.warn("deletion poll", f"{len(bad)} of {len(entries)} deleted bibs carry no usable deletedDate: "
                   f"{listed([one_line(i.reason, 80) for i in bad], 2)}", "each deleted bib needs its deletedDate",
                   "deletion-dates")
        return
    probe.ok("deletion poll", f"GET bibs by deletedDate (the last {DAYS[0]} days, by day) lists {len(entries)}"
             f"{'+' if len(entries) >= SAMPLE else ''} deleted bibs")


def _export(probe: Probe, adapter: SierraAdapter, clock: datetime, entries: list[dict[str, Any]]) -> None:
    """The full load's bibs/marc export of a few ids from the sample (or the lowest ids)."""
    ids = sorted(int(e["id"]) for e in entries if str(e.get("id", "")).isdigit())
    start = ids[0] if ids else 0
    try:
        block = adapter.client.export_block(start, EXPORT_SAMPLE, params=dict(probe.partner.options.export.params),
                                            tries=1)
    except RateLimited as exc:
        probe.warn("export", f"bibs/marc is rate limited: {one_line(exc.cause)}", "the full load waits as the "
                   "server says (options.export.rate_limit_wait); run the check again later", "rate-limited")
        return
    except SierraServerError as exc:
        if exc.code == EXPORT_FAILED:  # one bib bib2Marc cannot convert: the full load works round it
            probe.warn("export", f"GET bibs/marc of {EXPORT_SAMPLE} ids from {start} answered code 135 (bib2Marc "
                       "failed): the full load cuts such a block down to the bib and reads that bib as "
                       "MARC-in-JSON, at the cost of extra requests", "the library can ask its vendor about the "
                       "bibs bib2Marc cannot convert", "export-failed")
            return
        probe.fail("export", f"GET bibs/marc of {EXPORT_SAMPLE} ids from {start}: {one_line(exc.cause, 160)}",
                   "the full load needs the bibs/marc export working on the server", "export-failed")
        return
    except HarvestError as exc:
        probe.fail("export", f"GET bibs/marc of {EXPORT_SAMPLE} ids from {start}: {one_line(exc.cause)}",
                   "the full load needs the bibs/marc export (the API key's permission to use it)", "export-failed")
        return
    if block is None:
        probe.info("export", f"bibs/marc lists no bib from id {start} (404/107)")
        return
    decoded, _ = decode_block(block)
    items: list[HarvestItem] = []
    for d in decoded:
        stamp = d.stamp or clock
        if d.fast is not None and d.bib_id:
            items.append(marc.fast_item(d.fast, d.bib_id, stamp, adapter.validation))
        elif d.record is not None and d.bib_id:
            items.append(marc.to_item(d.record, d.bib_id, stamp, adapter.validation))
        else:
            items.append(Rejected(d.bib_id or "(no bib id)", d.problem or "MARC: no bib id", "", stamp, marc.PREFIX))
    inputs, deleted = block.input_records, block.deleted_records or 0
    probe.ok("export", f"bibs/marc of {EXPORT_SAMPLE} ids from {start}: {inputs} in, {block.output_records} "
             f"MARC records out ({deleted} deleted)")
    live = (inputs or 0) - deleted
    if live > 0 and not decoded:
        probe.fail("export", f"the export wrote no MARC for {live} live bib(s) it covered", "the full load reads "
                   "the MARC of every bib from the export: the server's bib2Marc (or the key's permission) must "
                   "produce it", "no-marc")
        return
    probe.validated(items, "the exported bibs")
