"""The readiness probes of an OAI-PMH endpoint (readiness.py; declared in oai/spec.py).

What a harvest relies on, in the order it relies on it: the credentials and Identify (the
granularity its windows are written in, whether deletions are kept), ListMetadataFormats
(the prefix the harvest would ask for), the sets the registry names, the whole list's first
page (a repository refusing long windows), a small window listed by ListIdentifiers (does
``from``/``until`` at the declared granularity really filter?) and by the harvest's own
verb (ListRecords, or GetRecord per header for ``identifiers_then_get``), whose records go
through the partner's validation, and the whole list's resumptionToken used again after a
pause. At most about fifteen requests.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta, timezone
from typing import cast

from partner_harvest.errors import HarvestError, PartnerHttpError, PartnerProtocolError
from partner_harvest.oai import parse
from partner_harvest.oai.client import Forbidden, WindowTooLarge
from partner_harvest.oai.errors import BadArgument, BadResumptionToken, NoSetHierarchy
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.oai.parse import DAY_GRANULARITY, format_datestamp
from partner_harvest.readiness import Probe, listed, one_line
from partner_harvest.records import HarvestItem

WINDOW_PAGES = 3  # pages of the probe window read per verb
SET_PAGES = 3  # pages of ListSets read to find the registry's sets
GET_RECORDS = 3  # GetRecords of an identifiers_then_get partner
RECENT_DAYS = (1, 7, 30)  # windows back from the clock tried when the whole list is refused
CONNECTIONS_DOC = "docs/operator/connections.md"


def check(probe: Probe) -> None:
    adapter = cast(OaiAdapter, probe.adapter)
    identify = _identify(probe, adapter)
    if identify is None:
        return
    prefix = _formats(probe, adapter)
    if prefix is None:
        return
    if not _sets(probe, adapter):
        return
    spec = adapter.selection.lists[0]
    where = f" of set {spec}" if spec else ""
    pages = adapter.client.list_pages("ListIdentifiers", metadata_prefix=prefix, set_spec=spec, from_=None,
                                      until=None, ahead=False)
    with closing(pages):
        first = _whole_list(probe, adapter, pages, where)
        headers = [h for h in (first.items if first else []) if isinstance(h, parse.OaiHeader) and h.datestamp]
        if first is None or not headers:
            headers = _recent(probe, adapter, prefix, spec, identify, where)
        if headers:
            _window(probe, adapter, prefix, spec, identify, headers)
        if first is not None:
            _token_after_pause(probe, adapter, pages, first)


# -- Identify and credentials -------------------------------------------------------------

def _status(exc: HarvestError) -> int | None:
    match = re.match(r"HTTP (\d{3})", exc.cause)
    return int(match.group(1)) if match else None


def _identify(probe: Probe, adapter: OaiAdapter) -> parse.Identify | None:
    credentials = getattr(adapter.client.session, "credentials", None)
    try:
        identify = adapter.client.identify()
    except HarvestError as exc:
        status = _status(exc)
        if status in (401, 403) and credentials is not None:
            probe.fail("credentials", f"Identify answered HTTP {status} with the credentials sent as "
                       f"{credentials.describe()}",
                       "check the Connection's password, and its login or extras auth/auth_header/auth_param "
                       f"against the form the partner's endpoint takes ({CONNECTIONS_DOC})", "credentials-refused")
        elif status in (401, 403):
            probe.fail("credentials", f"Identify answered HTTP {status}: the endpoint wants credentials and none "
                       "are configured",
                       "put the partner's secret in the Connection's password and say how it travels in the extra "
                       f"auth (basic with a login, bearer, header, query; {CONNECTIONS_DOC})", "credentials-required")
        else:
            probe.fail("Identify", one_line(exc.cause), "the base URL must answer ?verb=Identify with OAI-PMH 2.0 "
                       "XML (the Connection's host is the URL before ?verb=)", "identify-failed")
        return None
    if credentials is not None:
        probe.ok("credentials", f"accepted (sent as {credentials.describe()})")
    earliest = identify.earliest_datestamp.isoformat() if identify.earliest_datestamp else "not given"
    probe.ok("Identify", f"{identify.repository_name!r}, OAI-PMH {identify.protocol_version}, granularity "
             f"{identify.granularity}, earliest datestamp {earliest}, clock {identify.response_date:%Y-%m-%dT%H:%M:%SZ}")
    if identify.protocol_version.strip() != "2.0":
        probe.warn("protocol version", f"Identify says protocolVersion {identify.protocol_version!r}",
                   "the harvester speaks OAI-PMH 2.0", "protocol-version")
    deleted = identify.deleted_record.strip().lower()
    if deleted == "persistent":
        probe.ok("deletions", "deletedRecord=persistent: a deleted record arrives as a deleted header and is purged "
                 "the night it is deleted")
    elif deleted == "transient":
        probe.warn("deletions", "deletedRecord=transient: the repository may forget a deletion before a night "
                   "harvests it", "the weekly reconcile removes what no night saw; keeping deletions "
                   "(persistent) removes them the same night", "deletions-transient")
    else:
        probe.warn("deletions", f"deletedRecord={deleted}: deletions never appear in the lists; only the weekly "
                   "reconcile (a full ListIdentifiers and a GetRecord per vanished record) removes deleted records, "
                   "up to a week late", "the partner's repository can keep deletions (deletedRecord persistent or "
                   "transient)", "no-deletions")
    return identify


# -- formats and sets ---------------------------------------------------------------------

def _formats(probe: Probe, adapter: OaiAdapter) -> str | None:
    configured = probe.partner.metadata_prefix
    try:
        offered = adapter.client.metadata_prefixes()
    except HarvestError as exc:
        probe.fail("metadata formats", f"ListMetadataFormats: {one_line(exc.cause)}",
                   "the repository must answer ListMetadataFormats (oai_dc at least)", "formats-failed")
        return None
    chosen = configured if configured != "auto" else ("lido" if "lido" in offered else "oai_dc")
    if chosen not in offered:
        probe.fail("metadata formats", f"the harvest would ask for {chosen!r}; the repository offers "
                   f"{listed(offered)}", "set the registry's metadata_prefix to one it offers (or auto)",
                   "prefix-not-offered")
        return None
    how = " (auto: LIDO where offered, else oai_dc)" if configured == "auto" else ""
    probe.ok("metadata formats", f"offers {listed(offered, 8)}; the harvest asks for {chosen}{how}")
    return chosen


def _sets(probe: Probe, adapter: OaiAdapter) -> bool:
    """The registry's sets are the repository's; False when the lists cannot be asked for."""
    selection = adapter.selection
    named = [spec for spec in (*selection.lists, *selection.excluded) if spec is not None]
    if not named:
        return True
    found: set[str] = set()
    token: str | None = None
    try:
        for _ in range(SET_PAGES):
            params = {"verb": "ListSets", **({"resumptionToken": token} if token else {})}
            page = cast(parse.ListPage, adapter.client.call(params, parse.parse_list_sets))
            found.update(item.spec for item in page.items if isinstance(item, parse.OaiSet))
            token = page.token
            if not token:
                break
    except PartnerProtocolError as exc:
        if isinstance(exc.__cause__, NoSetHierarchy):
            probe.fail("sets", f"the registry names sets ({listed(named)}); the repository has none "
                       "(noSetHierarchy)", "remove set, sets and exclude_sets from the registry entry",
                       "sets-unsupported")
            return False
        probe.fail("sets", f"ListSets: {one_line(exc.cause)}", "the repository must answer ListSets",
                   "sets-failed")
        return False
    except HarvestError as exc:
        probe.fail("sets", f"ListSets: {one_line(exc.cause)}", "the repository must answer ListSets", "sets-failed")
        return False
    unknown = [spec for spec in named if spec not in found]
    if unknown and token is None:
        probe.fail("sets", f"not listed by ListSets: {listed(unknown)} (it lists {len(found)}: "
                   f"{listed(sorted(found))})", "correct the registry's set, sets or exclude_sets", "set-unknown")
        return not set(selection.lists) & set(unknown)
    if unknown:
        probe.info("sets", f"not among the first {SET_PAGES} pages of ListSets: {listed(unknown)}")
    else:
        probe.ok("sets", f"the repository lists {listed(named)}")
    return True


# -- lists ------------------------------------------------------------------------------

def _whole_list(probe: Probe, adapter: OaiAdapter, pages: Iterator[parse.ListPage], where: str) -> parse.ListPage | None:
    """The first page of the whole list (no from, no until): the sample and the token chain."""
    try:
        first = next(pages, None)
    except WindowTooLarge as exc:
        probe.warn("long windows", f"the repository refuses the whole list{where} as one request "
                   f"({one_line(exc.cause, 160)})", "nothing to do: the harvest cuts such windows in halves, up to "
                   f"options.oai.max_window_splits={adapter.max_window_splits} times; the partner could allow "
                   "longer ones", "window-refused")
        return None
    except HarvestError as exc:
        probe.fail("ListIdentifiers", f"the whole list{where}: {one_line(exc.cause)}",
                   "the repository must answer ListIdentifiers", "list-identifiers-failed")
        return None
    if first is None or not first.items:
        probe.warn("records", f"the list{where} is empty (noRecordsMatch): nothing to harvest",
                   "check the registry's sets, or that the repository publishes records", "no-records")
        return None
    size = f" of {first.complete_list_size}" if first.complete_list_size is not None else ""
    probe.ok("ListIdentifiers", f"the whole list{where} answers: a first page of {len(first.items)} headers{size}")
    return first


def _recent(probe: Probe, adapter: OaiAdapter, prefix: str, spec: str | None, identify: parse.Identify,
            where: str) -> list[parse.OaiHeader]:
    """Headers of the last days before the repository's clock (1, then 7, then 30: the first
    that lists some), when the whole list was refused as too large."""
    if not probe.named("window-refused"):
        return []  # the whole list answered (empty, or it failed: said already)
    clock = identify.response_date
    for days in RECENT_DAYS:
        try:
            items = _list("ListIdentifiers", adapter, prefix, spec, clock - timedelta(days=days), clock,
                          _granularity(identify), 1)[0]
        except HarvestError as exc:
            probe.warn("window", f"the last {days} day(s){where} are refused too ({one_line(exc.cause, 160)}): no "
                       "window to compare the lists on", "the harvest cuts further; the partner could allow longer "
                       "windows", "window-refused")
            return []
        headers = [h for h in items if isinstance(h, parse.OaiHeader) and h.datestamp]
        if headers:
            return headers
    probe.info("window", f"nothing{where} was stamped in the last {RECENT_DAYS[-1]} days: no window to compare the "
               "lists on")
    return []


def _granularity(identify: parse.Identify) -> str:
    """The granularity the harvest writes its windows in (as OaiAdapter.clock reads Identify)."""
    return DAY_GRANULARITY if identify.granularity == DAY_GRANULARITY else parse.SECOND_GRANULARITY


def _list(verb: str, adapter: OaiAdapter, prefix: str, spec: str | None, low: datetime, high: datetime,
          granularity: str, limit: int = WINDOW_PAGES) -> tuple[list[parse.ListItem], bool]:
    """Up to ``limit`` pages of ``verb`` over low..high; whether the list ended within them."""
    items: list[parse.ListItem] = []
    with closing(adapter.client.list_pages(verb, metadata_prefix=prefix, set_spec=spec,
                                           from_=format_datestamp(low, granularity),
                                           until=format_datestamp(high, granularity), ahead=False)) as pages:
        for count, page in enumerate(pages, 1):
            items.extend(page.items)
            if not page.token:
                return items, True
            if count >= limit:
                break
    return items, False


def _window(probe: Probe, adapter: OaiAdapter, prefix: str, spec: str | None, identify: parse.Identify,
            sample: list[parse.OaiHeader]) -> None:
    """The day of the sample's middle live header, listed by ListIdentifiers (must lie inside it)
    and by the harvest's own verb (the same identifiers; records through validation)."""
    granularity = _granularity(identify)
    stamps = sorted(cast(datetime, h.datestamp) for h in sample)
    live = sorted(cast(datetime, h.datestamp) for h in sample if not h.deleted) or stamps  # records to validate
    day = live[len(live) // 2].astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    low, high = day, day + timedelta(days=1) - timedelta(seconds=1)
    shown = f"from={format_datestamp(low, granularity)} until={format_datestamp(high, granularity)}"
    expected = sum(1 for stamp in stamps if low <= stamp <= high)
    try:
        items, complete = _list("ListIdentifiers", adapter, prefix, spec, low, high, granularity)
    except WindowTooLarge as exc:
        probe.warn("window", f"ListIdentifiers {shown} is refused as too large ({one_line(exc.cause, 160)})",
                   "the harvest cuts further; the partner could allow longer windows", "window-refused")
        return
    except PartnerProtocolError as exc:
        if isinstance(exc.__cause__, BadArgument):
            probe.fail("granularity", f"Identify declares {identify.granularity}, and ListIdentifiers {shown} "
                       f"answers {one_line(exc.cause, 160)}", "the partner's Identify must declare the granularity "
                       "its lists accept (YYYY-MM-DD or YYYY-MM-DDThh:mm:ssZ)", "granularity-refused")
            return
        probe.fail("ListIdentifiers", f"{shown}: {one_line(exc.cause)}", "the repository must answer "
                   "ListIdentifiers of a window", "list-identifiers-failed")
        return
    except HarvestError as exc:
        probe.fail("ListIdentifiers", f"{shown}: {one_line(exc.cause)}", "the repository must answer "
                   "ListIdentifiers of a window", "list-identifiers-failed")
        return
    headers = [h for h in items if isinstance(h, parse.OaiHeader) and h.identifier]
    end = high + (timedelta(days=1) if granularity == DAY_GRANULARITY else timedelta(seconds=1))
    outside = [h for h in headers if h.datestamp is not None and not low <= h.datestamp < end]
    if outside:
        before = [h for h in outside if cast(datetime, h.datestamp) < low]
        which, fault = ("from", "from-ignored") if before else ("until", "until-ignored")
        example = outside[0]
        probe.fail("window", f"ListIdentifiers {shown} lists {len(outside)} of {len(headers)} headers stamped "
                   f"outside it (e.g. {example.identifier} at {example.datestamp_text}): the repository ignores "
                   f"{which}", "the repository must select by from and until (OAI-PMH 2.0, 3.3.1); until it "
                   f"does, every night lists everything {'up to' if before else 'from'} the window's "
                   f"{'end' if before else 'start'} again", fault)
        return
    if not headers and expected:
        probe.fail("window", f"ListIdentifiers {shown} lists nothing, though the whole list shows {expected} "
                   "header(s) stamped inside it", "the repository must select by from and until at the granularity "
                   "Identify declares", "window-empty")
        return
    probe.ok("window", f"ListIdentifiers {shown} lists {len(headers)}{'' if complete else '+'} headers, every one "
             f"stamped inside it: from and until filter at {granularity}")
    if adapter.method == "identifiers_then_get":
        _get_records(probe, adapter, prefix, headers)
    else:
        _list_records(probe, adapter, prefix, spec, low, high, granularity, shown, headers, complete)


def _list_records(probe: Probe, adapter: OaiAdapter, prefix: str, spec: str | None, low: datetime,
                  high: datetime, granularity: str, shown: str, headers: list[parse.OaiHeader],
                  complete: bool) -> None:
    try:
        items, records_complete = _list("ListRecords", adapter, prefix, spec, low, high, granularity)
    except HarvestError as exc:
        probe.fail("ListRecords", f"ListRecords {shown}: {one_line(exc.cause)}, while ListIdentifiers of the "
                   "same window answers", "set options.oai.method: identifiers_then_get in the registry "
                   "(ListIdentifiers, then GetRecord of each record), or have ListRecords repaired",
                   "list-records-broken")
        return
    records = cast(list[HarvestItem], items)
    if complete and records_complete:
        ids = {str(h.identifier) for h in headers}
        got = {item.identifier for item in records}
        if ids != got:
            differ = sorted(ids ^ got)
            probe.warn("ListRecords", f"ListRecords {shown} lists {len(got)} records, ListIdentifiers {len(ids)} "
                       f"headers; in one only: {listed(differ)}", "the two lists of one window must agree "
                       "(the completeness witness counts one against the other)", "lists-differ")
        else:
            probe.ok("ListRecords", f"ListRecords {shown} lists the same {len(got)} identifiers")
    else:
        probe.ok("ListRecords", f"ListRecords {shown} answers ({len(records)} items in {WINDOW_PAGES} pages)")
    probe.validated(records, "the window's records")


def _get_records(probe: Probe, adapter: OaiAdapter, prefix: str, headers: list[parse.OaiHeader]) -> None:
    live = [h for h in headers if not h.deleted][:GET_RECORDS]
    if not live:
        probe.info("GetRecord", "the window lists no live header: GetRecord not probed")
        return
    items: list[HarvestItem] = []
    for header in live:
        params = {"verb": "GetRecord", "identifier": str(header.identifier), "metadataPrefix": prefix}
        try:
            items.append(cast(HarvestItem, adapter.client.call(
                params, lambda c: parse.parse_get_record(c, prefix, adapter.client.validation))))
        except Forbidden as exc:
            probe.fail("GetRecord", f"GetRecord of {header.identifier}: {one_line(exc.cause)}",
                       "options.oai.method identifiers_then_get needs GetRecord; have the route opened, or use "
                       "list_records", "get-record-forbidden")
            return
        except (PartnerHttpError, PartnerProtocolError) as exc:
            probe.fail("GetRecord", f"GetRecord of {header.identifier}: {one_line(exc.cause)}",
                       "options.oai.method identifiers_then_get needs GetRecord of each listed identifier",
                       "get-record-broken")
            return
    probe.ok("GetRecord", f"GetRecord answers for {len(items)} listed identifier(s) (options.oai.method "
             "identifiers_then_get)")
    probe.validated(items, "the records fetched")


def _token_after_pause(probe: Probe, adapter: OaiAdapter, pages: Iterator[parse.ListPage],
                       first: parse.ListPage) -> None:
    if not first.token:
        probe.info("resumptionToken", "the whole list fits one page: no token to probe")
        return
    pause = probe.settings.pause
    expires = f" (the token says it expires {first.expiration_date})" if first.expiration_date else ""
    probe.sleep(pause)
    try:
        second = next(pages, None)
    except BadResumptionToken as exc:
        probe.warn("resumptionToken", f"the whole list's token no longer works after a pause of {pause:g} s, "
                   f"with other requests between{expires}: {exc}", "a harvest that pauses longer (a slow page, a "
                   "Retry-After) restarts its window, up to max_token_restarts="
                   f"{probe.partner.max_token_restarts} times; the partner could keep tokens longer",
                   "token-expires")
        return
    except HarvestError as exc:
        probe.warn("resumptionToken", f"the whole list's second page after a pause of {pause:g} s: "
                   f"{one_line(exc.cause)}", "a harvest meeting this fails the night and retries",
                   "token-failed")
        return
    probe.ok("resumptionToken", f"still works after a pause of {pause:g} s with other requests between{expires} "
             f"({len(second.items) if second else 0} headers on the second page)")
