"""Replay recorded OAI-PMH exchanges on loopback: real servers' bytes, our harvest's requests.

A recording is a file kept byte for byte as its source project stored it: a bare response
(``.xml``, its request read from the ``<request>`` echo), a vcrpy cassette (``.yaml``) or a
nock fixture (``.json``). :func:`load_recording` turns each into :class:`Exchange` rows
(request parameters, status, headers, body).

:class:`ReplayServer` answers a harvest with them. A continuation is matched by the
resumptionToken the *previous recorded page* carried, not by the recorded request URL,
because recorders differ in how they encoded the token (several sent it unencoded, one
server hands out tokens that are already percent-encoded): what a harvest must send back is
the token text as the page gave it. A first request is answered by the recording whose
arguments it carries, every one of them with the recorded value; arguments the recording
did not carry (a bare page's ``<request>`` echo often omits ``until``, some omit all) are
not compared. With ``end_open_chains`` a continuation of a page whose next page was not
recorded (a cut chain) is answered ``noRecordsMatch``, which ends the list the way one
recorded server ends its own. Several exchanges for the same request are served in their recorded order (a 503
then a 200), the last one again thereafter. Anything unmatched is answered 404 and kept in
``unmatched``: a test asserts it stays empty. A recorded redirect is pointed at the replay
server itself.
"""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

import yaml
from lxml import etree

from .loopback import TEXT_TYPE, LoopbackHandler, LoopbackServer, Response, query_log_form, status_phrase

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
_DROPPED_HEADERS = {"content-encoding", "content-length", "transfer-encoding", "connection", "set-cookie",
                    "keep-alive", "date", "server", "strict-transport-security"}


@dataclass
class Exchange:
    """One recorded request and its answer (body decoded from any transfer compression)."""

    params: dict[str, str]
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    url: str = ""

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "text/xml")

    def token(self) -> str | None:
        """The resumptionToken text this page hands out (None when absent, empty or unreadable)."""
        return page_token(self.body)


def page_token(body: bytes) -> str | None:
    """A page's resumptionToken as text, read with a plain non-resolving parser."""
    try:
        root = etree.fromstring(body, etree.XMLParser(resolve_entities=False, no_network=True, recover=True))
    except etree.XMLSyntaxError:
        return None
    if root is None:
        return None
    node = root.find(f".//{{{OAI_NS}}}resumptionToken")
    text = "".join(node.itertext()).strip() if node is not None else ""
    return text or None


class _Loader(yaml.SafeLoader):
    """vcrpy cassettes written under Python 2 tag their strings ``!!python/unicode``."""


def _python_unicode(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(None, None, f"expected a string, found {type(node).__name__}", node.start_mark)
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:python/unicode", _python_unicode)


def load_recording(path: Path) -> list[Exchange]:
    """The exchanges one recorded file holds, in recorded order."""
    raw = path.read_bytes()
    if path.suffix == ".yaml":
        return _from_cassette(raw)
    if path.suffix == ".json":
        return _from_nock(raw)
    return [_from_bare_page(raw)]


def _from_bare_page(raw: bytes) -> Exchange:
    params: dict[str, str] = {}
    try:
        root = etree.fromstring(raw, etree.XMLParser(resolve_entities=False, no_network=True))
        request = root.find(f"{{{OAI_NS}}}request")
        if request is not None:
            params = {key: value.strip() for key, value in request.attrib.items()}
    except etree.XMLSyntaxError:
        pass
    return Exchange(params, 200, raw, {"content-type": "text/xml"})


def _from_cassette(raw: bytes) -> list[Exchange]:
    exchanges = []
    for interaction in yaml.load(raw, Loader=_Loader)["interactions"]:
        request, response = interaction["request"], interaction["response"]
        headers = {name.lower(): (values[0] if isinstance(values, list) else values)
                   for name, values in (response.get("headers") or {}).items()}
        body = response["body"]["string"]
        body = body.encode("utf-8") if isinstance(body, str) else body
        body = _decoded(body, headers.get("content-encoding", ""))
        exchanges.append(Exchange(_query(request["uri"]), int(response["status"]["code"]), body,
                                  _kept(headers), request["uri"]))
    return exchanges


def _from_nock(raw: bytes) -> list[Exchange]:
    exchanges = []
    for entry in json.loads(raw):
        body = entry.get("response", "")
        body = (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")
        headers = dict(entry.get("headers") or {})
        raw_headers = entry.get("rawHeaders") or []
        headers.update({raw_headers[i].lower(): raw_headers[i + 1] for i in range(0, len(raw_headers) - 1, 2)})
        url = entry["scope"] + entry["path"]
        exchanges.append(Exchange(_query(url), int(entry.get("status", 200)), body, _kept(headers), url))
    return exchanges


def _decoded(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)
    return body


def _kept(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): str(value) for name, value in headers.items() if name.lower() not in _DROPPED_HEADERS}


def _query(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def _key(params: dict[str, str]) -> tuple:
    """What identifies a request: a continuation by verb and token, else its arguments."""
    if "resumptionToken" in params:
        return ("token", params.get("verb"), params["resumptionToken"])
    return ("args", tuple(sorted(params.items())))


_END_OF_LIST = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    f'<OAI-PMH xmlns="{OAI_NS}"><responseDate>1970-01-01T00:00:00Z</responseDate>'
    '<request verb="{verb}">replay</request>'
    '<error code="noRecordsMatch">the recording ends here</error></OAI-PMH>'
)


class ReplayServer(LoopbackServer):
    """Serves recorded exchanges; ``unmatched`` lists requests no recording answers."""

    _thread_prefix = "oai-replay"

    def __init__(self, exchanges: list[Exchange], host: str = "127.0.0.1", port: int = 0, *,
                 end_open_chains: bool = False) -> None:
        super().__init__(host, port, _ReplayHandler)
        self.end_open_chains = end_open_chains
        self._open_tokens: set[str] = set()
        self.unmatched: list[dict[str, Any]] = []
        self._firsts: list[tuple[dict[str, str], list[Exchange]]] = []  # recorded params -> answers
        self._continuations: dict[tuple, list[Exchange]] = {}
        self._served: dict[int, int] = {}
        self._serve_lock = threading.Lock()
        previous: Exchange | None = None
        for exchange in exchanges:
            if "resumptionToken" in exchange.params:
                token = previous.token() if previous is not None else None
                token = token or unescape(exchange.params["resumptionToken"]).strip()
                key = ("token", exchange.params.get("verb"), token)
                self._continuations.setdefault(key, []).append(exchange)
            else:
                self._add_first(exchange)
            if exchange.status == 200:
                previous = exchange
                token = exchange.token()
                if token:
                    self._open_tokens.add(token)
        self._open_tokens -= {key[2] for key in self._continuations}

    def _add_first(self, exchange: Exchange) -> None:
        for params, answers in self._firsts:
            if _key(params) == _key(exchange.params):
                answers.append(exchange)
                return
        self._firsts.append((exchange.params, [exchange]))

    def answer(self, pairs: list[tuple[str, str]]) -> Response:
        """The recorded answer to these decoded query arguments."""
        params = dict(pairs)
        answers = self._continuations.get(_key(params)) if "resumptionToken" in params else None
        if answers is None and "resumptionToken" not in params:
            for recorded, candidates in self._firsts:
                if recorded.get("verb") == params.get("verb") and recorded.items() <= params.items():
                    answers = candidates
                    break
        if answers is None and self.end_open_chains and params.get("resumptionToken") in self._open_tokens:
            body = _END_OF_LIST.replace("{verb}", params.get("verb", "")).encode()
            return Response(200, body, "text/xml; charset=utf-8")
        if answers is None:
            with self._lock:
                self.unmatched.append(params)
            return Response(404, f"no recording answers {sorted(params.items())}\n".encode(), TEXT_TYPE)
        with self._serve_lock:
            served = self._served.get(id(answers), 0)
            self._served[id(answers)] = served + 1
        exchange = answers[min(served, len(answers) - 1)]
        headers = {name: value for name, value in exchange.headers.items() if name != "content-type"}
        if "location" in headers:  # a recorded redirect comes back here, same query
            query = urlsplit(headers["location"]).query
            headers["location"] = f"{self.base_url}/?{query}" if query else f"{self.base_url}/"
        return Response(exchange.status, exchange.body, exchange.content_type, headers)


class _ReplayHandler(LoopbackHandler):
    server: Any

    def _respond(self, url: SplitResult, body: bytes | None) -> Response | None:
        pairs = parse_qsl(url.query, keep_blank_values=True)
        sim: ReplayServer = self.server.sim
        with sim._lock:
            sim.requests.append(query_log_form(pairs))
        return sim.answer(pairs)

    def _send(self, response: Response) -> None:
        self.send_response(response.status, status_phrase(response.status))
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)
