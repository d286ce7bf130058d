"""A loopback OAI-PMH 2.0 endpoint over a SimulatedRepository.

Strict about arguments (so tests catch sloppy clients), quick to render (so a
harvest benchmark measures the client), and able to misbehave on demand the way
real partner endpoints do: expired or repeating tokens, empty pages, 503s with
Retry-After, HTML or truncated bodies, hostile DTDs, offset paging that re-runs the
query on every page, and staff edits between the pages of a list.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import itertools
import json
import re
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast
from urllib.parse import SplitResult, parse_qsl, urlsplit

from ..clock import iso_seconds
from ..control import CONTROL_PREFIX, ControlledServer
from ..loopback import TEXT_TYPE, LoopbackHandler, Response, query_log_form, status_phrase
from . import payloads
from .collection import ID_PREFIX, LEAF_SPECS_BY_KIND, SET_SPECS_BY_KIND, SETS, SimulatedRepository, parse_oai_date

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
XML_CONTENT_TYPE = "text/xml; charset=utf-8"
HTML_CONTENT_TYPE = "text/html; charset=utf-8"
HOSTILE_KINDS = ("billion_laughs", "xxe")
# How the resumptionToken element is written. Real servers differ: whitespace around the
# token, CDATA, character references, comments mentioning a token (a harvester that reads
# the token off the raw bytes must not be misled). "varied" rotates the first five page by
# page; "stale-comment" leaves an old token in a comment on the last page, where the
# element is absent.
TOKEN_MARKUPS = ("plain", "padded", "charrefs", "cdata", "decoy", "varied", "stale-comment")
# completeListSize is optional (OAI-PMH 2.0, 3.5): a real repository may leave it out (I13).
# "understated": a tenth of the list (a broken count, or a chain that never ends)
LIST_SIZES = ("exact", "omitted", "understated")
# How a repository refuses a list request whose window it finds too large (users of other
# harvesters report HTTP 413 "please restrict the request period" from a national library
# and 422 on monthly windows from a research repository; others answer badArgument).
WINDOW_REFUSALS = ("413", "422", "badArgument")
# The credential forms a repository may require (docs/operator/connections.md): HTTP Basic,
# a Bearer token, a header of its own (Axiell's Token), a query parameter (FOLIO's apikey).
CREDENTIAL_FORMS = ("basic", "bearer", "header", "query")
_ROTATION = TOKEN_MARKUPS[:5]
# attack_next: bodies that try to exhaust the harvesting worker rather than fool its parser.
ATTACK_KINDS = ("gzip_bomb", "endless_body", "slow_drip", "deep_xml", "wide_xml", "many_attributes")
_ATTACK_SIZES = {"gzip_bomb": 1 << 30, "deep_xml": 100_000, "wide_xml": 5_000_000,
                 "many_attributes": 5_000_000}
_XML_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    f'<OAI-PMH xmlns="{OAI_NS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    f'xsi:schemaLocation="{OAI_NS} http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd">\n'
)
_VERB_ARGS: dict[str, tuple[frozenset[str], frozenset[str]]] = {  # verb -> (required, optional)
    "Identify": (frozenset(), frozenset()),
    "ListMetadataFormats": (frozenset(), frozenset({"identifier"})),
    "ListSets": (frozenset(), frozenset()),
    "GetRecord": (frozenset({"identifier", "metadataPrefix"}), frozenset()),
    "ListIdentifiers": (frozenset({"metadataPrefix"}), frozenset({"from", "until", "set"})),
    "ListRecords": (frozenset({"metadataPrefix"}), frozenset({"from", "until", "set"})),
}
_RESUMABLE = frozenset({"ListSets", "ListIdentifiers", "ListRecords"})
# Token text needs URL encoding on purpose: "!", "/" and "+" (a raw "+" decodes to a space).
_TOKEN_RE = re.compile(r"c(\d+)!(\d+)/([A-Za-z0-9_]+)\+([0-9a-z]+)(?:~x*)?")
_SET_XML = {header_sets: {kind: "".join(f"<setSpec>{s}</setSpec>" for s in specs) for kind, specs in by_kind.items()}
            for header_sets, by_kind in (("path", SET_SPECS_BY_KIND), ("leaf", LEAF_SPECS_BY_KIND))}


class OaiError(Exception):
    """An OAI-PMH protocol error, answered with HTTP 200 and an <error> element."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Chain:
    """Server-side snapshot of one list request; tokens point into it."""

    chain_id: int
    verb: str
    prefix: str
    numbers: array
    page_size: int
    expire_after: int | None = None
    pages_served: int = 0
    # Re-query mode: (from, until, set) re-run on every page against the current state.
    query: tuple[str | None, str | None, str | None] | None = None
    # Staff edits between pages: (pages served first, mutation spec), applied once.
    mutate_after: tuple[int, dict[str, Any]] | None = None
    end_after: int | None = None  # the list stops short: no token after this many pages


def _attr(text: str) -> str:
    return payloads.escape(text)


def _truncate(xml: str) -> str:
    """Cut the document in the middle of a record (or in half if it has none)."""
    starts = [m.start() for m in re.finditer(r"<record>|<header[ >]", xml)]
    if not starts:
        return xml[: len(xml) // 2]
    start = starts[len(starts) // 2]
    end = xml.find("</record>", start)
    end = xml.find("</header>", start) if end < 0 else end
    return xml[: start + max(12, (end - start) // 2)]


def _hostile(xml: str, kind: str) -> str:
    """Add an entity-expansion or external-entity DTD and reference it in content."""
    if kind == "billion_laughs":
        entities = ['<!ENTITY lol0 "lol">'] + [
            f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10)]
        ref = "&lol9;"
    else:
        entities = ['<!ENTITY xxe SYSTEM "file:///etc/hostname">']
        ref = "&xxe;"
    declaration, _, rest = xml.partition("\n")
    xml = f"{declaration}\n<!DOCTYPE OAI-PMH [\n" + "\n".join(entities) + "\n]>\n" + rest
    for marker in ("<dc:title>", '<lido:appellationValue lido:pref="preferred">', "<setSpec>",
                   "<repositoryName>"):
        if marker in xml:
            return xml.replace(marker, marker + ref, 1)
    return xml.replace("</request>", ref + "</request>", 1)


def _token_element(attributes: str, token: str, markup: str) -> str:
    """A resumptionToken element written the way `markup` says (TOKEN_MARKUPS)."""
    if not token:
        closed = "></resumptionToken>" if markup in ("padded", "cdata") else "/>"
        return f"<resumptionToken {attributes}{closed}\n"
    if markup == "padded":
        text = f"\n      {payloads.escape(token)}\n    "
    elif markup == "charrefs":
        text = "".join(c if c.isalnum() else f"&#{ord(c)};" for c in token)
    elif markup == "cdata":
        text = f"<![CDATA[{token}]]>"
    else:
        text = payloads.escape(token)
    element = f"<resumptionToken {attributes}>{text}</resumptionToken>\n"
    if markup == "decoy":
        element += f"<!-- the previous page's <resumptionToken>{payloads.escape(token)}~old</resumptionToken> -->\n"
    return element


def _accepts_gzip(header: str | None) -> bool:
    for part in (header or "").split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def _gzip_bomb(head: bytes, size: int) -> bytes:
    """A gzip body inflating to `size` bytes: members of 1 MiB of whitespace, ~1 KiB each."""
    block = gzip.compress(b" " * (1 << 20), compresslevel=9, mtime=0)
    return b"".join([gzip.compress(head, mtime=0), block * max(1, size >> 20),
                     gzip.compress(b"</OAI-PMH>\n", mtime=0)])


def _json(status: int, payload: dict[str, Any]) -> Response:
    return Response(status, json.dumps(payload).encode(), "application/json")


class OaiSimulator(ControlledServer):
    """Serve `repo` as an OAI-PMH repository on loopback; use as a context manager.

    ``keep_alive_timeout``: idle keep-alive connections close after this many seconds,
    as Apache's default 5 (loopback.py; None: never)."""

    _base_path = "/oai"
    _thread_prefix = "oai-simulator"
    _json_reply = staticmethod(_json)

    def __init__(self, repo: SimulatedRepository, host: str = "127.0.0.1", port: int = 0, *,
                 token_lifetime: timedelta = timedelta(hours=1), max_chains: int = 64,
                 response_delay_ms: float = 0.0, token_markup: str = "plain", list_size: str = "exact",
                 keep_alive_timeout: float | None = 5.0) -> None:
        super().__init__(host, port, _Handler, repo, keep_alive_timeout=keep_alive_timeout)
        self.token_markup = "plain"
        self.set_token_markup(token_markup)
        if list_size not in LIST_SIZES:
            raise ValueError(f"list_size must be one of {LIST_SIZES}")
        self.list_size = list_size
        self.repo = repo
        self.token_lifetime = token_lifetime
        self.max_chains = max_chains
        self.requests_served = 0
        self.response_delay_ms = 0.0
        self._changed = threading.Condition(self._lock)  # in_flight or the delay changed
        self.set_response_delay(response_delay_ms)
        self.in_flight = 0  # OAI requests being answered right now (over HTTP)
        self.max_in_flight = 0  # the most seen at once since start or reset_in_flight()
        self.arrivals: list[float] = []  # time.monotonic() of each OAI request's arrival (politeness tests)
        self._chains: OrderedDict[int, _Chain] = OrderedDict()
        self._next_chain = 1
        self._nonce = 0
        self._token_padding = 0  # pad_tokens: bytes of filler each resumptionToken carries
        self._fail_count = 0
        self._fail_status = 503
        self._fail_retry_after: str | None = None
        self._html_next = False
        self._broken_next = False
        self._hostile_next: str | None = None
        self._expire_after_pending: int | None = None
        self._repeat_token = False
        self._empty_pages = False
        self._requery = False
        self._mutate_pending: tuple[int, dict[str, Any]] | None = None
        self._end_after_pending: int | None = None
        self.mutations: list[dict[str, list[str]]] = []  # what mutate_after_pages did, in order
        self._attack: dict[str, Any] | None = None
        # Real servers send OAI error bodies with non-200 statuses (a quiet window answered
        # noRecordsMatch with HTTP 422): OAI error code -> the HTTP status it is served with.
        self.error_statuses: dict[str, int] = {}
        self._refuse_windows: tuple[int, str] | None = None  # (longest window in seconds, how)
        self._credentials: tuple[str, str, str | None] | None = None  # (form, secret, login or name)
        self.refused_credentials = 0  # OAI requests answered 401 for missing or wrong credentials
        self.broken_verbs: dict[str, int] = {}  # verb -> the HTTP status it always answers
        self._delete_on_get: set[str] = set()  # records deleted when their GetRecord arrives
        self.ignores_from = False  # list requests answer as if they carried no from (ignore_from)
        self.announced_granularity: str | None = None  # what Identify declares, if not the truth

    # ------------------------------------------------- access: credentials, broken routes
    def require_credentials(self, form: str | None, secret: str = "", *, login: str | None = None,
                            name: str | None = None) -> None:
        """Answer OAI requests without the credential 401 (form None: none needed). ``basic``:
        login and secret; ``bearer``: Authorization: Bearer; ``header``: header ``name``
        carries it; ``query``: parameter ``name`` on every request, continuations too (it is
        taken off before the OAI-PMH arguments are checked, as an API gateway in front does)."""
        if form is not None and form not in CREDENTIAL_FORMS:
            raise ValueError(f"form must be one of {CREDENTIAL_FORMS}")
        with self._lock:
            self._credentials = None if form is None else (form, secret, login if form == "basic" else name)

    def break_verb(self, verb: str, status: int | None = 500) -> None:
        """``verb`` always answers HTTP ``status`` with an HTML page (None: served again), the
        others as usual: a ListRecords that breaks while ListIdentifiers and GetRecord work,
        a GetRecord route that answers 403."""
        with self._lock:
            if status is None:
                self.broken_verbs.pop(verb, None)
            else:
                self.broken_verbs[verb] = int(status)

    def ignore_from(self, on: bool = True) -> None:
        """While on, ListRecords and ListIdentifiers accept ``from`` and list as if it were not
        given (a repository whose database query drops the argument): every incremental
        window lists everything up to ``until``."""
        with self._lock:
            self.ignores_from = on

    def announce_granularity(self, granularity: str | None) -> None:
        """Identify declares ``granularity`` ("day" or "seconds"; None: the repository's own)
        while the lists keep accepting only the repository's: a day repository declaring
        seconds answers a seconds-granular from with badArgument."""
        if granularity is not None and granularity not in ("day", "seconds"):
            raise ValueError("granularity must be day or seconds")
        with self._lock:
            self.announced_granularity = granularity

    def delete_on_get(self, identifiers: list[str]) -> None:
        """These records are deleted the moment their GetRecord arrives (one shot each): a
        record listed by ListIdentifiers and gone by the GetRecord that follows."""
        with self._lock:
            self._delete_on_get.update(identifiers)

    def admit(self, headers: Any, pairs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], Response | None]:
        """The OAI arguments without a query credential, and the 401 a request without the
        required credential gets (None: admitted)."""
        required = self._credentials
        if required is None:
            return pairs, None
        form, secret, name = required
        if form == "query":
            given = [value for key, value in pairs if key == name]
            pairs = [(key, value) for key, value in pairs if key != name]
            ok = len(given) == 1 and hmac.compare_digest(given[0], secret)
        else:
            expected = {"basic": "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode(),
                        "bearer": f"Bearer {secret}", "header": secret}[form]
            given_header = headers.get("Authorization" if form != "header" else str(name)) or ""
            ok = hmac.compare_digest(given_header.encode(), expected.encode())
        if ok:
            return pairs, None
        with self._lock:
            self.refused_credentials += 1
        challenge = {"WWW-Authenticate": 'Basic realm="oai"'} if form == "basic" else {}
        return pairs, Response(401, b"<html><body><h1>401 Unauthorized</h1></body></html>\n", HTML_CONTENT_TYPE,
                               challenge)

    # ------------------------------------------------- latency and concurrency
    def set_response_delay(self, ms: float) -> None:
        """Every OAI response over HTTP waits `ms` milliseconds first (a slow repository
        answers a page in 0.2-2 s); concurrent requests wait side by side."""
        if ms < 0:
            raise ValueError("response_delay_ms must be >= 0")
        with self._changed:
            self.response_delay_ms = float(ms)
            self._changed.notify_all()

    def reset_in_flight(self) -> None:
        """Start counting the most concurrent requests afresh (from those in flight now)."""
        with self._lock:
            self.max_in_flight = self.in_flight

    def wait_in_flight(self, count: int, timeout: float = 5.0) -> bool:
        """Block until `count` OAI requests are in flight at once (tests); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.in_flight < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def wait_arrivals(self, count: int, timeout: float = 30.0) -> bool:
        """Block until `count` OAI requests have arrived since start (tests); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.arrivals) >= count, timeout)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until no OAI request is in flight (tests); False on timeout.

        A client holds its whole answer a moment before the server's thread counts the
        request as done, so "the client returned" does not yet mean ``in_flight == 0``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.in_flight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    @contextmanager
    def _serving(self) -> Iterator[None]:
        """Count one OAI request in flight for as long as it is answered, delay included.

        The delay is re-read while waiting, so lowering it releases waiting requests."""
        started = time.monotonic()
        with self._changed:
            self.arrivals.append(started)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._changed.notify_all()
            while not self._stopping.is_set():
                remaining = self.response_delay_ms / 1000 - (time.monotonic() - started)
                if remaining <= 0:
                    break
                self._changed.wait(min(remaining, 0.2))  # 0.2: notice stop() too
        try:
            yield
        finally:
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    def _in_flight_report(self) -> dict[str, Any]:
        with self._lock:
            return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                    "response_delay_ms": self.response_delay_ms}

    # --------------------------------------------------------- misbehaviour
    def expire_tokens(self) -> None:
        """Every outstanding resumption token becomes invalid now."""
        with self._lock:
            self._chains.clear()

    def expire_tokens_after(self, pages: int) -> None:
        """The next token chain dies once it has served `pages` pages (one shot)."""
        if pages < 1:
            raise ValueError("pages must be >= 1")
        with self._lock:
            self._expire_after_pending = pages

    def fail_next(self, count: int, status: int = 503, retry_after: str | int | None = None) -> None:
        """The next `count` OAI requests get `status` with a small HTML body."""
        with self._lock:
            self._fail_count = count
            self._fail_status = status
            self._fail_retry_after = None if retry_after is None else str(retry_after)

    def set_error_status(self, code: str, status: int) -> None:
        """Serve OAI errors with `code` under HTTP `status` instead of 200 (the body stays
        the OAI-PMH error response); status 200 restores the protocol's own behaviour."""
        with self._lock:
            if status == 200:
                self.error_statuses.pop(code, None)
            else:
                self.error_statuses[code] = status

    def refuse_windows_longer_than(self, seconds: int | None, how: str = "413") -> None:
        """Refuse ListRecords/ListIdentifiers whose window (``from`` or the oldest record
        to ``until`` or the clock) spans more than `seconds`: HTTP 413 or 422 with an HTML
        page, or an OAI badArgument. None stops refusing."""
        if how not in WINDOW_REFUSALS:
            raise ValueError(f"how must be one of {WINDOW_REFUSALS}")
        with self._lock:
            self._refuse_windows = None if seconds is None else (int(seconds), how)

    def _window_refusal(self, pairs: list[tuple[str, str]]) -> Response | None:
        """The refusal of a too-large window, or None."""
        refuse = self._refuse_windows
        args = dict(pairs)
        if refuse is None or args.get("verb") not in ("ListRecords", "ListIdentifiers") or "resumptionToken" in args:
            return None
        try:
            low = parse_oai_date(args["from"])[0] if "from" in args else self.repo.earliest_stamp()
            high = parse_oai_date(args["until"])[0] + (86_399 if len(args["until"]) == 10 else 0) \
                if "until" in args else self.repo.clock_epoch
        except ValueError:
            return None  # the protocol's own badArgument answers it
        longest, how = refuse
        if high - low <= longest:
            return None
        text = f"please restrict the request period to at most {longest} seconds"
        if how == "badArgument":
            head = (f"{_XML_HEAD}<responseDate>{iso_seconds(self.repo.clock)}</responseDate>\n"
                    f"<request>{self.base_url}</request>\n")
            body = f'{head}<error code="badArgument">{text}</error>\n</OAI-PMH>\n'
            return Response(self.error_statuses.get("badArgument", 200), body.encode(), XML_CONTENT_TYPE)
        html = f"<html><head><title>{how} {status_phrase(int(how))}</title></head><body><p>{text}</p></body></html>\n"
        return Response(int(how), html.encode(), HTML_CONTENT_TYPE)

    def html_next(self) -> None:
        """The next OAI request gets 200 text/html (a CMS error page)."""
        with self._lock:
            self._html_next = True

    def broken_next(self) -> None:
        """The next OAI request gets 200 with XML cut off in the middle of a record."""
        with self._lock:
            self._broken_next = True

    def hostile_next(self, kind: str) -> None:
        """The next OAI response carries a hostile DTD: "billion_laughs" or "xxe"."""
        if kind not in HOSTILE_KINDS:
            raise ValueError(f"kind must be one of {HOSTILE_KINDS}")
        with self._lock:
            self._hostile_next = kind

    def pad_tokens(self, size: int) -> None:
        """Every resumptionToken from now on carries ``size`` bytes of filler (0: none).

        Nothing in OAI-PMH bounds a token's length: a hostile (or careless) repository may
        hand out megabytes a page, each one distinct (issue 23).
        """
        self._token_padding = max(0, int(size))

    def set_token_markup(self, markup: str) -> None:
        """How list pages write their resumptionToken (TOKEN_MARKUPS)."""
        if markup not in TOKEN_MARKUPS:
            raise ValueError(f"token markup must be one of {TOKEN_MARKUPS}")
        with self._lock:
            self.token_markup = markup

    def repeat_token(self, on: bool = True) -> None:
        """While on, continuation pages hand back the very token they were asked with."""
        with self._lock:
            self._repeat_token = on

    def empty_pages_with_token(self, on: bool = True) -> None:
        """While on, list responses hold no records but always a fresh token."""
        with self._lock:
            self._empty_pages = on

    def requery_pages(self, on: bool = True) -> None:
        """While on, new list chains re-run their query on every page (offset paging).

        Many database-backed servers keep no snapshot: the token holds the arguments and
        an offset. A record edited past ``until``, or vanished, mid-list then drops out
        and shifts every later record back by one, so one of them is never served.
        """
        with self._lock:
            self._requery = on

    def mutate_after_pages(self, pages: int, *, edit: int = 0, delete: int = 0,
                           edit_ids: list[str] | None = None, delete_ids: list[str] | None = None,
                           verb: str | None = None) -> None:
        """Staff work during a harvest: once the next list chain (of `verb`, if given) has
        served `pages` pages, edit/delete records before serving the next one (one shot).
        What was done is appended to ``mutations``."""
        if pages < 1:
            raise ValueError("pages must be >= 1")
        spec = {"edit": edit, "delete": delete, "edit_ids": list(edit_ids or ()),
                "delete_ids": list(delete_ids or ()), "verb": verb}
        with self._lock:
            self._mutate_pending = (pages, spec)

    def end_list_after(self, pages: int) -> None:
        """The next list chain ends silently after `pages` pages: no resumptionToken,
        while completeListSize still counts the whole list (one shot)."""
        if pages < 1:
            raise ValueError("pages must be >= 1")
        with self._lock:
            self._end_after_pending = pages

    def _mutate(self, spec: dict[str, Any]) -> None:
        repo = self.repo
        edited: list[str] = []
        deleted: list[str] = []
        with repo.lock:  # the next page sees all of it
            if spec["edit"]:
                edited += repo.edit(spec["edit"])
            if spec["edit_ids"]:
                edited += repo.edit_ids(spec["edit_ids"])
            if spec["delete"]:
                deleted += repo.delete(spec["delete"])
            if spec["delete_ids"]:
                deleted += repo.delete_ids(spec["delete_ids"])
        with self._lock:
            self.mutations.append({"edited": edited, "deleted": deleted})

    def _take_misbehaviour(self) -> tuple[str, Any]:
        if self._fail_count > 0:
            self._fail_count -= 1
            return "fail", (self._fail_status, self._fail_retry_after)
        if self._html_next:
            self._html_next = False
            return "html", None
        if self._broken_next:
            self._broken_next = False
            return "broken", None
        if self._hostile_next:
            kind, self._hostile_next = self._hostile_next, None
            return "hostile", kind
        return "", None

    def attack_next(self, kind: str, *, size: int | None = None, interval: float = 1.0,
                    verb: str | None = None, headers: bool = False) -> None:
        """The next OAI request (the next one with `verb`, if given) gets a hostile body.

        gzip_bomb: a gzip body of about size/1000 bytes that inflates to `size` bytes of
        XML whitespace (default 1 GiB); endless_body: XML that never ends; slow_drip: the
        real answer, one byte every `interval` seconds (with `headers`, the status line
        and headers drip too); deep_xml: elements nested `size` deep; wide_xml: `size`
        empty elements; many_attributes: `size` attributes, 1,000 per element.
        """
        if kind not in ATTACK_KINDS:
            raise ValueError(f"kind must be one of {ATTACK_KINDS}")
        with self._lock:
            self._attack = {"kind": kind, "size": size or _ATTACK_SIZES.get(kind, 0),
                            "interval": float(interval), "verb": verb, "headers": headers}

    def _take_attack(self, pairs: list[tuple[str, str]]) -> dict[str, Any] | None:
        attack = self._attack
        if attack is None or (attack["verb"] and ("verb", attack["verb"]) not in pairs):
            return None
        self._attack = None
        return attack

    def _attack_response(self, attack: dict[str, Any], pairs: list[tuple[str, str]]) -> Response:
        kind, size = attack["kind"], attack["size"]
        head = (f"{_XML_HEAD}<responseDate>{iso_seconds(self.repo.clock)}</responseDate>\n"
                f"<request>{self.base_url}</request>\n").encode()
        if kind == "gzip_bomb":
            return Response(200, _gzip_bomb(head, size), XML_CONTENT_TYPE, {"Content-Encoding": "gzip"})
        if kind == "endless_body":
            filler = b"<!-- " + b"-" * 65_000 + b" -->\n"
            return Response(200, b"", XML_CONTENT_TYPE, stream=itertools.chain([head], itertools.repeat(filler)))
        if kind == "slow_drip":
            body = b"".join(part.encode() for part in self._protocol(pairs))
            return Response(200, b"", XML_CONTENT_TYPE, stream=(body[i:i + 1] for i in range(len(body))),
                            pause=attack["interval"], drip_head=attack["headers"])
        if kind == "deep_xml":
            payload = b"<deep>" * size + b"</deep>" * size
        elif kind == "wide_xml":
            payload = b"<wide>" + b"<w/>" * size + b"</wide>"
        else:
            per = 1000
            tag = b"<w " + b" ".join(b'a%d=""' % i for i in range(per)) + b"/>"
            payload = b"<wide>" + tag * max(1, size // per) + b"</wide>"
        return Response(200, head + payload + b"\n</OAI-PMH>\n", XML_CONTENT_TYPE)

    # -------------------------------------------------------------- OAI-PMH
    def handle_oai(self, pairs: list[tuple[str, str]]) -> Response:
        """Answer one OAI-PMH request given its decoded arguments (no HTTP needed)."""
        with self._lock:
            self.requests.append(query_log_form(pairs))
            self.requests_served += 1
            attack = self._take_attack(pairs)
            mode: str
            detail: Any
            mode, detail = self._take_misbehaviour() if attack is None else ("", None)
        if attack is not None:
            return self._attack_response(attack, pairs)
        broken = self.broken_verbs.get(dict(pairs).get("verb", ""))
        if broken is not None and mode != "fail":
            mode, detail = "fail", (broken, None)
        if mode == "fail":
            status, retry_after = detail
            phrase = status_phrase(status)
            html = f"<html><head><title>{status} {phrase}</title></head><body><h1>{phrase}</h1></body></html>\n"
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return Response(status, html.encode(), HTML_CONTENT_TYPE, headers)
        if mode == "html":
            html = ("<!DOCTYPE html>\n<html><head><title>Collection portal</title></head><body>"
                    "<h1>Something went wrong</h1><p>The collection service is under maintenance.</p>"
                    "</body></html>\n")
            return Response(200, html.encode(), HTML_CONTENT_TYPE)
        refusal = self._window_refusal(pairs)
        if refusal is not None:
            return refusal
        parts = self._protocol(pairs)
        status = 200
        if self.error_statuses and len(parts) > 1 and parts[1].startswith('<error code="'):
            status = self.error_statuses.get(parts[1][len('<error code="'):].split('"', 1)[0], 200)
        if mode == "broken":
            parts = [_truncate("".join(parts))]
        elif mode == "hostile":
            parts = [_hostile("".join(parts), detail)]
        # Encoding parts one by one keeps ASCII parts compact and avoids one huge
        # intermediate str (which costs page faults on every page).
        return Response(status, b"".join([part.encode() for part in parts]), XML_CONTENT_TYPE)

    def _protocol(self, pairs: list[tuple[str, str]]) -> list[str]:
        """The response document as a list of string parts (joined once, later)."""
        try:
            verb, args = self._check_arguments(pairs)
            body: list[str] = getattr(self, f"_verb_{verb}")(args)
            echo = "".join(f' {k}="{_attr(v)}"' for k, v in [("verb", verb), *args.items()])
        except OaiError as error:
            body = [f'<error code="{error.code}">{payloads.escape(error.message)}</error>\n']
            # The spec says: after badVerb/badArgument echo only the base URL.
            echo = "" if error.code in ("badVerb", "badArgument") else "".join(
                f' {k}="{_attr(v)}"' for k, v in pairs)
        head = (f"{_XML_HEAD}<responseDate>{iso_seconds(self.repo.clock)}</responseDate>\n"
                f"<request{echo}>{self.base_url}</request>\n")
        return [head, *body, "</OAI-PMH>\n"]

    def _check_arguments(self, pairs: list[tuple[str, str]]) -> tuple[str, dict[str, str]]:
        args: dict[str, str] = {}
        for key, value in pairs:
            if key in args:
                raise OaiError("badVerb" if key == "verb" else "badArgument", f"repeated argument: {key}")
            args[key] = value
        verb = args.pop("verb", None)
        if verb is None:
            raise OaiError("badVerb", "missing verb")
        if verb not in _VERB_ARGS:
            raise OaiError("badVerb", f"illegal verb: {verb}")
        required, optional = _VERB_ARGS[verb]
        if "resumptionToken" in args:
            if verb not in _RESUMABLE:
                raise OaiError("badArgument", f"{verb} does not take a resumptionToken")
            if len(args) > 1:
                raise OaiError("badArgument", "resumptionToken is an exclusive argument")
            return verb, args
        illegal = sorted(args.keys() - required - optional)
        if illegal:
            raise OaiError("badArgument", f"illegal arguments for {verb}: {', '.join(illegal)}")
        missing = sorted(required - args.keys())
        if missing:
            raise OaiError("badArgument", f"missing arguments for {verb}: {', '.join(missing)}")
        empty = sorted(k for k, v in args.items() if not v)
        if empty:
            raise OaiError("badArgument", f"empty arguments: {', '.join(empty)}")
        return verb, args

    def _check_window(self, args: dict[str, str]) -> None:
        parsed: dict[str, tuple[int, str]] = {}
        for key in ("from", "until"):
            if key in args:
                try:
                    parsed[key] = parse_oai_date(args[key])
                except ValueError:
                    raise OaiError("badArgument", f"malformed {key}: {args[key]}") from None
                if parsed[key][1] == "seconds" and self.repo.granularity == "day":
                    raise OaiError("badArgument", f"{key} is finer than the repository granularity")
        if len(parsed) == 2:
            (low, low_g), (high, high_g) = parsed["from"], parsed["until"]
            if low_g != high_g:
                raise OaiError("badArgument", "from and until have different granularities")
            if low > high:
                raise OaiError("badArgument", "from is later than until")

    def _check_prefix(self, prefix: str) -> None:
        if prefix not in self.repo.formats:
            raise OaiError("cannotDisseminateFormat", f"unsupported metadataPrefix: {prefix}")

    def _verb_Identify(self, args: dict[str, str]) -> list[str]:
        repo = self.repo
        declared = self.announced_granularity or repo.granularity
        granularity = "YYYY-MM-DD" if declared == "day" else "YYYY-MM-DDThh:mm:ssZ"
        earliest = repo.announced_earliest_stamp()
        return [
            "<Identify><repositoryName>Simulated Museum of Art - collection online</repositoryName>"
            f"<baseURL>{self.base_url}</baseURL><protocolVersion>2.0</protocolVersion>"
            "<adminEmail>oai-admin@sim.example</adminEmail>"
            + (f"<earliestDatestamp>{repo.format_stamp(earliest)}</earliestDatestamp>" if earliest is not None else "")
            + f"<deletedRecord>{repo.deleted_record}</deletedRecord><granularity>{granularity}</granularity>"
            + "<compression>gzip</compression><description>"
            '<oai-identifier xmlns="http://www.openarchives.org/OAI/2.0/oai-identifier">'
            "<scheme>oai</scheme><repositoryIdentifier>sim.example</repositoryIdentifier>"
            f"<delimiter>:</delimiter><sampleIdentifier>{ID_PREFIX}0000001</sampleIdentifier>"
            "</oai-identifier></description></Identify>\n"
        ]

    def _verb_ListMetadataFormats(self, args: dict[str, str]) -> list[str]:
        if "identifier" in args and self.repo.get(args["identifier"]) is None:
            raise OaiError("idDoesNotExist", f"unknown identifier: {args['identifier']}")
        formats = "".join(
            f"<metadataFormat><metadataPrefix>{prefix}</metadataPrefix><schema>{schema}</schema>"
            f"<metadataNamespace>{namespace}</metadataNamespace></metadataFormat>"
            for prefix in self.repo.formats for schema, namespace in [payloads.FORMAT_INFO[prefix]])
        return [f"<ListMetadataFormats>{formats}</ListMetadataFormats>\n"]

    def _verb_ListSets(self, args: dict[str, str]) -> list[str]:
        if "resumptionToken" in args:
            raise OaiError("badResumptionToken", "ListSets is never paged here")
        sets = "".join(f"<set><setSpec>{spec}</setSpec><setName>{payloads.escape(name)}</setName></set>"
                       for spec, name in SETS)
        return [f"<ListSets>{sets}</ListSets>\n"]

    def _verb_GetRecord(self, args: dict[str, str]) -> list[str]:
        with self._lock:
            vanish = args["identifier"] in self._delete_on_get
            self._delete_on_get.discard(args["identifier"])
        if vanish:
            self.repo.delete_ids([args["identifier"]])
        record = self.repo.get(args["identifier"])
        if record is None:
            raise OaiError("idDoesNotExist", f"unknown identifier: {args['identifier']}")
        self._check_prefix(args["metadataPrefix"])
        return ["<GetRecord>", *self._render([record.number], args["metadataPrefix"], False), "</GetRecord>\n"]

    def _verb_ListRecords(self, args: dict[str, str]) -> list[str]:
        return self._list("ListRecords", args)

    def _verb_ListIdentifiers(self, args: dict[str, str]) -> list[str]:
        return self._list("ListIdentifiers", args)

    # ------------------------------------------------------ lists and tokens
    def _new_chain(self, verb: str, prefix: str, numbers: Sequence[int], args: dict[str, str]) -> _Chain:
        query = (args.get("from"), args.get("until"), args.get("set")) if self._requery else None
        mutate = self._mutate_pending
        if mutate is not None and mutate[1]["verb"] not in (None, verb):
            mutate = None  # waits for a chain of its verb
        chain = _Chain(self._next_chain, verb, prefix, array("l", numbers), self.repo.page_size,
                       expire_after=self._expire_after_pending, query=query, mutate_after=mutate,
                       end_after=self._end_after_pending)
        self._expire_after_pending = None
        self._end_after_pending = None
        if mutate is not None:
            self._mutate_pending = None
        self._next_chain += 1
        self._chains[chain.chain_id] = chain
        while len(self._chains) > self.max_chains:
            self._chains.popitem(last=False)
        return chain

    def _resume(self, verb: str, token: str) -> tuple[_Chain, int]:
        match = _TOKEN_RE.fullmatch(token)
        chain = self._chains.get(int(match.group(1))) if match else None
        if chain is None or match is None:
            raise OaiError("badResumptionToken", "unknown or expired resumptionToken")
        cursor = int(match.group(2))
        in_range = 0 <= cursor < len(chain.numbers) or (chain.query is not None and cursor >= 0)
        if chain.verb != verb or chain.prefix != match.group(3) or not in_range:
            raise OaiError("badResumptionToken", "resumptionToken does not belong to this request")
        if chain.expire_after is not None and chain.pages_served >= chain.expire_after:
            del self._chains[chain.chain_id]
            raise OaiError("badResumptionToken", "resumptionToken has expired")
        self._chains.move_to_end(chain.chain_id)
        return chain, cursor

    def _token(self, chain: _Chain, cursor: int, fresh: bool = False) -> str:
        if fresh:
            self._nonce += 1
            nonce = f"e{self._nonce:x}"
        else:
            nonce = f"{zlib.crc32(f'{chain.chain_id}:{cursor}'.encode()):x}"
        padding = "~" + "x" * (self._token_padding - 1) if self._token_padding else ""
        return f"c{chain.chain_id}!{cursor}/{chain.prefix}+{nonce}{padding}"

    def _list(self, verb: str, args: dict[str, str]) -> list[str]:
        token = args.get("resumptionToken")
        chain: _Chain | None = None
        numbers: list[int] | array
        if token is not None:
            with self._lock:
                chain, cursor = self._resume(verb, token)
                mutation = chain.mutate_after
                if mutation is not None and chain.pages_served >= mutation[0]:
                    chain.mutate_after = None
                else:
                    mutation = None
            if mutation is not None:
                self._mutate(mutation[1])
            if chain.query is not None:
                chain.numbers = array("l", self.repo.select_numbers(*chain.query))
            prefix, numbers = chain.prefix, chain.numbers
        else:
            prefix, cursor = args["metadataPrefix"], 0
            self._check_window(args)
            self._check_prefix(prefix)
            numbers = self.repo.select_numbers(None if self.ignores_from else args.get("from"), args.get("until"),
                                               args.get("set"))
            if not numbers:
                raise OaiError("noRecordsMatch", "no records match the request")
        with self._lock:
            if chain is None and (len(numbers) > self.repo.page_size or self._empty_pages):
                chain = self._new_chain(verb, prefix, numbers, args)
            page_size = chain.page_size if chain else self.repo.page_size
            total = len(numbers)
            page = numbers[cursor:cursor + page_size]
            next_token: str | None = None
            if chain is not None:
                chain.pages_served += 1
                if self._empty_pages:
                    page, next_token = [], self._token(chain, cursor, fresh=True)
                elif self._repeat_token and token is not None:
                    next_token = token
                elif chain.end_after is not None and chain.pages_served >= chain.end_after:
                    next_token = ""
                elif cursor + len(page) < total:
                    next_token = self._token(chain, cursor + len(page))
                else:
                    next_token = ""
        announced = {"exact": total, "understated": max(1, total // 10)}.get(self.list_size)
        size = f'completeListSize="{announced}" ' if announced is not None else ""
        if next_token is None:
            token_xml = ""
        elif next_token:
            expires = iso_seconds(self.repo.clock + self.token_lifetime)
            token_xml = _token_element(f'{size}cursor="{cursor}" expirationDate="{expires}"',
                                       next_token, self._markup(cursor, page_size))
        elif self.token_markup == "stale-comment":
            stale = payloads.escape(f"{token or 'first'}+stale")
            token_xml = f"<!-- served before: <resumptionToken>{stale}</resumptionToken> -->\n"
        else:
            token_xml = _token_element(f'{size}cursor="{cursor}"', "",
                                       self._markup(cursor, page_size))
        return [f"<{verb}>\n", *self._render(page, prefix, verb == "ListIdentifiers"), token_xml,
                f"</{verb}>\n"]

    def _markup(self, cursor: int, page_size: int) -> str:
        markup = self.token_markup
        if markup == "varied":
            return _ROTATION[(cursor // max(page_size, 1)) % len(_ROTATION)]
        return "plain" if markup == "stale-comment" else markup

    def _render(self, numbers: list[int] | array, prefix: str, headers_only: bool) -> list[str]:
        """One line per header/record for the current state of `numbers`; vanished ones are skipped."""
        repo = self.repo
        fmt = repo.format_stamp
        render = payloads.RENDERERS[prefix]
        set_xml = _SET_XML[repo.header_sets]
        out = []
        for record in repo.records(numbers):
            if record is None:
                continue
            sets = "" if record.deleted and not repo.deleted_in_sets else set_xml[record.kind]
            head = (f"<identifier>{payloads.escape(record.identifier)}</identifier>"
                    f"<datestamp>{fmt(record.stamp)}</datestamp>{sets}")
            if record.deleted:
                header = f'<header status="deleted">{head}</header>'
                out.append(f"{header}\n" if headers_only else f"<record>{header}</record>\n")
            elif headers_only:
                out.append(f"<header>{head}</header>\n")
            else:
                out.append(f"<record><header>{head}</header><metadata>{render(record)}</metadata></record>\n")
        return out

    # --------------------------------------------------------- control API
    def _report(self, action: str) -> Response | None:
        repo = self.repo
        if action in ("live_ids", "deleted_ids"):
            ids = repo.sorted_live_identifiers() if action == "live_ids" else sorted(repo.deleted_identifiers())
            text = "".join(f"{i}\n" for i in ids)
            return Response(200, text.encode(), "text/plain; charset=utf-8")
        if action == "in_flight":
            return _json(200, self._in_flight_report())
        if action == "state":
            with self._lock:
                served, logged = self.requests_served, len(self.requests)
            return _json(200, {**repo.counts(), **self._in_flight_report(),
                               "clock": iso_seconds(repo.clock), "requests": served,
                               "logged_requests": logged, "granularity": repo.granularity,
                               "deleted_record": repo.deleted_record, "page_size": repo.page_size,
                               "formats": list(repo.formats), "base_url": self.base_url})
        return None

    def _control_response_delay(self, data: dict[str, Any]) -> dict[str, Any]:
        self.set_response_delay(float(data["ms"]))
        return {"ok": True}

    def _control_reset_in_flight(self, data: dict[str, Any]) -> dict[str, Any]:
        self.reset_in_flight()
        return {"ok": True, **self._in_flight_report()}

    def _control_expire_tokens(self, data: dict[str, Any]) -> dict[str, Any]:
        self.expire_tokens()
        return {"ok": True}

    def _control_expire_tokens_after(self, data: dict[str, Any]) -> dict[str, Any]:
        self.expire_tokens_after(int(data["pages"]))
        return {"ok": True}

    def _control_fail_next(self, data: dict[str, Any]) -> dict[str, Any]:
        self.fail_next(int(data.get("count", 1)), int(data.get("status", 503)), data.get("retry_after"))
        return {"ok": True}

    def _control_error_status(self, data: dict[str, Any]) -> dict[str, Any]:
        self.set_error_status(str(data["code"]), int(data["status"]))
        return {"error_statuses": dict(self.error_statuses)}

    def _control_refuse_windows(self, data: dict[str, Any]) -> dict[str, Any]:
        seconds = data.get("longer_than")
        self.refuse_windows_longer_than(None if seconds is None else int(seconds), str(data.get("how", "413")))
        return {"refuse_windows": self._refuse_windows}

    def _control_html_next(self, data: dict[str, Any]) -> dict[str, Any]:
        self.html_next()
        return {"ok": True}

    def _control_broken_next(self, data: dict[str, Any]) -> dict[str, Any]:
        self.broken_next()
        return {"ok": True}

    def _control_hostile_next(self, data: dict[str, Any]) -> dict[str, Any]:
        self.hostile_next(str(data["kind"]))
        return {"ok": True}

    def _control_token_markup(self, data: dict[str, Any]) -> dict[str, Any]:
        self.set_token_markup(str(data.get("markup", "plain")))
        return {"ok": True}

    def _control_repeat_token(self, data: dict[str, Any]) -> dict[str, Any]:
        self.repeat_token(bool(data.get("on", True)))
        return {"ok": True}

    def _control_empty_pages_with_token(self, data: dict[str, Any]) -> dict[str, Any]:
        self.empty_pages_with_token(bool(data.get("on", True)))
        return {"ok": True}

    def _control_end_list_after(self, data: dict[str, Any]) -> dict[str, Any]:
        self.end_list_after(int(data["pages"]))
        return {"ok": True}

    def _control_requery_pages(self, data: dict[str, Any]) -> dict[str, Any]:
        self.requery_pages(bool(data.get("on", True)))
        return {"ok": True}

    def _control_mutate_after_pages(self, data: dict[str, Any]) -> dict[str, Any]:
        self.mutate_after_pages(int(data["pages"]), edit=int(data.get("edit", 0)),
                                delete=int(data.get("delete", 0)), edit_ids=data.get("edit_ids"),
                                delete_ids=data.get("delete_ids"), verb=data.get("verb"))
        return {"ok": True}

    def _control_require_credentials(self, data: dict[str, Any]) -> dict[str, Any]:
        self.require_credentials(data.get("form"), str(data.get("secret", "")), login=data.get("login"),
                                 name=data.get("name"))
        return {"ok": True}

    def _control_break_verb(self, data: dict[str, Any]) -> dict[str, Any]:
        status = data.get("status", 500)
        self.break_verb(str(data["verb"]), None if status is None else int(status))
        return {"broken_verbs": dict(self.broken_verbs)}

    def _control_announce_granularity(self, data: dict[str, Any]) -> dict[str, Any]:
        self.announce_granularity(data.get("granularity"))
        return {"announced_granularity": self.announced_granularity}

    def _control_ignore_from(self, data: dict[str, Any]) -> dict[str, Any]:
        self.ignore_from(bool(data.get("on", True)))
        return {"ignores_from": self.ignores_from}

    def _control_move_records(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"moved": self.repo.move_to(list(data["ids"]), data.get("type"), data.get("dept"))}

    def _control_attack_next(self, data: dict[str, Any]) -> dict[str, Any]:
        self.attack_next(str(data["kind"]), size=data.get("size"), interval=float(data.get("interval", 1.0)),
                         verb=data.get("verb"), headers=bool(data.get("headers", False)))
        return {"ok": True}


class _Handler(LoopbackHandler):
    server_version = "OaiSimulator/1.0"

    @property
    def sim(self) -> OaiSimulator:
        return cast(OaiSimulator, self.server.sim)

    def _dispatch(self, body: bytes | None) -> None:
        """OAI requests are counted in flight (and delayed) until their answer is written."""
        if urlsplit(self.path).path != "/oai":
            super()._dispatch(body)
            return
        with self.sim._serving():
            super()._dispatch(body)

    def _respond(self, url: SplitResult, body: bytes | None) -> Response:
        if url.path == "/oai":
            query = url.query if body is None else body.decode("utf-8", "replace")
            pairs, refused = self.sim.admit(self.headers, parse_qsl(query, keep_blank_values=True))
            return refused if refused is not None else self.sim.handle_oai(pairs)
        if url.path.startswith(CONTROL_PREFIX):
            return self.sim.handle_control(self.command, url.path[len(CONTROL_PREFIX):], body)
        return Response(404, b"not found\n", TEXT_TYPE)

    def _send(self, response: Response) -> None:
        if response.stream is not None:
            self._send_stream(response)
            return
        body = response.body
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        if "Content-Encoding" not in response.headers and _accepts_gzip(self.headers.get("Accept-Encoding")):
            body = gzip.compress(body, compresslevel=1, mtime=0)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Vary", "Accept-Encoding")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
