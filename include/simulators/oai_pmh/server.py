"""A loopback OAI-PMH 2.0 endpoint over a SimulatedRepository.

Strict about arguments (so tests catch sloppy clients), quick to render (so a
harvest benchmark measures the client), and able to misbehave on demand the way
real partner endpoints do: expired or repeating tokens, empty pages, 503s with
Retry-After, HTML or truncated bodies, hostile DTDs, offset paging that re-runs the
query on every page, and staff edits between the pages of a list. Every such fault is a
field of `OaiFaults` (``faults.py``), read where it takes effect.
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
from .faults import FAULT_ACTIONS, TOKEN_MARKUPS, Attack, Credentials, Failure, Mutation, OaiFaults

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
XML_CONTENT_TYPE = "text/xml; charset=utf-8"
HTML_CONTENT_TYPE = "text/html; charset=utf-8"
_ROTATION = TOKEN_MARKUPS[:5]
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
    mutate_after: Mutation | None = None  # staff edits between pages, applied once
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


class OaiSimulator(ControlledServer[OaiFaults]):
    """Serve `repo` as an OAI-PMH repository on loopback; use as a context manager.

    `faults` (or its fields as keywords: ``token_markup="cdata"``) are the switches it
    starts with; ``set_faults`` and ``POST /_control/faults`` change them while it runs.
    ``keep_alive_timeout``: idle keep-alive connections close after this many seconds,
    as Apache's default 5 (loopback.py; None: never)."""

    _base_path = "/oai"
    _thread_prefix = "oai-simulator"
    _json_reply = staticmethod(_json)
    _fault_actions = FAULT_ACTIONS

    def __init__(self, repo: SimulatedRepository, host: str = "127.0.0.1", port: int = 0, *,
                 token_lifetime: timedelta = timedelta(hours=1), max_chains: int = 64,
                 keep_alive_timeout: float | None = 5.0, faults: OaiFaults | None = None, **switches: Any) -> None:
        super().__init__(host, port, _Handler, repo, (faults or OaiFaults()).changed(**switches),
                         keep_alive_timeout=keep_alive_timeout)
        self.repo = repo
        self.token_lifetime = token_lifetime
        self.max_chains = max_chains
        self.requests_served = 0
        self._changed = threading.Condition(self._lock)  # in_flight or the faults changed
        self.in_flight = 0  # OAI requests being answered right now (over HTTP)
        self.max_in_flight = 0  # the most seen at once since start or reset_in_flight()
        self.arrivals: list[float] = []  # time.monotonic() of each OAI request's arrival (politeness tests)
        self._chains: OrderedDict[int, _Chain] = OrderedDict()
        self._next_chain = 1
        self._nonce = 0
        self.mutations: list[dict[str, list[str]]] = []  # what mutate_after_pages did, in order
        self.refused_credentials = 0  # OAI requests answered 401 for missing or wrong credentials

    def _faults_changed(self) -> None:
        self._changed.notify_all()  # a lowered response delay releases the requests waiting on it

    # ------------------------------------------------- access: credentials
    def admit(self, headers: Any, pairs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], Response | None]:
        """The OAI arguments without a query credential, and the 401 a request without the
        required credential gets (None: admitted)."""
        required = self.faults.credentials
        if required is None:
            return pairs, None
        form, secret, name = required.form, required.secret, required.name
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
                remaining = self.faults.response_delay_ms / 1000 - (time.monotonic() - started)
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
                    "response_delay_ms": self.faults.response_delay_ms}

    # --------------------------------------------------------- misbehaviour
    # Shorthands for set_faults, in the words tests and benchmarks use (faults.py has the
    # full story of each switch; a new fault needs none).
    def set_response_delay(self, ms: float) -> None:
        self.set_faults(response_delay_ms=ms)

    def expire_tokens(self) -> None:
        """Every outstanding resumption token becomes invalid now."""
        with self._lock:
            self._chains.clear()

    def expire_tokens_after(self, pages: int) -> None:
        self.set_faults(expire_tokens_after=pages)

    def fail_next(self, count: int, status: int = 503, retry_after: str | int | None = None) -> None:
        self.set_faults(fail_next=Failure(count=count, status=status, retry_after=retry_after))

    def set_error_status(self, code: str, status: int) -> None:
        self.change_faults(lambda faults: FAULT_ACTIONS["error_status"](faults, {"code": code, "status": status}))

    def refuse_windows_longer_than(self, seconds: int | None, how: str = "413") -> None:
        self.set_faults(refuse_windows=None if seconds is None else {"longer_than": seconds, "how": how})

    def html_next(self) -> None:
        self.set_faults(html_next=True)

    def broken_next(self) -> None:
        self.set_faults(broken_next=True)

    def hostile_next(self, kind: str) -> None:
        self.set_faults(hostile_next=kind)

    def pad_tokens(self, size: int) -> None:
        self.set_faults(token_padding=max(0, int(size)))

    def set_token_markup(self, markup: str) -> None:
        self.set_faults(token_markup=markup)

    def repeat_token(self, on: bool = True) -> None:
        self.set_faults(repeat_token=on)

    def empty_pages_with_token(self, on: bool = True) -> None:
        self.set_faults(empty_pages_with_token=on)

    def requery_pages(self, on: bool = True) -> None:
        self.set_faults(requery_pages=on)

    def mutate_after_pages(self, pages: int, *, edit: int = 0, delete: int = 0,
                           edit_ids: list[str] | None = None, delete_ids: list[str] | None = None,
                           verb: str | None = None) -> None:
        """What was done is appended to ``mutations``."""
        self.set_faults(mutate_after_pages=Mutation(pages=pages, edit=edit, delete=delete, edit_ids=edit_ids,
                                                    delete_ids=delete_ids, verb=verb))

    def end_list_after(self, pages: int) -> None:
        self.set_faults(end_list_after=pages)

    def attack_next(self, kind: str, *, size: int | None = None, interval: float = 1.0,
                    verb: str | None = None, headers: bool = False) -> None:
        self.set_faults(attack_next=Attack(kind=kind, size=size, interval=interval, verb=verb, headers=headers))

    def require_credentials(self, form: str | None, secret: str = "", *, login: str | None = None,
                            name: str | None = None) -> None:
        self.set_faults(credentials=None if form is None else Credentials(
            form=form, secret=secret, name=login if form == "basic" else name))

    def break_verb(self, verb: str, status: int | None = 500) -> None:
        self.change_faults(lambda faults: FAULT_ACTIONS["break_verb"](faults, {"verb": verb, "status": status}))

    def delete_on_get(self, identifiers: list[str]) -> None:
        self.change_faults(lambda faults: {"delete_on_get": faults.delete_on_get | set(identifiers)})

    def ignore_from(self, on: bool = True) -> None:
        self.set_faults(ignore_from=on)

    def announce_granularity(self, granularity: str | None) -> None:
        self.set_faults(announced_granularity=granularity)

    def _window_refusal(self, pairs: list[tuple[str, str]]) -> Response | None:
        """The refusal of a too-large window, or None."""
        refuse = self.faults.refuse_windows
        args = dict(pairs)
        if refuse is None or args.get("verb") not in ("ListRecords", "ListIdentifiers") or "resumptionToken" in args:
            return None
        try:
            low = parse_oai_date(args["from"])[0] if "from" in args else self.repo.earliest_stamp()
            high = parse_oai_date(args["until"])[0] + (86_399 if len(args["until"]) == 10 else 0) \
                if "until" in args else self.repo.clock_epoch
        except ValueError:
            return None  # the protocol's own badArgument answers it
        longest, how = refuse.longer_than, refuse.how
        if high - low <= longest:
            return None
        text = f"please restrict the request period to at most {longest} seconds"
        if how == "badArgument":
            head = (f"{_XML_HEAD}<responseDate>{iso_seconds(self.repo.clock)}</responseDate>\n"
                    f"<request>{self.base_url}</request>\n")
            body = f'{head}<error code="badArgument">{text}</error>\n</OAI-PMH>\n'
            return Response(self.faults.error_statuses.get("badArgument", 200), body.encode(), XML_CONTENT_TYPE)
        html = f"<html><head><title>{how} {status_phrase(int(how))}</title></head><body><p>{text}</p></body></html>\n"
        return Response(int(how), html.encode(), HTML_CONTENT_TYPE)

    def _mutate(self, spec: Mutation) -> None:
        repo = self.repo
        edited: list[str] = []
        deleted: list[str] = []
        with repo.lock:  # the next page sees all of it
            if spec.edit:
                edited += repo.edit(spec.edit)
            if spec.edit_ids:
                edited += repo.edit_ids(list(spec.edit_ids))
            if spec.delete:
                deleted += repo.delete(spec.delete)
            if spec.delete_ids:
                deleted += repo.delete_ids(list(spec.delete_ids))
        with self._lock:
            self.mutations.append({"edited": edited, "deleted": deleted})

    def _attack_response(self, attack: Attack, pairs: list[tuple[str, str]]) -> Response:
        kind, size = attack.kind, attack.size or _ATTACK_SIZES.get(attack.kind, 0)
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
                            pause=attack.interval, drip_head=attack.headers)
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
        mode, detail = self.take_fault("attack_next", "fail_next", "html_next", "broken_next", "hostile_next",
                                       applies=lambda name, fault: name != "attack_next" or fault.fits(pairs))
        if mode == "attack_next":
            return self._attack_response(detail, pairs)
        broken = self.faults.broken_verbs.get(dict(pairs).get("verb", ""))
        if broken is not None and mode != "fail_next":
            mode, detail = "fail_next", Failure(status=broken)
        if mode == "fail_next":
            fail: Failure = detail
            phrase = status_phrase(fail.status)
            html = f"<html><head><title>{fail.status} {phrase}</title></head><body><h1>{phrase}</h1></body></html>\n"
            headers = {"Retry-After": str(fail.retry_after)} if fail.retry_after is not None else {}
            return Response(fail.status, html.encode(), HTML_CONTENT_TYPE, headers)
        if mode == "html_next":
            html = ("<!DOCTYPE html>\n<html><head><title>Collection portal</title></head><body>"
                    "<h1>Something went wrong</h1><p>The collection service is under maintenance.</p>"
                    "</body></html>\n")
            return Response(200, html.encode(), HTML_CONTENT_TYPE)
        refusal = self._window_refusal(pairs)
        if refusal is not None:
            return refusal
        parts = self._protocol(pairs)
        status = 200
        error_statuses = self.faults.error_statuses
        if error_statuses and len(parts) > 1 and parts[1].startswith('<error code="'):
            status = error_statuses.get(parts[1][len('<error code="'):].split('"', 1)[0], 200)
        if mode == "broken_next":
            parts = [_truncate("".join(parts))]
        elif mode == "hostile_next":
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
        declared = self.faults.announced_granularity or repo.granularity
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
        identifier = args["identifier"]
        with self._lock:
            vanish = identifier in self.faults.delete_on_get
            if vanish:  # one shot each
                self.faults = self.faults.model_copy(update={"delete_on_get": self.faults.delete_on_get - {identifier}})
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
        """A new token chain (the lock held): it takes the faults that wait for one."""
        query = (args.get("from"), args.get("until"), args.get("set")) if self.faults.requery_pages else None
        _, expire_after = self._spend_fault("expire_tokens_after")
        _, end_after = self._spend_fault("end_list_after")
        _, mutate = self._spend_fault("mutate_after_pages", applies=lambda _, m: m.verb in (None, verb))
        chain = _Chain(self._next_chain, verb, prefix, array("l", numbers), self.repo.page_size,
                       expire_after=expire_after, query=query, mutate_after=mutate, end_after=end_after)
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
        padding_size = self.faults.token_padding
        padding = "~" + "x" * (padding_size - 1) if padding_size else ""
        return f"c{chain.chain_id}!{cursor}/{chain.prefix}+{nonce}{padding}"

    def _list(self, verb: str, args: dict[str, str]) -> list[str]:
        token = args.get("resumptionToken")
        chain: _Chain | None = None
        numbers: list[int] | array
        if token is not None:
            with self._lock:
                chain, cursor = self._resume(verb, token)
                mutation = chain.mutate_after
                if mutation is not None and chain.pages_served >= mutation.pages:
                    chain.mutate_after = None
                else:
                    mutation = None
            if mutation is not None:
                self._mutate(mutation)
            if chain.query is not None:
                chain.numbers = array("l", self.repo.select_numbers(*chain.query))
            prefix, numbers = chain.prefix, chain.numbers
        else:
            prefix, cursor = args["metadataPrefix"], 0
            self._check_window(args)
            self._check_prefix(prefix)
            numbers = self.repo.select_numbers(None if self.faults.ignore_from else args.get("from"), args.get("until"),
                                               args.get("set"))
            if not numbers:
                raise OaiError("noRecordsMatch", "no records match the request")
        faults = self.faults
        with self._lock:
            if chain is None and (len(numbers) > self.repo.page_size or faults.empty_pages_with_token):
                chain = self._new_chain(verb, prefix, numbers, args)
            page_size = chain.page_size if chain else self.repo.page_size
            total = len(numbers)
            page = numbers[cursor:cursor + page_size]
            next_token: str | None = None
            if chain is not None:
                chain.pages_served += 1
                if faults.empty_pages_with_token:
                    page, next_token = [], self._token(chain, cursor, fresh=True)
                elif faults.repeat_token and token is not None:
                    next_token = token
                elif chain.end_after is not None and chain.pages_served >= chain.end_after:
                    next_token = ""
                elif cursor + len(page) < total:
                    next_token = self._token(chain, cursor + len(page))
                else:
                    next_token = ""
        announced = {"exact": total, "understated": max(1, total // 10)}.get(faults.list_size)
        size = f'completeListSize="{announced}" ' if announced is not None else ""
        if next_token is None:
            token_xml = ""
        elif next_token:
            expires = iso_seconds(self.repo.clock + self.token_lifetime)
            token_xml = _token_element(f'{size}cursor="{cursor}" expirationDate="{expires}"',
                                       next_token, self._markup(cursor, page_size))
        elif faults.token_markup == "stale-comment":
            stale = payloads.escape(f"{token or 'first'}+stale")
            token_xml = f"<!-- served before: <resumptionToken>{stale}</resumptionToken> -->\n"
        else:
            token_xml = _token_element(f'{size}cursor="{cursor}"', "",
                                       self._markup(cursor, page_size))
        return [f"<{verb}>\n", *self._render(page, prefix, verb == "ListIdentifiers"), token_xml,
                f"</{verb}>\n"]

    def _markup(self, cursor: int, page_size: int) -> str:
        markup = self.faults.token_markup
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

    def _control_reset_in_flight(self, data: dict[str, Any]) -> dict[str, Any]:
        self.reset_in_flight()
        return {"ok": True, **self._in_flight_report()}

    def _control_expire_tokens(self, data: dict[str, Any]) -> dict[str, Any]:
        self.expire_tokens()
        return {"ok": True}

    def _control_move_records(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"moved": self.repo.move_to(list(data["ids"]), data.get("type"), data.get("dept"))}


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
